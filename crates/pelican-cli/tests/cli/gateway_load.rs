//! The gateway under load and when things go away: identical calls solved once, SIGTERM
//! on a busy gateway, a caller that closes its connection.

use crate::dashboard::http::{read_answer, send, Answer};
use crate::gateway::{worker, Gateway, DEADLINE};
use crate::support::Env;
use pelican_testkit::eventually_sync;
use std::io::Write;
use std::net::TcpStream;

fn post(addr: &str, queue: &str, json: &str) -> Answer {
    send(
        addr,
        "POST",
        &format!("/v1/queues/{queue}/call"),
        &[("Content-Type", "application/json")],
        Some(json.as_bytes()),
    )
}

fn xlen(env: &Env) -> u64 {
    let mut c = env.server.sync_connection();
    redis::cmd("XLEN")
        .arg(env.keys().stream())
        .query(&mut c)
        .unwrap()
}

/// Handler runs, from the worker's `--verbose --json` lines.
fn runs(w: &crate::support::Proc) -> usize {
    w.stdout()
        .lines()
        .filter(|l| l.contains(r#""event":"handled""#))
        .count()
}

/// 100 identical calls at once: one handler run, 100 answers (one `new`, the rest
/// `joined` while it runs).
#[test]
fn a_hundred_identical_calls_are_one_handler_run() {
    let env = Env::new("gw-dedup");
    let w = worker(&env, "sleep:1000", &["--verbose", "--json"]);
    let gw = Gateway::start(&env, &[]);
    let callers: Vec<_> = (0..100)
        .map(|_| {
            let (addr, queue) = (gw.addr.clone(), env.queue.clone());
            std::thread::spawn(move || post(&addr, &queue, r#"{"n": 42}"#))
        })
        .collect();
    let answers: Vec<Answer> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let mut served = std::collections::BTreeMap::new();
    for a in &answers {
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.body, r#"{"n":42}"#);
        *served
            .entry(a.header("pelican-served").unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(served.get("new"), Some(&1), "{served:?}");
    let ids: std::collections::BTreeSet<_> = answers
        .iter()
        .map(|a| a.header("pelican-request-id").unwrap())
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(runs(&w), 1, "{}", w.stdout());
}

/// SIGTERM while calls are in work: no new connection is taken, every call in progress
/// gets its answer, the gateway exits 0 and leaves no request behind.
#[test]
fn sigterm_on_a_busy_gateway_loses_nothing() {
    let env = Env::new("gw-term");
    let _w = worker(&env, "sleep:1500", &["--concurrency", "64"]);
    let gw = Gateway::start(&env, &[]);
    let callers: Vec<_> = (0..40)
        .map(|i| {
            let (addr, queue) = (gw.addr.clone(), env.queue.clone());
            std::thread::spawn(move || post(&addr, &queue, &format!(r#"{{"n": {i}}}"#)))
        })
        .collect();
    eventually_sync(DEADLINE, "every call to be in the queue", || {
        xlen(&env) == 40
    });
    gw.proc.signal(libc::SIGTERM);
    eventually_sync(DEADLINE, "the gateway to stop accepting", || {
        TcpStream::connect(&gw.addr).is_err()
    });
    for (i, c) in callers.into_iter().enumerate() {
        let a = c.join().unwrap();
        assert_eq!(a.status, 200, "call {i}: {a:?}");
        assert_eq!(a.body, format!(r#"{{"n":{i}}}"#));
    }
    let out = gw.proc.wait(DEADLINE);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("stopped"), "{out:?}");
    let mut c = env.server.sync_connection();
    let pending: Vec<String> = redis::cmd("KEYS")
        .arg(format!("pelican:{{{}}}:req:*", env.queue))
        .query::<Vec<String>>(&mut c)
        .unwrap()
        .into_iter()
        .filter(|k| {
            redis::cmd("GET")
                .arg(k)
                .query::<String>(&mut c)
                .unwrap()
                .starts_with('P')
        })
        .collect();
    assert!(pending.is_empty(), "requests left in flight: {pending:?}");
}

/// A caller that closes its connection is a waiter that gave up: its request is
/// withdrawn, unless another caller waits for it too (that one gets the answer).
#[test]
fn a_caller_that_goes_away_withdraws_its_request() {
    let env = Env::new("gw-gone");
    let gw = Gateway::start(&env, &[]);
    let open = |addr: &str, json: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/queues/{}/call HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
            env.queue,
            json.len()
        )
        .unwrap();
        s
    };
    let index = |env: &Env| -> Vec<String> {
        let mut c = env.server.sync_connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("pelican:{{{}}}:req:*", env.queue))
            .query(&mut c)
            .unwrap();
        keys.iter()
            .map(|k| redis::cmd("GET").arg(k).query(&mut c).unwrap())
            .collect()
    };
    let alone = open(&gw.addr, r#"{"alone": true}"#);
    eventually_sync(DEADLINE, "the request to be queued", || xlen(&env) == 1);
    drop(alone);
    eventually_sync(DEADLINE, "the request to be withdrawn", || xlen(&env) == 0);
    assert!(index(&env).is_empty(), "{:?}", index(&env));

    // Two callers of one request, through two gateways (two producers: the join is seen
    // in the request's index); the first goes away, the second is answered.
    let other = Gateway::start(&env, &[]);
    let first = open(&gw.addr, r#"{"shared": true}"#);
    eventually_sync(DEADLINE, "the request to be queued", || xlen(&env) == 1);
    let mut second = open(&other.addr, r#"{"shared": true}"#);
    second.set_read_timeout(Some(DEADLINE)).unwrap();
    eventually_sync(DEADLINE, "the second caller to join", || {
        index(&env)
            .first()
            .is_some_and(|v| v.matches(';').count() == 4)
    });
    drop(first);
    eventually_sync(DEADLINE, "the first caller to leave", || {
        index(&env)
            .first()
            .is_some_and(|v| v.matches(';').count() == 3)
    });
    assert_eq!(xlen(&env), 1, "still queued for the second caller");
    let _w = worker(&env, "echo", &[]);
    let a = read_answer(&mut second);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, r#"{"shared":true}"#);
}
