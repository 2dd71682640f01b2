//! `pelican worker --http`: the example endpoint, every row of the README's status
//! table, a refused connection, and a handler slower than claim_idle.

use super::*;
use pelican_testkit::eventually_sync;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

fn call(env: &Env, rid: &str, body: &Value) -> Proc {
    env.spawn(&["call", "--id", rid, "--timeout", "60000", &body.to_string()])
}

/// The example endpoint answers JSON (bad input: a 422, failed for good with its
/// message) and, on a raw queue, bytes.
#[test]
fn the_python_example_serves_json_and_raw_queues() {
    let env = Env::new("http-example");
    let mut cmd = Command::new(python3());
    cmd.args([&example("http_worker.py"), "--port", "0"]);
    let server = Proc::spawn(cmd);
    eventually_sync(Duration::from_secs(20), "the example's URL", || {
        server.stdout().contains('\n')
    });
    let url = server.stdout().trim().to_string();
    let w = env.spawn(&["worker", "--http", &url]);
    let out = env.run(&["call", r#"{"n": 3}"#]);
    assert_eq!(out.code, 0, "{out:?}\n{}", w.stderr());
    assert_eq!(out.json(), json!({"n": 3, "square": 9}));
    let out = env.run(&["call", r#"{"x": 1}"#]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr.contains(r#"expected {"n": <number>}"#),
        "{out:?}"
    );
    let raw = Env {
        server: pelican_testkit::RedisServer::start(),
        queue: "raw".into(),
    };
    let _rw = raw.spawn(&["worker", "--http", &url, "--codec", "raw"]);
    let out = raw.run(&["call", r#"{"a": "bc"}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({"A": "BC"}));
    w.signal(libc::SIGTERM);
    assert_eq!(w.wait(Duration::from_secs(30)).code, 0);
}

/// One row of the status table: what the endpoint answers on the first delivery, and
/// what the caller must see.
struct Row {
    name: &'static str,
    body: Value,
    expect: Expect,
}

enum Expect {
    /// The answer is this JSON (a 2xx).
    Answer(Value),
    /// Failed for good (exit 3) with this in the message, after one call.
    Fail(&'static str),
    /// Handed back: answered by the second delivery's call.
    Retried,
}

/// Every row of the README's table, each on a request of its own, all at once against
/// one worker: 2xx answers (an empty body is null; a body that is not JSON, or is over
/// max_body_bytes, fails), another 4xx fails for good with the body as the message, 408,
/// 429 (with and without Retry-After), 5xx, a 3xx and a timeout are retried. The
/// endpoint also sees the Pelican-* headers.
#[test]
fn every_row_of_the_http_status_table() {
    let env = Env::new("http-table");
    let server = Server::start(&script("endpoint.py"), 0);
    let w = env.spawn(&[
        "--max-body-bytes",
        "4096",
        "worker",
        "--http",
        &server.url,
        "--claim-idle",
        "1000",
        "--handler-timeout",
        "1500",
        "--concurrency",
        "32",
        "--verbose",
    ]);
    let s = |status: u16, body: &str| json!({"status": status, "body": body});
    let rows = vec![
        Row {
            name: "200",
            body: json!({"n": 1}),
            expect: Expect::Answer(json!(null)),
        },
        Row {
            name: "201",
            body: s(201, r#"{"made": 1}"#),
            expect: Expect::Answer(json!({"made": 1})),
        },
        Row {
            name: "204",
            body: s(204, ""),
            expect: Expect::Answer(json!(null)),
        },
        Row {
            name: "200-not-json",
            body: s(200, "plain text"),
            expect: Expect::Fail("the answer is not JSON"),
        },
        Row {
            name: "200-too-large",
            body: json!({"status": 200, "pad": 5000}),
            expect: Expect::Fail("larger than max_body_bytes"),
        },
        Row {
            name: "400",
            body: s(400, "bad field k"),
            expect: Expect::Fail("bad field k"),
        },
        Row {
            name: "404",
            body: s(404, ""),
            expect: Expect::Fail("HTTP 404 Not Found"),
        },
        Row {
            name: "422",
            body: s(422, "cannot do 7"),
            expect: Expect::Fail("cannot do 7"),
        },
        Row {
            name: "408",
            body: s(408, "slow"),
            expect: Expect::Retried,
        },
        Row {
            name: "429",
            body: s(429, "later"),
            expect: Expect::Retried,
        },
        Row {
            name: "429-retry-after",
            body: json!({"status": 429, "retry_after": 1}),
            expect: Expect::Retried,
        },
        Row {
            name: "500",
            body: s(500, "oops"),
            expect: Expect::Retried,
        },
        Row {
            name: "502",
            body: s(502, ""),
            expect: Expect::Retried,
        },
        Row {
            name: "503",
            body: s(503, "busy"),
            expect: Expect::Retried,
        },
        Row {
            name: "301",
            body: json!({"status": 301}),
            expect: Expect::Retried,
        },
        Row {
            name: "timeout",
            body: json!({"status": 200, "sleep_ms": 4000}),
            expect: Expect::Retried,
        },
    ];
    let started_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let calls: Vec<(Row, Proc)> = rows
        .into_iter()
        .map(|r| {
            let p = call(&env, r.name, &r.body);
            (r, p)
        })
        .collect();
    for (row, p) in calls {
        let out = p.wait(Duration::from_secs(60));
        let ctx = format!("row {}: {out:?}\nworker: {}", row.name, w.stderr());
        match row.expect {
            Expect::Answer(v) => {
                assert_eq!(out.code, 0, "{ctx}");
                let a = out.json();
                if row.name == "200" {
                    // The echo: the request and the headers the endpoint saw.
                    assert_eq!(a["echo"], row.body, "{ctx}");
                    assert_eq!(a["delivery"], json!(1), "{ctx}");
                    assert_eq!(a["calls"], json!(1), "{ctx}");
                    let h = &a["headers"];
                    assert_eq!(h["Pelican-Request-Id"], json!("200"), "{ctx}");
                    assert_eq!(h["Pelican-Delivery"], json!("1"), "{ctx}");
                    assert_eq!(h["Content-Type"], json!("application/json"), "{ctx}");
                    let deadline: u64 = h["Pelican-Deadline"].as_str().unwrap().parse().unwrap();
                    assert!(
                        deadline >= started_ms + 59_000 && deadline <= started_ms + 120_000,
                        "the call's --timeout 60000: {deadline} vs {started_ms}: {ctx}"
                    );
                } else {
                    assert_eq!(a, v, "{ctx}");
                    server.assert_calls(row.name, 1);
                }
            }
            Expect::Fail(says) => {
                assert_eq!(out.code, 3, "{ctx}");
                assert!(out.stderr.contains(says), "{ctx}");
                server.assert_calls(row.name, 1);
            }
            Expect::Retried => {
                assert_eq!(out.code, 0, "{ctx}");
                let a = out.json();
                assert_eq!(a["delivery"], json!(2), "{ctx}");
                assert_eq!(a["calls"], json!(2), "{ctx}");
                assert_eq!(a["echo"], row.body, "{ctx}");
            }
        }
    }
}

/// Nothing listens at the URL: the request is handed back until the endpoint is up,
/// then answered.
#[test]
fn a_refused_connection_is_retried() {
    let env = Env::new("http-refused");
    let port = pelican_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}/work");
    let w = env.spawn(&[
        "worker",
        "--http",
        &url,
        "--claim-idle",
        "1000",
        "--max-deliveries",
        "50",
        "--verbose",
    ]);
    let c = call(&env, "refused", &json!({"n": 5}));
    eventually_sync(Duration::from_secs(30), "a retry", || {
        w.stdout()
            .lines()
            .any(|l| l.starts_with("retry ") && l.contains("rid=refused"))
    });
    assert!(w.stdout().contains("Connection refused"), "{}", w.stdout());
    let server = Server::start(&script("endpoint.py"), port);
    let out = c.wait(Duration::from_secs(60));
    assert_eq!(out.code, 0, "{out:?}");
    let a = out.json();
    assert!(a["delivery"].as_u64().unwrap() >= 2, "{a}");
    assert_eq!(a["calls"], json!(1), "{a}");
    server.assert_calls("refused", 1);
}

/// An HTTP handler that takes three times claim_idle keeps its lease (the worker renews
/// it while the call runs): one call, one handler run, even with a second worker ready
/// to take the request over.
#[test]
fn an_http_handler_slower_than_claim_idle_keeps_its_lease() {
    let env = Env::new("http-slow");
    let server = Server::start(&script("endpoint.py"), 0);
    let workers: Vec<Proc> = (0..2)
        .map(|_| {
            env.spawn(&[
                "worker",
                "--http",
                &server.url,
                "--claim-idle",
                "1000",
                "--verbose",
            ])
        })
        .collect();
    let body = json!({"status": 200, "sleep_ms": 3000, "body": r#"{"slow": true}"#});
    let out = call(&env, "slow", &body).wait(Duration::from_secs(60));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({"slow": true}));
    server.assert_calls("slow", 1);
    let mut runs = 0;
    for w in workers {
        w.signal(libc::SIGTERM);
        let out = w.wait(Duration::from_secs(30));
        assert_eq!(out.code, 0, "{out:?}");
        let lines = handled(&out.stdout);
        runs += lines.len();
        assert!(lines.iter().all(|l| l.contains("delivery=1")), "{lines:?}");
    }
    assert_eq!(runs, 1, "one handler run");
}
