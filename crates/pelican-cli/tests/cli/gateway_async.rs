//! The gateway's asynchronous form: `POST .../requests` answers 202 with an id at once,
//! `GET .../requests/{id}` gives the answer (200, or the error of its kind), 202 while
//! the request is in work, 404 when Redis knows nothing of it. A submitted request runs
//! whether or not anyone comes back, across a restart of the gateway.

use crate::dashboard::http::{send, Answer};
use crate::gateway::{kind_of, worker, Gateway};
use crate::support::Env;
use std::time::{Duration, Instant};

fn submit(gw: &Gateway, queue: &str, json: &str, headers: &[(&str, &str)]) -> Answer {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    send(
        &gw.addr,
        "POST",
        &format!("/v1/queues/{queue}/requests"),
        &h,
        Some(json.as_bytes()),
    )
}

fn result(gw: &Gateway, queue: &str, id: &str, query: &str) -> Answer {
    send(
        &gw.addr,
        "GET",
        &format!("/v1/queues/{queue}/requests/{id}{query}"),
        &[],
        None,
    )
}

/// Submitted, in work (202, at once and after a wait), still there after the gateway
/// restarted, answered once a worker comes, and the answer stays to be read again.
#[test]
fn the_asynchronous_form_end_to_end() {
    let env = Env::new("gw-async");
    let q = env.queue.as_str();
    let gw = Gateway::start(&env, &[]);
    let a = submit(&gw, q, r#"{"photo": 7}"#, &[("Pelican-Timeout", "60000")]);
    assert_eq!(a.status, 202, "{a:?}");
    let id = a.json()["id"].as_str().unwrap().to_string();
    assert_eq!(a.header("pelican-request-id"), Some(id.as_str()));
    assert_eq!(a.header("pelican-served"), Some("new"));
    assert_eq!(
        a.header("location"),
        Some(format!("/v1/queues/{q}/requests/{id}").as_str())
    );
    let now = result(&gw, q, &id, "");
    assert_eq!(now.status, 202, "{now:?}");
    assert_eq!(now.json()["status"], "in_work");
    let started = Instant::now();
    let waited = result(&gw, q, &id, "?wait_ms=300");
    assert_eq!(waited.status, 202, "{waited:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // The gateway stops; the request does not go with it.
    gw.proc.signal(libc::SIGTERM);
    assert_eq!(gw.proc.wait(crate::gateway::DEADLINE).code, 0);
    let gw = Gateway::start(&env, &[]);
    let addr = gw.addr.clone();
    let (queue, rid) = (env.queue.clone(), id.clone());
    let waiting = std::thread::spawn(move || {
        send(
            &addr,
            "GET",
            &format!("/v1/queues/{queue}/requests/{rid}?wait_ms=20000"),
            &[],
            None,
        )
    });
    let _w = worker(&env, "echo", &[]);
    let a = waiting.join().unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, r#"{"photo":7}"#);
    assert_eq!(a.header("content-type"), Some("application/json"));
    let again = result(&gw, q, &id, "");
    assert_eq!((again.status, again.body.as_str()), (200, r#"{"photo":7}"#));

    // The same body again: the cached answer's request.
    let a = submit(&gw, q, r#"{"photo":7}"#, &[]);
    assert_eq!(
        (a.status, a.header("pelican-served")),
        (202, Some("cached"))
    );
    assert_eq!(a.json()["id"], id.as_str());
}

/// Unknown ids are 404; a failure is given as its error; a caller-chosen id
/// (`Idempotency-Key`) names the request whatever the body (the first one is handled);
/// a request whose deadline passes while a result request waits is 504 `expired`.
#[test]
fn results_of_every_kind() {
    let env = Env::new("gw-async-kinds");
    let q = env.queue.as_str();
    let gw = Gateway::start(&env, &[]);
    let a = result(&gw, q, "never-submitted", "?wait_ms=100");
    assert_eq!(
        (a.status, kind_of(&a).as_str()),
        (404, "not_found"),
        "{a:?}"
    );
    let a = result(&gw, q, "x", "?wait=1");
    assert_eq!(a.status, 400, "{a:?}");

    // Expired: nobody serves it before its deadline.
    let a = submit(&gw, q, r#"{"late": true}"#, &[("Pelican-Timeout", "1000")]);
    let late = a.json()["id"].as_str().unwrap().to_string();
    let a = result(&gw, q, &late, "?wait_ms=20000");
    assert_eq!((a.status, kind_of(&a).as_str()), (504, "expired"), "{a:?}");

    let first = submit(&gw, q, r#"{"n": 1}"#, &[("Idempotency-Key", "order-1")]);
    assert_eq!(first.json()["id"], "order-1");
    let retried = submit(
        &gw,
        q,
        r#"{"n": 1, "at": "later"}"#,
        &[("Idempotency-Key", "order-1")],
    );
    assert_eq!(retried.json()["id"], "order-1");
    assert_eq!(retried.header("pelican-served"), Some("joined"));
    let failing = submit(&gw, q, r#"{"bad": true}"#, &[]);
    let failing = failing.json()["id"].as_str().unwrap().to_string();

    let _w = worker(&env, "fail-if:bad", &[]);
    let a = result(&gw, q, "order-1", "?wait_ms=20000");
    assert_eq!((a.status, a.body.as_str()), (200, r#"{"n":1}"#), "{a:?}");
    let a = result(&gw, q, &failing, "?wait_ms=20000");
    assert_eq!((a.status, kind_of(&a).as_str()), (422, "remote"), "{a:?}");
    assert_eq!(a.header("pelican-request-id"), Some(failing.as_str()));
}
