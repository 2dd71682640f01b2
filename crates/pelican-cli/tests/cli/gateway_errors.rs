//! The gateway's error table, row by row: every error is `{"error": {"kind", "message"}}`
//! with the status of its kind (README, "From any language").

use crate::dashboard::http::{send, Answer};
use crate::gateway::{kind_of, worker, Gateway, DEADLINE};
use crate::support::Env;
use pelican_testkit::eventually_sync;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn expect(a: &Answer, status: u16, kind: &str) {
    assert_eq!((a.status, kind_of(a).as_str()), (status, kind), "{a:?}");
}

/// Bad input: 400 (queue name, body, timeout, parameters, request id, a path that is not
/// UTF-8), 404 (route; queue not served), 405, 413 (refused from Content-Length before
/// the body is read), 415.
#[test]
fn bad_input_gets_4xx_and_nothing_is_submitted() {
    let env = Env::new("gw-bad");
    let gw = Gateway::start(
        &env,
        &[
            "--max-body-bytes",
            "1000",
            "--queues",
            &format!("{},other", env.queue),
        ],
    );
    let q = env.queue.as_str();
    let path = format!("/v1/queues/{q}/call");
    expect(&gw.call("bad{name}", "{}", &[]), 400, "bad_request");
    expect(&gw.call(q, r#"{"n": 1"#, &[]), 400, "bad_request");
    expect(&gw.call(q, "", &[]), 400, "bad_request");
    for bad in ["0", "soon", "-5", "1.5"] {
        expect(
            &gw.call(q, "{}", &[("Pelican-Timeout", bad)]),
            400,
            "bad_request",
        );
    }
    let a = send(
        &gw.addr,
        "POST",
        &format!("{path}?timeout=5"),
        &[("Content-Type", "application/json")],
        Some(b"{}"),
    );
    expect(&a, 400, "bad_request");
    let long = "k".repeat(300);
    expect(
        &gw.call(q, "{}", &[("Idempotency-Key", &long)]),
        400,
        "bad_request",
    );
    let a = send(
        &gw.addr,
        "POST",
        "/v1/queues/%FF%FE/call",
        &[("Content-Type", "application/json")],
        Some(b"{}"),
    );
    expect(&a, 400, "bad_request");

    expect(&gw.call("not-served", "{}", &[]), 404, "not_found");
    expect(
        &send(&gw.addr, "GET", "/v1/nothing", &[], None),
        404,
        "not_found",
    );
    expect(
        &send(&gw.addr, "GET", &path, &[], None),
        405,
        "method_not_allowed",
    );
    let big = format!("{{\"data\": \"{}\"}}", "x".repeat(2000));
    expect(&gw.call(q, &big, &[]), 413, "too_large");
    expect(
        &send(
            &gw.addr,
            "POST",
            &path,
            &[("Content-Type", "text/plain")],
            Some(b"{}"),
        ),
        415,
        "unsupported_media_type",
    );
    expect(
        &send(&gw.addr, "POST", &path, &[], Some(b"{}")),
        415,
        "unsupported_media_type",
    );

    // 413 from the declared length alone: the body is never sent, the answer comes.
    let mut s = TcpStream::connect(&gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100000000\r\n\r\n",
        gw.addr
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&head));

    // Nothing of it reached the queue.
    let mut c = env.server.sync_connection();
    let n: u64 = redis::cmd("XLEN")
        .arg(env.keys().stream())
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 0);
}

