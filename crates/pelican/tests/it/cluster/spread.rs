//! Partition layouts (docs/PROTOCOL.md, "Partitions"): the spread layout puts a queue's
//! partitions evenly over a cluster's masters, so the masters do even shares of the
//! work; a queue recorded without a layout keeps its legacy tags; a process whose layout
//! differs from the queue's is refused.

use super::id_in;
use crate::common::*;
use pelican::admin::Keys;
use pelican::{Admin, Consumer, ErrorKind, PartitionLayout, Producer, QueueConfig};
use pelican_testkit::{unique_name, RedisCluster, RedisServer};
use std::time::Duration;

/// Calls per run of the balance test: sequential, the same number to every partition,
/// so that what differs between the masters is where the partitions are.
const CALLS: u64 = 300;

/// The work a master did, from `INFO commandstats`: its stream commands (every `X...`
/// command, those the scripts run included: they add, read, acknowledge, claim and trim
/// the entries) and its script calls (`EVALSHA`, `EVAL`, `FCALL`: one per batch of
/// submissions or outcomes). What else a master answers (`PING`, `CLUSTER SLOTS`, `INFO`)
/// is not the queue's work.
fn queue_work(node: &RedisServer) -> u64 {
    node.cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let counted = name.starts_with('x') || matches!(name, "evalsha" | "eval" | "fcall");
            let calls = stats.strip_prefix("calls=")?.split(',').next()?;
            counted.then(|| calls.parse::<u64>().expect("calls=N"))
        })
        .sum()
}

/// Runs `CALLS` calls through a queue of `partitions` partitions on `cluster`, the same
/// number to each partition; returns what each master did meanwhile.
async fn work_per_master(cluster: &RedisCluster, partitions: u32) -> Vec<u64> {
    let q = QueueConfig::new(cluster.cluster_url(), unique_name("spread"))
        .with_janitor_interval(Duration::from_millis(200))
        .with_partitions(partitions);
    let w = Worker::spawn(&q, fast_consumer(), 4, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    // The queue recorded its layout; each master holds an even share of the partitions.
    let recorded = cluster.cli(&["GET", Keys::new("pelican", &q.name).partitions()]);
    assert_eq!(recorded, format!("{partitions};spread"));
    let mut held = vec![0u32; cluster.nodes().len()];
    for part in 0..partitions {
        held[cluster.master_of(q.partition_keys(part).stream())] += 1;
    }
    assert!(
        held.iter().all(|&n| n == partitions / 3),
        "P = {partitions}: partitions per master {held:?}"
    );
    let before: Vec<u64> = cluster.nodes().iter().map(queue_work).collect();
    for i in 0..CALLS {
        let id = id_in(&q, (i % u64::from(partitions)) as u32, &format!("c{i}"));
        let r = p
            .submit_with_id(&id, &Req::new(i, "s"))
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(r.i, i);
    }
    let after: Vec<u64> = cluster.nodes().iter().map(queue_work).collect();
    w.stop().await;
    p.shutdown().await.unwrap();
    after.iter().zip(&before).map(|(a, b)| a - b).collect()
}

/// On 3 masters with P = 3 and P = 6, the busiest master does at most 1.2x the idlest's
/// work (in the legacy layout, 400 calls with P = 6 cost the masters 598, 1,144 and 1,657
/// such commands: where the tags happened to hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_evenly_over_the_masters() {
    let cluster = RedisCluster::start(3);
    for partitions in [3, 6] {
        let work = work_per_master(&cluster, partitions).await;
        let (most, least) = (*work.iter().max().unwrap(), *work.iter().min().unwrap());
        eprintln!("P = {partitions}, {CALLS} calls: commands per master {work:?}");
        assert!(
            most as f64 <= 1.2 * least as f64,
            "P = {partitions}: the masters did {work:?} stream commands and script calls"
        );
    }
}

/// The value of the queue's record of its partitions.
fn record(server: &RedisServer, q: &QueueConfig) -> String {
    server.cli(&["GET", Keys::new(&q.prefix, &q.name).partitions()])
}

