//! Partitions and Redis Cluster: one queue over `redis+cluster://`, partitions on one
//! node and on a cluster, fairness between partitions, dead letters across partitions;
//! their layout over a cluster's slots (`spread`).

mod spread;

use crate::common::*;
use pelican::{Admin, Consumer, ErrorKind, Producer, QueueConfig};
use pelican_testkit::{eventually, unique_name, RedisCluster, RedisServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn cluster_url(c: &RedisCluster) -> String {
    let seeds: Vec<String> = c.ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("redis+cluster://{}", seeds.join(","))
}

#[tokio::test]
async fn a_queue_on_a_cluster_round_trips() {
    let cluster = RedisCluster::start(3);
    let q = QueueConfig::new(cluster_url(&cluster), unique_name("on-cluster"))
        .with_janitor_interval(Duration::from_millis(200));
    let (w, runs) = Worker::counting(&q, fast_consumer(), "w").await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for i in 0..50 {
        let r = p.call(&Req::new(i, "c")).await.unwrap();
        assert_eq!((r.i, r.by.as_str()), (i, "w"));
    }
    // A request already answered is served from the cache on the cluster as on one
    // node (joining one still in work, across a failover:
    // `failover::identical_requests_join_the_one_in_work_across_a_failover`).
    let seven = Req::new(7, "c");
    let (a, b) = tokio::join!(p.call(&seven), p.call(&seven));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(runs.total(), 50);
    let st = Admin::connect(q.clone())
        .await
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(st.consumers.len(), 1);
    // Found by SCAN on the node of the queue's slot (SCAN names no key to route by).
    assert_eq!(st.cached_results, 50);
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// A request id that goes to partition `p` of `q` (ids are routed by hash).
fn id_in(q: &QueueConfig, p: u32, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|id| q.partition_of(id) == p)
        .expect("some id lands in every partition")
}

#[tokio::test]
async fn a_process_with_another_partition_count_is_refused() {
    let server = RedisServer::start();
    let target = Target::Node(server);
    let q = target.queue("mismatch", 4);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for other in [1, 2] {
        let err = Consumer::<Req, Resp>::connect(q.clone().with_partitions(other), fast_consumer())
            .await
            .err()
            .expect("refused");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.message().contains("has 4 partition(s)"), "{err}");
        let err = Admin::connect(q.clone().with_partitions(other))
            .await
            .err()
            .expect("refused");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    }
    p.shutdown().await.unwrap();
}

