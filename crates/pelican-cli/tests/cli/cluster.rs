//! The command over `redis+cluster://` with a partitioned queue: worker and call,
//! `stats --json` with its per-partition breakdown, a wrong partition count or layout refused,
//! `inspect` of a request in any partition, `dead list | requeue | purge` across
//! partitions. (`pelican dashboard` on a cluster: `dashboard/api.rs`, `dashboard/browser.rs`.)

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

/// `inspect` finds a request in the partition it hashed to (here not the first), and
/// `dead list | requeue | purge` work on letters of several partitions, each on its
/// master: listed with their partition, one requeued (and answered), the rest purged.
#[test]
fn inspect_and_dead_letters_over_a_cluster() {
    let cluster = RedisCluster::start(3);
    let env = ClusterEnv {
        url: cluster.cluster_url(),
        _cluster: cluster,
        queue: unique_name("cli-cluster-dead"),
    };
    let q = pelican::QueueConfig::new(env.url.clone(), env.queue.clone()).with_partitions(6);
    let id_in = |p: u32, tag: &str| -> String {
        (0..)
            .map(|i| format!("{tag}-{i}"))
            .find(|id| q.partition_of(id) == p)
            .unwrap()
    };
    let inspect = |rid: &str| -> serde_json::Value {
        let out = run(env.cmd(&["--json", "inspect", rid]));
        assert_eq!(out.code, 0, "{out:?}");
        out.json()
    };

    // Queued (no worker yet) in partition 4, then answered.
    let rid = id_in(4, "insp");
    let call = Proc::spawn(env.cmd(&["call", "--id", &rid, "--timeout", "60000", "[4]"]));
    pelican_testkit::eventually_sync(Duration::from_secs(20), "the request queued", || {
        let out = run(env.cmd(&["--json", "inspect", &rid]));
        out.code == 0 && out.json()["state"] == "queued"
    });
    let worker = Proc::spawn(env.cmd(&["worker", "--handler", "echo"]));
    let out = call.wait(Duration::from_secs(30));
    assert_eq!((out.code, out.json()), (0, json!([4])), "{out:?}");
    let seen = inspect(&rid);
    assert_eq!(seen["state"], "ok", "{seen}");
    assert_eq!(seen["outcome_preview"], "[4]", "{seen}");

    // Two letters in partition 5, one in partition 2.
    let mut conn = redis::cluster::ClusterClient::new(env._cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut bury = |p: u32, rid: &str| -> String {
        let id: String = redis::cmd("XADD")
            .arg(q.partition_keys(p).dead())
            .arg("*")
            .arg("entry")
            .arg("1-1")
            .arg("reason")
            .arg("handler crashed 3 times (test poison)")
            .arg("deliveries")
            .arg(3)
            .arg("consumer")
            .arg("w")
            .arg("dead_at")
            .arg(1_700_000_000_000u64)
            .arg("rid")
            .arg(rid)
            .arg("from")
            .arg("")
            // indexed: a requeued letter gets a fresh index, so `inspect` finds it
            .arg("index")
            .arg("1")
            .arg("body")
            .arg(format!(r#"{{"{rid}": true}}"#))
            .query(&mut conn)
            .unwrap();
        format!("{p}/{id}")
    };
    // (each with a request id of its partition, as a consumer's letters have)
    let b_rid = id_in(5, "dead-b");
    let a = bury(5, &id_in(5, "dead-a"));
    let b = bury(5, &b_rid);
    let c = bury(2, &id_in(2, "dead-c"));
    let out = run(env.cmd(&["--json", "dead", "list"]));
    assert_eq!(out.code, 0, "{out:?}");
    let mut ids: Vec<String> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want = vec![a.clone(), b.clone(), c.clone()];
    want.sort();
    assert_eq!(ids, want, "every partition's letters, with their partition");

    let out = run(env.cmd(&["dead", "requeue", &b]));
    assert_eq!(out.code, 0, "{out:?}");
    // The requeued letter is a fresh request: the worker answers it, its id stays.
    pelican_testkit::eventually_sync(
        Duration::from_secs(20),
        "the requeued letter answered",
        || {
            let out = run(env.cmd(&["--json", "inspect", &b_rid]));
            out.code == 0 && out.json()["state"] == "ok"
        },
    );
    let out = run(env.cmd(&["--json", "dead", "purge"]));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json(), json!({ "purged": 2 }));
    let out = run(env.cmd(&["--json", "dead", "list"]));
    assert_eq!(out.json(), json!([]), "{out:?}");
    let st = run(env.cmd(&["--json", "stats"])).json();
    assert_eq!(st["dead_letters"], 0, "{st}");

    worker.signal(libc::SIGTERM);
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
}
