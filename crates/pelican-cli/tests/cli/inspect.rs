//! `pelican inspect`: one request through its states.

use crate::support::*;
use pelican_testkit::eventually_sync;
use serde_json::Value;
use std::time::Duration;

#[test]
fn inspect_follows_a_request_from_queued_to_answered() {
    let env = Env::new("inspect");
    let inspect = |rid: &str| -> Option<Value> {
        let out = env.run(&["--json", "inspect", rid]);
        match out.code {
            0 => Some(out.json()),
            1 => {
                assert!(out.stderr.contains("knows no request"), "{out:?}");
                None
            }
            _ => panic!("{out:?}"),
        }
    };
    assert!(inspect("insp-1").is_none(), "nothing submitted yet");

    // no worker yet: the request waits in the stream
    let call = env.spawn(&["call", "--id", "insp-1", "--timeout", "60000", "[1, 2]"]);
    let mut seen = None;
    eventually_sync(Duration::from_secs(10), "the request queued", || {
        seen = inspect("insp-1");
        seen.is_some()
    });
    let q = seen.unwrap();
    assert_eq!(q["state"], "queued", "{q}");
    assert_eq!(q["waiters"].as_array().map(Vec::len), Some(1), "{q}");
    assert_eq!(q["body_len"], 5, "{q}"); // [1,2]
    assert!(q["entry"].is_string() && q["deadline_ms"].is_u64(), "{q}");
    assert!(q["consumer"].is_null(), "{q}");

    // a slow worker takes it: in work, by that worker, first delivery
    let worker = env.spawn(&["worker", "--handler", "sleep:1500"]);
    eventually_sync(Duration::from_secs(10), "the request in work", || {
        inspect("insp-1").is_some_and(|r| r["state"] == "in_work")
    });
    let w = inspect("insp-1").unwrap();
    assert_eq!(w["deliveries"], 1, "{w}");
    assert!(w["consumer"].as_str().is_some_and(|c| !c.is_empty()), "{w}");
    assert_eq!(w["entry"], q["entry"], "{w}");
    let text = env.run(&["inspect", "insp-1"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains("state       in work"), "{text:?}");
    assert!(
        text.stdout.contains("(delivery 1, lease renewed"),
        "{text:?}"
    );

    let answered = call.wait(Duration::from_secs(20));
    assert_eq!(answered.code, 0, "{answered:?}");
    let done = inspect("insp-1").expect("the outcome is cached");
    assert_eq!(done["state"], "ok", "{done}");
    assert_eq!(done["outcome_preview"], "[1,2]", "{done}");
    assert!(
        done["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t > 0 && t <= 300_000),
        "{done}"
    );
    assert!(done["entry"].is_null(), "{done}");
    drop(worker);

    // an id no producer could have used is a usage error
    let out = env.run(&["inspect", "bad\u{7}id"]);
    assert_eq!(out.code, 2, "{out:?}");
}
