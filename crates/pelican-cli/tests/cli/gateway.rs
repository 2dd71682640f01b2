//! `pelican gateway`: a real gateway process, a real redis-server and `pelican worker`
//! processes serving the queue. Here: starting it, a call as a newcomer makes it (JSON
//! and bytes), and the rules of who may call. The error table is checked row by row in
//! `gateway_errors`, load, SIGTERM and callers that go away in `gateway_load`, the
//! asynchronous form in `gateway_async`, the examples in `gateway_examples`.

use crate::dashboard::http::{send, Answer};
use crate::support::{Env, Proc};
use pelican_testkit::{eventually_sync, free_port};
use std::time::Duration;

/// Generous: the machine is shared with other builds.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running `pelican gateway` on a free loopback port.
pub struct Gateway {
    pub proc: Proc,
    pub addr: String,
}

impl Gateway {
    /// Starts `pelican gateway --listen 127.0.0.1:PORT extra...` with `env`'s Redis and
    /// waits until it announces itself.
    pub fn start(env: &Env, extra: &[&str]) -> Gateway {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["gateway", "--listen", &addr];
        args.extend_from_slice(extra);
        let proc = env.spawn(&args);
        eventually_sync(DEADLINE, "the gateway to announce itself", || {
            proc.stdout().contains("stop with Ctrl-C")
        });
        Gateway { proc, addr }
    }

    /// `POST /v1/queues/{queue}/call` with a JSON body and extra headers.
    pub fn call(&self, queue: &str, json: &str, headers: &[(&str, &str)]) -> Answer {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        send(
            &self.addr,
            "POST",
            &format!("/v1/queues/{queue}/call"),
            &h,
            Some(json.as_bytes()),
        )
    }
}

/// A worker serving `env`'s queue with `handler`, announced (its group exists).
pub fn worker(env: &Env, handler: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["worker", "--handler", handler];
    args.extend_from_slice(extra);
    let w = env.spawn(&args);
    eventually_sync(DEADLINE, "the worker to start", || {
        w.stderr().contains("serving queue")
    });
    w
}

/// The error body's kind, checking the shape `{"error": {"kind", "message"}}`.
pub fn kind_of(a: &Answer) -> String {
    assert_eq!(a.header("content-type"), Some("application/json"), "{a:?}");
    let e = &a.json()["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{a:?}"
    );
    e["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("no kind: {a:?}"))
        .to_string()
}

/// A JSON call and a bytes call come back with their answers, named and said how they
/// were served; the JSON body is sent on compacted, so the same value spelled with
/// other whitespace is the same request (answered from the cache).
#[test]
fn a_call_answers_with_the_response() {
    let env = Env::new("gw-call");
    let _w = worker(&env, "echo", &[]);
    let gw = Gateway::start(&env, &[]);
    let a = gw.call(&env.queue, r#"{ "n": 12, "s": "a b" }"#, &[]);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.body, r#"{"n":12,"s":"a b"}"#);
    assert_eq!(a.header("pelican-served"), Some("new"));
    let rid = a.header("pelican-request-id").unwrap().to_string();
    assert_eq!(rid.len(), 32, "{rid}");
    // The request is what `pelican inspect` finds under that id.
    let seen = env.run(&["--json", "inspect", &rid]);
    assert_eq!(seen.code, 0, "{seen:?}");
    let again = gw.call(&env.queue, "{\"n\":12,\n\"s\":\"a b\"}", &[]);
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.header("pelican-served"), Some("cached"));
    assert_eq!(again.header("pelican-request-id"), Some(rid.as_str()));

    // Bytes as they are, on a queue of raw bytes (the echo worker answers JSON only, so
    // a raw body that is JSON text goes through it unchanged).
    let raw = br#"{"raw": [1, 2]}"#;
    let a = send(
        &gw.addr,
        "POST",
        &format!("/v1/queues/{}/call", env.queue),
        &[("Content-Type", "application/octet-stream")],
        Some(raw),
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("content-type"), Some("application/octet-stream"));
    assert_eq!(a.bytes, br#"{"raw":[1,2]}"#, "the worker's JSON answer");
    assert_ne!(a.header("pelican-request-id"), Some(rid.as_str()));
}

/// A gateway and a Rust program calling the same queue with the same value make one
/// request: the gateway sends JSON on compacted, as `serde_json` writes it.
#[test]
fn a_gateway_caller_and_a_rust_producer_share_one_request() {
    let env = Env::new("gw-shared");
    let _w = worker(&env, "echo", &[]);
    let gw = Gateway::start(&env, &[]);
    let a = gw.call(&env.queue, r#"{"n": 7, "tag": "same"}"#, &[]);
    assert_eq!(a.status, 200, "{a:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rid, how) = rt.block_on(async {
        #[derive(serde::Serialize)]
        struct Req {
            n: u64,
            tag: String,
        }
        let p = pelican::Producer::<Req, serde_json::Value>::connect(
            pelican::QueueConfig::new(env.server.url(), env.queue.clone()),
            pelican::ProducerConfig::default(),
        )
        .await
        .unwrap();
        let t = p
            .submit(&Req {
                n: 7,
                tag: "same".into(),
            })
            .await
            .unwrap();
        let out = (t.request_id().to_string(), t.submitted());
        t.await.unwrap();
        p.shutdown().await.unwrap();
        out
    });
    assert_eq!(a.header("pelican-request-id"), Some(rid.as_str()));
    assert_eq!(how, pelican::Submitted::Cached);
}

/// A non-loopback address needs a token; with a token every request needs it (401
/// without, 403 wrong); on loopback the Host must be a loopback name.
#[test]
fn who_may_call() {
    let env = Env::new("gw-auth");
    let out = env.run(&["gateway", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("without --token"), "{out:?}");
    let out = env.run(&["gateway", "--token", "short"]);
    assert_eq!(out.code, 2, "{out:?}");
    let out = env.run(&["gateway", "--queues", "a,b{c"]);
    assert_eq!(out.code, 2, "{out:?}");
    let out = env.run(&[
        "gateway",
        "--default-timeout",
        "9000",
        "--max-timeout",
        "1000",
    ]);
    assert_eq!(out.code, 2, "{out:?}");

    let _w = worker(&env, "echo", &[]);
    let token = "gateway-token-0123456789";
    let gw = Gateway::start(&env, &["--token", token]);
    let none = gw.call(&env.queue, "{}", &[]);
    assert_eq!(
        (none.status, kind_of(&none).as_str()),
        (401, "unauthorized")
    );
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let wrong = gw.call(
        &env.queue,
        "{}",
        &[("Authorization", "Bearer not-the-token-at-all")],
    );
    assert_eq!((wrong.status, kind_of(&wrong).as_str()), (403, "forbidden"));
    let bearer = format!("Bearer {token}");
    let ok = gw.call(&env.queue, r#"{"k":1}"#, &[("Authorization", &bearer)]);
    assert_eq!(ok.status, 200, "{ok:?}");
    for host in ["evil.example", "127.0.0.1:80@evil.example"] {
        let a = gw.call(
            &env.queue,
            "{}",
            &[("Authorization", &bearer), ("Host", host)],
        );
        assert_eq!(
            (a.status, kind_of(&a).as_str()),
            (403, "forbidden"),
            "{host}"
        );
    }
}
