//! `pelican demo` runs to its summary, with the numbers it promises.

use crate::support::*;
use pelican_testkit::RedisServer;
use serde_json::Value;

/// A shorter demo than the default, same story.
const SMALL: &[&str] = &[
    "--json",
    "demo",
    "--requests",
    "120",
    "--workers",
    "2",
    "--max-deliveries",
    "2",
    "--claim-idle",
    "500",
    "--handler-ms",
    "20",
];

fn check_summary(s: &Value) {
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert_eq!(n("requests"), 122, "{s}");
    assert_eq!(n("answered"), 120, "{s}");
    assert_eq!(n("failed"), 0, "{s}");
    assert!(n("stream_entries") < 122, "dedup saved something: {s}");
    assert_eq!(n("dedup_saved"), 122 - n("stream_entries"), "{s}");
    assert!(n("joined") + n("cached") > 0, "{s}");
    assert_eq!(n("dead_lettered"), 1, "{s}");
    assert_eq!(n("poison_deliveries"), 2, "{s}");
    assert_eq!(n("poison_dead_callers"), 2, "{s}");
    assert_eq!(n("crashes"), 2, "{s}");
    // every entry but the poison was handled at least once
    assert!(n("handled") >= n("stream_entries") - 1, "{s}");
    if let Some(held) = s["killed_worker_held"].as_u64() {
        assert!(
            n("recovered") >= held,
            "the killed worker's work was recovered: {s}"
        );
    }
    assert!(s["latency_ms"]["p50"].as_f64().unwrap() > 0.0, "{s}");
}

#[test]
fn demo_runs_to_its_summary_and_cleans_up() {
    let server = RedisServer::start();
    let out = run({
        let mut c = pelican();
        c.args(["--redis", &server.url()]).args(SMALL);
        c
    });
    assert_eq!(out.code, 0, "{out:?}");
    let summary = out.json();
    check_summary(&summary);
    assert_eq!(summary["throwaway_redis"], false);
    assert!(out.stderr.contains("killed worker"), "{out:?}");
    assert_eq!(server.cli(&["DBSIZE"]), "0", "the demo removed its keys");
}

#[test]
fn demo_starts_and_stops_a_throwaway_redis() {
    let demo = Proc::spawn({
        let mut c = pelican();
        c.args(SMALL).arg("--throwaway-redis");
        c
    });
    let pid = demo.pid();
    let out = demo.wait(RUN_TIMEOUT);
    assert_eq!(out.code, 0, "{out:?}");
    let summary = out.json();
    check_summary(&summary);
    assert_eq!(summary["throwaway_redis"], true);
    let url = summary["redis"].as_str().unwrap();
    assert!(
        out.stderr
            .contains(&format!("started a throwaway redis-server at {url}")),
        "{out:?}"
    );
    // stopped (killed and reaped) before its directory was removed
    let port = url.rsplit(':').next().unwrap();
    let dir = std::env::temp_dir().join(format!("pelican-redis-{pid}-{port}"));
    assert!(!dir.exists(), "{} was left behind", dir.display());
}