/// Whether partition `p` of `q` has its stream in `layout`'s keys.
fn has_stream(server: &RedisServer, q: &QueueConfig, layout: PartitionLayout, p: u32) -> bool {
    let keys = Keys::partition_in(layout, &q.prefix, &q.name, p, q.partitions);
    server.cli(&["EXISTS", keys.stream()]) == "1"
}

/// A queue of several partitions recorded by a build before the layout (the bare count)
/// keeps its legacy tags, with processes configured as by default; a new queue gets the
/// spread layout and records it; a queue of one partition keeps its keys and record in
/// any layout. A process whose layout differs from the queue's is refused, and the
/// message names both layouts and the setting; a record this build cannot read too.
#[tokio::test]
async fn queues_keep_their_layout_and_a_process_of_another_is_refused() {
    let target = Target::Node(RedisServer::start());
    let Target::Node(server) = &target else {
        unreachable!()
    };

    // A queue as a build before the layout left it: "4".
    let old = target.queue("old", 4);
    server.cli(&["SET", Keys::new(&old.prefix, &old.name).partitions(), "4"]);
    let w = Worker::spawn(&old, fast_consumer(), 2, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let p = Producer::<Req, Resp>::connect(old.clone(), fast_producer())
        .await
        .unwrap();
    for part in 0..4 {
        let id = id_in(&old, part, "old");
        let r = p
            .submit_with_id(&id, &Req::new(u64::from(part), "old"))
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(r.i, u64::from(part));
        assert!(has_stream(server, &old, PartitionLayout::Legacy, part));
        assert!(!has_stream(server, &old, PartitionLayout::Spread, part));
    }
    assert_eq!(record(server, &old), "4");
    let err = Consumer::<Req, Resp>::connect(
        old.clone().with_partition_layout(PartitionLayout::Spread),
        fast_consumer(),
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    for says in [
        "in the legacy layout",
        "with the spread layout",
        "--partition-layout",
    ] {
        assert!(err.message().contains(says), "{says:?} missing: {err}");
    }
    let st = Admin::connect(old.clone().with_partition_layout(PartitionLayout::Legacy))
        .await
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(st.partitions.len(), 4);
    w.stop().await;
    p.shutdown().await.unwrap();

    // A new queue: the spread layout, recorded.
    let new = target.queue("new", 4);
    let p = Producer::<Req, Resp>::connect(new.clone(), fast_producer())
        .await
        .unwrap();
    assert_eq!(record(server, &new), "4;spread");
    for part in 0..4 {
        assert!(has_stream(server, &new, PartitionLayout::Spread, part));
        assert!(!has_stream(server, &new, PartitionLayout::Legacy, part));
    }
    let err = Admin::connect(new.clone().with_partition_layout(PartitionLayout::Legacy))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.message().contains("in the spread layout"), "{err}");
    assert!(err.message().contains("with the legacy layout"), "{err}");
    p.shutdown().await.unwrap();

    // One partition: the keys and the record of every build, whatever the layout.
    let one = target
        .queue("one", 1)
        .with_partition_layout(PartitionLayout::Spread);
    let p = Producer::<Req, Resp>::connect(one.clone(), fast_producer())
        .await
        .unwrap();
    assert_eq!(record(server, &one), "1");
    assert_eq!(
        server.cli(&["EXISTS", &format!("pelican:{{{}}}:stream", one.name)]),
        "1"
    );
    Admin::connect(one.clone().with_partition_layout(PartitionLayout::Legacy))
        .await
        .unwrap();
    p.shutdown().await.unwrap();

    // A record this build cannot read (a later build's layout): refused, nothing written.
    let later = target.queue("later", 4);
    server.cli(&[
        "SET",
        Keys::new(&later.prefix, &later.name).partitions(),
        "4;ring",
    ]);
    let err = Producer::<Req, Resp>::connect(later.clone(), fast_producer())
        .await
        .err()
        .expect("refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.message().contains("\"4;ring\""), "{err}");
    assert_eq!(record(server, &later), "4;ring");
    assert_eq!(keys_of_queue(server, &later.name), 1, "only the record");
}

/// How many keys carry queue `name`'s tags.
fn keys_of_queue(server: &RedisServer, name: &str) -> usize {
    server
        .cli(&["KEYS", &format!("pelican:{{{name}*")])
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}
