//! Poison requests: `crash-if` kills workers until the request is dead-lettered; `dead
//! list`, `dead requeue` and `dead purge` deal with it.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

const SIGABRT_EXIT: i32 = 128 + libc::SIGABRT;
const WAIT: Duration = Duration::from_secs(30);

fn crashing_worker(env: &Env, max_deliveries: &str) -> Proc {
    env.spawn(&[
        "worker",
        "--handler",
        "crash-if:poison",
        "--claim-idle",
        "300",
        "--max-deliveries",
        max_deliveries,
    ])
}

fn dead_letters(env: &Env) -> Vec<Value> {
    let out = env.run(&["--json", "dead", "list"]);
    assert_eq!(out.code, 0, "{out:?}");
    out.json().as_array().cloned().expect("an array")
}

/// Submits `body` and crashes workers on it until it is dead-lettered after
/// `max_deliveries`; returns the caller's outcome and the last worker (still running).
fn poison(env: &Env, body: &str, max_deliveries: u32) -> (Out, Proc) {
    let call = env.spawn(&["call", "--timeout", "30000", body]);
    let md = max_deliveries.to_string();
    for _ in 0..max_deliveries {
        let w = crashing_worker(env, &md).wait(WAIT);
        assert_eq!(w.code, SIGABRT_EXIT, "crash-if aborts the process: {w:?}");
        assert!(w.stderr.contains("crash-if:poison"), "{w:?}");
    }
    // The next worker finds the request delivered max_deliveries times: dead letter.
    let last = crashing_worker(env, &md);
    (call.wait(WAIT), last)
}

#[test]
fn poison_ends_in_dead_list_and_requeue_puts_it_back() {
    let env = Env::new("poison");
    let (call, last) = poison(&env, r#"{"poison": true}"#, 2);
    assert_eq!(call.code, 4, "{call:?}");
    assert!(call.stderr.contains("dead-lettered"), "{call:?}");
    assert!(
        call.stderr.contains("pelican dead list"),
        "says what to do: {call:?}"
    );

    let letters = dead_letters(&env);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let d = &letters[0];
    assert_eq!(d["deliveries"], 2);
    assert_eq!(d["body_preview"], r#"{"poison":true}"#);
    assert!(
        d["reason"].as_str().unwrap().contains("max_deliveries 2"),
        "{d}"
    );
    assert!(!d["consumer"].as_str().unwrap().is_empty(), "{d}");
    let text = env.run(&["dead", "list"]);
    assert_eq!(text.code, 0, "{text:?}");
    for want in ["reason:", "2 deliveries", "body:", "pelican dead requeue"] {
        assert!(text.stdout.contains(want), "{want}: {text:?}");
    }

    last.signal(libc::SIGTERM);
    assert_eq!(last.wait(WAIT).code, 0);

    let id = d["id"].as_str().unwrap();
    let out = env.run(&["dead", "requeue", id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains(&format!("requeued {id} as entry ")),
        "{out:?}"
    );
    assert!(dead_letters(&env).is_empty());
    let st = env.stats();
    assert_eq!(st["dead_letters"], 0);
    assert_eq!(st["in_flight"].as_array().unwrap().len(), 1, "{st}");

    // Back on the queue: a healthy worker answers it, and whoever asks gets the answer.
    let _healthy = env.spawn(&["worker"]);
    let out = env.run(&["call", r#"{"poison": true}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({"poison": true}));
}

#[test]
fn requeue_all_missing_ids_and_purge() {
    let env = Env::new("purge");
    let (call, last) = poison(&env, r#"{"poison": true, "n": 1}"#, 1);
    assert_eq!(call.code, 4, "{call:?}");
    assert_eq!(dead_letters(&env).len(), 1);

    let out = env.run(&["dead", "requeue", "0-1"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("no dead letter 0-1"), "{out:?}");
    assert!(out.stderr.contains("pelican dead list"), "{out:?}");

    // --all puts it back; the crashing worker still running takes it and dies
    let out = env.run(&["--json", "dead", "requeue", "--all"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({"requeued": 1}));
    assert_eq!(last.wait(WAIT).code, SIGABRT_EXIT);
    // ... and the next one dead-letters it again
    let _again = crashing_worker(&env, "1");
    pelican_testkit::eventually_sync(WAIT, "the request to be dead again", || {
        dead_letters(&env).len() == 1
    });

    let out = env.run(&["dead", "purge"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("purged 1 dead letters"), "{out:?}");
    let out = env.run(&["dead", "list"]);
    assert!(out.stdout.contains("no dead letters"), "{out:?}");
}