/// The outcomes: the handler's failure (422 remote, its message), a dead letter (500
/// dead), no answer within the call's timeout (504 timeout).
#[test]
fn outcomes_have_their_statuses() {
    let env = Env::new("gw-outcomes");
    let gw = Gateway::start(&env, &[]);
    let q = env.queue.as_str();
    let started = Instant::now();
    let a = gw.call(q, r#"{"nobody": "serves"}"#, &[("Pelican-Timeout", "300")]);
    expect(&a, 504, "timeout");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(a.header("pelican-request-id").is_some(), "{a:?}");
    let a = send(
        &gw.addr,
        "POST",
        &format!("/v1/queues/{q}/call?timeout_ms=300"),
        &[("Content-Type", "application/json")],
        Some(br#"{"nobody": "again"}"#),
    );
    expect(&a, 504, "timeout");

    let w = worker(&env, "fail-if:bad", &[]);
    let a = gw.call(q, r#"{"bad": true}"#, &[]);
    expect(&a, 422, "remote");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad"),
        "{a:?}"
    );
    drop(w);

    // A poison request: a worker that crashes on it, then one that dead-letters it.
    let crashing = || {
        env.spawn(&[
            "worker",
            "--handler",
            "crash-if:poison",
            "--claim-idle",
            "300",
            "--max-deliveries",
            "1",
        ])
    };
    let addr = gw.addr.clone();
    let queue = env.queue.clone();
    let caller = std::thread::spawn(move || {
        send(
            &addr,
            "POST",
            &format!("/v1/queues/{queue}/call"),
            &[("Content-Type", "application/json")],
            Some(br#"{"poison": true}"#),
        )
    });
    let first = crashing().wait(DEADLINE);
    assert_ne!(first.code, 0, "{first:?}");
    let _last = crashing();
    expect(&caller.join().unwrap(), 500, "dead");
}

/// Past `--max-inflight` a call is refused at once with 503 `overloaded` and Retry-After.
#[test]
fn past_max_inflight_is_a_503_with_retry_after() {
    let env = Env::new("gw-inflight");
    let _w = worker(&env, "sleep:3000", &[]);
    let gw = Gateway::start(&env, &["--max-inflight", "1"]);
    let addr = gw.addr.clone();
    let queue = env.queue.clone();
    let slow = std::thread::spawn(move || {
        send(
            &addr,
            "POST",
            &format!("/v1/queues/{queue}/call"),
            &[("Content-Type", "application/json")],
            Some(br#"{"slow": 1}"#),
        )
    });
    let mut c = env.server.sync_connection();
    eventually_sync(DEADLINE, "the slow call to be in work", || {
        redis::cmd("XLEN")
            .arg(env.keys().stream())
            .query::<u64>(&mut c)
            .unwrap()
            == 1
    });
    let started = Instant::now();
    let a = gw.call(&env.queue, r#"{"second": 1}"#, &[]);
    expect(&a, 503, "overloaded");
    assert_eq!(a.header("retry-after"), Some("1"));
    assert!(started.elapsed() < Duration::from_secs(2), "at once");
    assert_eq!(slow.join().unwrap().status, 200);
    assert_eq!(gw.call(&env.queue, r#"{"third": 1}"#, &[]).status, 200);
}

/// Redis unreachable: 503 `unavailable` with Retry-After, for a queue whose producer was
/// made before the outage and for one named for the first time.
#[test]
fn redis_unreachable_is_a_503() {
    let mut env = Env::new("gw-down");
    let _w = worker(&env, "echo", &[]);
    let gw = Gateway::start(&env, &[]);
    assert_eq!(gw.call(&env.queue, "{}", &[]).status, 200);
    env.server.kill();
    let a = gw.call(
        &env.queue,
        r#"{"after": 1}"#,
        &[("Pelican-Timeout", "20000")],
    );
    expect(&a, 503, "unavailable");
    assert_eq!(a.header("retry-after"), Some("1"));
    let a = gw.call("never-named", "{}", &[]);
    expect(&a, 503, "unavailable");
}

/// Redis refusing a command (out of memory) is 500 `redis_refused`, not 503: Redis was
/// reached. Once it takes writes again, so does the gateway.
#[test]
fn a_refusal_by_redis_is_a_500() {
    let env = Env::new("gw-refused");
    let _w = worker(&env, "echo", &[]);
    let gw = Gateway::start(&env, &[]);
    assert_eq!(gw.call(&env.queue, r#"{"before": 1}"#, &[]).status, 200);
    let mut c = env.server.sync_connection();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let a = gw.call(&env.queue, r#"{"refused": 1}"#, &[]);
    expect(&a, 500, "redis_refused");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("OOM"),
        "{a:?}"
    );
    assert!(!a.body.contains("pelican_"), "no script names: {a:?}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(gw.call(&env.queue, r#"{"after": 1}"#, &[]).status, 200);
}
