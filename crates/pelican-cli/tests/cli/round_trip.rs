//! `pelican call` against `pelican worker`: responses, remote errors, timeouts,
//! graceful shutdown.

use crate::support::*;
use pelican_testkit::eventually_sync;
use serde_json::json;
use std::time::Duration;

#[test]
fn call_and_worker_round_trip() {
    let env = Env::new("rt");
    let worker = env.spawn(&["worker", "--handler", "echo", "--verbose"]);
    let out = env.run(&["call", r#"{"n": 1, "s": "x"}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({"n": 1, "s": "x"}));

    let out = env.run(&["call", "--id", "my-own-id", "--no-dedup", "[1, 2]"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!([1, 2]));

    worker.signal(libc::SIGTERM);
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
    // one line per handled request
    let lines: Vec<&str> = w.stdout.lines().filter(|l| l.starts_with("ok ")).collect();
    assert_eq!(lines.len(), 2, "{w:?}");
    assert!(
        lines[1].contains("rid=my-own-id") && lines[1].contains("delivery=1"),
        "{w:?}"
    );
    assert!(
        w.stderr.contains("stopped after handling 2 requests"),
        "{w:?}"
    );
    // a worker that stopped gracefully with nothing in hand leaves the group
    assert_eq!(env.stats()["consumers"], json!([]));
}

#[test]
fn worker_json_lines_carry_the_request() {
    let env = Env::new("lines");
    let worker = env.spawn(&["--json", "worker", "--verbose"]);
    let out = env.run(&["call", "--id", "r-1", r#"{"a": true}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    worker.signal(libc::SIGINT);
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
    let events: Vec<serde_json::Value> = w
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ready", "handled", "stopped"], "{w:?}");
    let h = &events[1];
    assert_eq!(h["rid"], "r-1");
    assert_eq!(h["delivery"], 1);
    assert_eq!(h["outcome"], "ok");
}

#[test]
fn remote_failure_exits_3() {
    let env = Env::new("remote");
    let worker = env.spawn(&["worker", "--handler", "fail-if:bad"]);
    let out = env.run(&["call", r#"{"bad": true}"#]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr
            .contains(r#"fail-if:bad: the request has "bad": true"#),
        "{out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    let out = env.run(&["call", r#"{"bad": false}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    drop(worker);
}

#[test]
fn no_worker_means_timeout_exit_4() {
    let env = Env::new("timeout");
    let out = env.run(&["call", "--timeout", "300", r#"{"n": 1}"#]);
    assert_eq!(out.code, 4, "{out:?}");
    assert!(out.stderr.contains("timeout"), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("pelican worker --queue {}", env.queue)),
        "the message says what to do: {out:?}"
    );
}

#[test]
fn graceful_shutdown_finishes_work_in_hand() {
    let env = Env::new("graceful");
    let worker = env.spawn(&["worker", "--handler", "sleep:1500"]);
    let call = env.spawn(&["call", r#"{"slow": 1}"#]);
    eventually_sync(
        Duration::from_secs(20),
        "the worker to take the request",
        || env.stats()["pending"] == 1,
    );
    worker.signal(libc::SIGTERM);
    let c = call.wait(Duration::from_secs(20));
    assert_eq!(c.code, 0, "the request in hand is finished: {c:?}");
    assert_eq!(c.json(), json!({"slow": 1}));
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
    assert!(w.stderr.contains("stopping"), "{w:?}");
}

#[test]
fn queue_settings_flags_reach_redis() {
    let env = Env::new("settings");
    let key = env.keys().req("settings-1");
    let worker = env.spawn(&["worker", "--result-ttl", "60000"]);
    let out = env.run(&["call", "--result-ttl", "60000", "--id", "settings-1", "[1]"]);
    assert_eq!(out.code, 0, "{out:?}");
    // the outcome is cached for the worker's --result-ttl, not the default 300 s
    let mut conn = env.server.sync_connection();
    let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    assert!(pttl > 0 && pttl <= 60_000, "PTTL {pttl}");
    drop(worker);

    // a body over --max-body-bytes is refused before anything is queued
    let out = env.run(&["call", "--max-body-bytes", "8", r#"{"too": "long"}"#]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("max_body_bytes is 8"), "{out:?}");
    // out-of-range values are usage errors
    for bad in [
        &["--result-ttl", "0", "stats"][..],
        &["--dead-maxlen", "0", "stats"],
        &["--consumer-gc-after", "x", "stats"],
        &["--failure-ttl", "x", "stats"],
        &["--failure-ttl", "300001", "stats"],
        &["--result-ttl", "1000", "--failure-ttl", "1001", "stats"],
    ] {
        let out = env.run(bad);
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
    }
}

/// A handler's failure answers a new submission of the same request only within
/// `--failure-ttl` (given to the caller: the submission reads it); by default it runs again.
#[test]
fn a_failure_answers_a_new_call_only_within_the_failure_ttl() {
    let env = Env::new("failure-ttl");
    let worker = env.spawn(&["worker", "--handler", "fail-if:bad"]);
    let call = |extra: &[&str]| {
        let mut args = vec!["call", "--id", "img-1"];
        args.extend_from_slice(extra);
        args.push(r#"{"bad": true}"#);
        env.run(&args)
    };
    let mut conn = env.server.sync_connection();
    let mut added = || -> u64 {
        let info: std::collections::HashMap<String, redis::Value> = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(env.keys().stream())
            .query(&mut conn)
            .unwrap();
        redis::from_redis_value(info["entries-added"].clone()).unwrap()
    };
    let first = call(&[]);
    assert_eq!(first.code, 3, "failed remotely: {first:?}");
    let before = added();
    // Within --failure-ttl: the recorded failure, nothing queued.
    let cached = call(&["--failure-ttl", "60000"]);
    assert_eq!(cached.code, 3, "{cached:?}");
    assert_eq!(added(), before, "answered from the record");
    // By default: run again (and failed again), a new entry.
    let again = call(&[]);
    assert_eq!(again.code, 3, "{again:?}");
    assert_eq!(added(), before + 1, "run again");
    let recorded: Option<Vec<u8>> = redis::cmd("GET")
        .arg(env.keys().req("img-1"))
        .query(&mut env.server.sync_connection())
        .unwrap();
    assert_eq!(recorded.and_then(|v| v.first().copied()), Some(b'E'));
    drop(worker);
}