/// One hot partition with a long backlog and three cold ones: the cold requests are
/// served while the hot backlog is still mostly waiting, not after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_partition_starves_while_another_has_work() {
    const HOT: usize = 400;
    let server = RedisServer::start();
    let target = Target::Node(server);
    let q = target.queue("fairness", 4);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut hot = Vec::new();
    for i in 0..HOT {
        let id = id_in(&q, 0, &format!("hot{i}"));
        hot.push(
            p.submit_with_id(&id, &Req::new(i as u64, "hot"))
                .await
                .unwrap(),
        );
    }
    let done = Arc::new(AtomicUsize::new(0));
    let d2 = done.clone();
    let w = Worker::spawn(&q, fast_consumer().with_prefetch(4), 4, move |r: Req, _| {
        let done = d2.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if r.tag == "hot" {
                done.fetch_add(1, Ordering::SeqCst);
            }
            Ok(echo(&r, "w"))
        }
    })
    .await;
    // The hot backlog is flowing; now the cold requests come.
    eventually(Duration::from_secs(20), "the hot work started", || {
        let done = done.clone();
        async move { done.load(Ordering::SeqCst) >= 8 }
    })
    .await;
    let mut cold = Vec::new();
    for part in 1..4 {
        let id = id_in(&q, part, "cold");
        cold.push(
            p.submit_with_id(&id, &Req::new(1000 + part as u64, "cold"))
                .await
                .unwrap(),
        );
    }
    for t in cold {
        let r = within(Duration::from_secs(20), "a cold request", t)
            .await
            .unwrap();
        let hot_done = done.load(Ordering::SeqCst);
        assert!(
            hot_done < HOT / 2,
            "cold request {} waited behind the hot backlog: {hot_done} of {HOT} hot ones were done first",
            r.i
        );
    }
    for t in hot {
        within(Duration::from_secs(60), "the hot backlog", t)
            .await
            .unwrap();
    }
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// On one node a producer reads the reply streams of all its partitions with one
/// blocking XREAD on one connection (one command names them all), not one per partition,
/// and every partition's outcomes still reach their callers.
#[tokio::test]
async fn a_producer_on_one_node_reads_every_partitions_replies_on_one_connection() {
    let server = RedisServer::start();
    let target = Target::Node(server);
    let q = target.queue("one-reply-reader", 4);
    let w = Worker::spawn(&q, fast_consumer(), 4, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for part in 0..4 {
        let id = id_in(&q, part, "each");
        let t = p
            .submit_with_id(&id, &Req::new(u64::from(part), "each"))
            .await
            .unwrap();
        let r = within(Duration::from_secs(20), "a call", t).await.unwrap();
        assert_eq!(r.i, u64::from(part));
    }
    // Every partition's outcome was read, so every reader that exists has sent its XREAD
    // (a reply reader's connection sends nothing else).
    let Target::Node(server) = &target else {
        unreachable!()
    };
    let mut c = server.sync_connection();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
    let readers = list.lines().filter(|l| l.contains(" cmd=xread ")).count();
    assert_eq!(readers, 1, "reply readers:\n{list}");
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// Dead letters of every partition are listed, requeued and purged through one Admin.
#[tokio::test]
async fn dead_letters_across_partitions() {
    let server = RedisServer::start();
    let target = Target::Node(server);
    let q = target.queue("dead-parts", 3);
    let w = Worker::spawn(
        &q,
        fast_consumer().with_max_deliveries(1),
        2,
        |_r: Req, _| async { Err(pelican::HandlerError::retry("not today")) },
    )
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for part in 0..3 {
        let id = id_in(&q, part, "doomed");
        let e = p
            .submit_with_id(&id, &Req::new(part as u64, "d"))
            .await
            .unwrap()
            .await;
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Dead);
        ids.push(id);
    }
    w.stop().await;
    let admin = Admin::connect(q.clone()).await.unwrap();
    let letters = admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 3);
    let mut parts: Vec<u32> = letters.iter().map(|d| d.partition).collect();
    parts.sort();
    assert_eq!(parts, [0, 1, 2]);
    for d in &letters {
        assert!(d.id.starts_with(&format!("{}/", d.partition)), "{}", d.id);
    }
    let st = admin.stats().await.unwrap();
    assert_eq!(st.dead_letters, 3);
    assert_eq!(st.partitions.len(), 3);
    assert!(st.partitions.iter().all(|s| s.dead_letters == 1));
    // A bare stream id means nothing with several partitions: a clear error.
    let bare = letters[0].id.split_once('/').unwrap().1.to_string();
    assert_eq!(
        admin
            .requeue(&[bare], Duration::from_secs(60))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Config
    );
    let requeued = admin
        .requeue(&[letters[1].id.clone()], Duration::from_secs(60))
        .await
        .unwrap();
    assert!(requeued[0].1.is_some(), "{requeued:?}");
    assert_eq!(admin.dead_letters(10).await.unwrap().len(), 2);
    assert_eq!(admin.purge_dead().await.unwrap(), 2);
    assert_eq!(admin.stats().await.unwrap().dead_letters, 0);
    p.shutdown().await.unwrap();
}

/// A process finds a cluster only through the seed nodes of its URL. With the one node a
/// URL lists down (a replica, killed: the cluster itself is whole), a process cannot
/// start, and the error names the seed it tried and says to list several; with a live
/// node listed beside it, it starts and serves (the rest is discovered); with every seed
/// down, the error names them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_starts_while_a_seed_is_down_when_the_url_lists_another() {
    let mut cluster = RedisCluster::start_with(3, 1, &[]);
    let replica = cluster.replicas_of(0)[0];
    let ports = cluster.ports();
    let down = format!("127.0.0.1:{}", ports[replica]);
    let live = format!("127.0.0.1:{}", ports[0]);
    cluster.nodes_mut()[replica].kill();
    let name = unique_name("seeds");
    let with = |seeds: &[&str]| {
        QueueConfig::new(format!("redis+cluster://{}", seeds.join(",")), name.clone())
            .with_janitor_interval(Duration::from_millis(200))
    };

    let e = Producer::<Req, Resp>::connect(with(&[&down]), fast_producer())
        .await
        .err()
        .expect("no seed answers");
    assert_eq!(e.kind(), ErrorKind::Redis, "{e:#}");
    assert!(e.message().contains(&format!("(tried {down})")), "{e:#}");
    assert!(e.message().contains("list several nodes"), "{e:#}");

    let elsewhere = format!("127.0.0.1:{}", pelican_testkit::free_port());
    let e = Consumer::<Req, Resp>::connect(with(&[&down, &elsewhere]), fast_consumer())
        .await
        .err()
        .expect("no seed answers");
    assert!(
        e.message()
            .contains(&format!("(tried {down}, {elsewhere})")),
        "{e:#}"
    );
    assert!(!e.message().contains("list several"), "{e:#}");

    let q = with(&[&down, &live]);
    let (w, runs) = Worker::counting(&q, fast_consumer(), "w").await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for i in 0..10 {
        assert_eq!(
            p.call(&Req::new(i, "s")).await.unwrap(),
            echo(&Req::new(i, "s"), "w")
        );
    }
    assert_eq!(runs.total(), 10);
    w.stop().await;
    p.shutdown().await.unwrap();
}
