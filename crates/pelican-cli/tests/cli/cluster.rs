//! The command over `redis+cluster://` with a partitioned queue: worker and call,
//! `stats --json` with its per-partition breakdown, a wrong partition count or layout
//! refused.

use crate::support::*;
use pelican_testkit::{unique_name, RedisCluster};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

struct ClusterEnv {
    _cluster: RedisCluster,
    url: String,
    queue: String,
}

impl ClusterEnv {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = pelican();
        cmd.args(["--redis", &self.url, "--queue", &self.queue])
            .env("PELICAN_PARTITIONS", "6")
            .args(args);
        cmd
    }
}

#[test]
fn round_trip_and_stats_over_a_cluster() {
    let cluster = RedisCluster::start(3);
    let env = ClusterEnv {
        url: cluster.cluster_url(),
        _cluster: cluster,
        queue: unique_name("cli-cluster"),
    };
    let worker = Proc::spawn(env.cmd(&["worker", "--handler", "echo"]));
    for i in 0..12 {
        let body = format!(r#"{{"n": {i}}}"#);
        let out = run(env.cmd(&["call", &body]));
        assert_eq!(out.code, 0, "{out:?}");
        assert_eq!(out.json(), json!({ "n": i }));
    }
    let out = run(env.cmd(&["--json", "stats"]));
    assert_eq!(out.code, 0, "{out:?}");
    let st = out.json();
    let parts = st["partitions"]
        .as_array()
        .expect("a per-partition breakdown");
    assert_eq!(parts.len(), 6, "{st}");
    let added: u64 = parts
        .iter()
        .map(|p| p["entries_added"].as_u64().unwrap())
        .sum();
    assert_eq!(added, 12, "{st}");
    assert_eq!(st["entries_added"], 12, "totals: {st}");
    assert_eq!(st["cached_results"], 12, "{st}");
    assert_eq!(
        st["consumers"].as_array().unwrap().len(),
        1,
        "one worker, counted once: {st}"
    );
    let text = run(env.cmd(&["stats"]));
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains("partitions      6"), "{}", text.stdout);

    // Another partition count than the queue's: a usage error that says what to do.
    let mut wrong = env.cmd(&["stats"]);
    wrong.env("PELICAN_PARTITIONS", "3");
    let out = run(wrong);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("has 6 partition(s)"), "{out:?}");
    // Another layout than the queue's (spread: it is new): refused alike, and the
    // message names both layouts and the flag.
    let out = run(env.cmd(&["--partition-layout", "legacy", "stats"]));
    assert_eq!(out.code, 2, "{out:?}");
    for says in [
        "in the spread layout",
        "with the legacy layout",
        "--partition-layout",
    ] {
        assert!(out.stderr.contains(says), "{says:?} missing: {out:?}");
    }
    let out = run(env.cmd(&["--partition-layout", "spread", "stats"]));
    assert_eq!(out.code, 0, "{out:?}");
    let out = run(env.cmd(&["--partition-layout", "even", "stats"]));
    assert_eq!(out.code, 2, "an unknown layout: {out:?}");

    // Dead-letter ids carry their partition; a bare stream id is a usage error here.
    let out = run(env.cmd(&["dead", "requeue", "1700000000000-0"]));
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("3/1700000000000-0"), "{out:?}");
    let out = run(env.cmd(&["dead", "requeue", "2/1700000000000-0"]));
    assert_eq!(
        out.code, 1,
        "a well-formed id that names no letter: {out:?}"
    );
    assert!(
        out.stderr.contains("no dead letter 2/1700000000000-0"),
        "{out:?}"
    );
    let out = run(env.cmd(&["--json", "dead", "list"]));
    assert_eq!(out.code, 0, "{out:?}");

    worker.signal(libc::SIGTERM);
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
}
