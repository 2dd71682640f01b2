//! A master of a Redis Cluster SIGKILLed mid-run: its replica is promoted, producers and
//! consumers follow it. Nothing is lost: a submission the old master acknowledged but
//! never replicated is found by the producer's sweep and submitted again, with dedup on
//! (its index unknown) or off (its entry gone without an outcome). And a resharding mid-run: a
//! partition's slot moved to another master with its keys, every connection answered
//! `ASK`, `TRYAGAIN` and then `MOVED`: nothing is lost, dedup on or off.
//!
//! Every scenario runs twice: on pelican's lean connections (the default for plain TCP)
//! and on the client library's alone (`QueueConfig::with_lean_connections(false)`, the
//! path TLS and Unix sockets take): the `*_library_connections` tests.

use crate::common::*;
use pelican::{Producer, ProducerConfig, QueueConfig};
use pelican_testkit::RedisCluster;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

const PARTITIONS: u32 = 6;

fn replicated_cluster() -> RedisCluster {
    RedisCluster::start_with(3, 1, &["--appendonly", "yes", "--appendfsync", "always"])
}

fn producer_config(dedup: bool) -> ProducerConfig {
    fast_producer()
        .with_dedup(dedup)
        .with_request_timeout(Duration::from_secs(60))
        .with_sweep_interval(Duration::from_millis(500))
}

/// What happens to partition 0's node mid-run.
#[derive(Debug, Clone, Copy)]
enum Disruption {
    /// Its master is SIGKILLed; its replica takes over.
    KillMaster,
    /// Its slot moves to another master (a cluster without replicas).
    MoveSlot,
    /// Its slot moves to another master, and stays half moved (migrating, its keys not
    /// yet moved) this long first: a resharding of a slot with many keys.
    HoldSlot(Duration),
}

/// Runs `n` calls (at most 32 at a time, every tenth with an 8 KiB body, answered with
/// that body: a stored body with dedup on, and a stored answer either way) and disrupts
/// partition 0 once a third of them are answered; the last third is called only once the
/// disruption is over. Returns (answered, failed with a typed error, elapsed).
async fn run_with_a_failover(dedup: bool, n: usize, lean: bool) -> (usize, Vec<String>, Duration) {
    run_with(Disruption::KillMaster, dedup, n, lean).await
}

async fn run_with(
    disruption: Disruption,
    dedup: bool,
    n: usize,
    lean: bool,
) -> (usize, Vec<String>, Duration) {
    let mut cluster = match disruption {
        Disruption::KillMaster => replicated_cluster(),
        Disruption::MoveSlot | Disruption::HoldSlot(_) => RedisCluster::start(3),
    };
    let q = QueueConfig::new(
        cluster.cluster_url(),
        pelican_testkit::unique_name("failover"),
    )
    .with_janitor_interval(Duration::from_millis(200))
    .with_partitions(PARTITIONS)
    .with_lean_connections(lean);
    let cfg = fast_consumer().with_claim_idle(Duration::from_millis(1500));
    // Each answers with the request's tag: 8 KiB answers are stored beside the stream
    // and fetched by the producer on connections that must follow the slot too.
    let runs = Runs::default();
    let tag_back = {
        let runs = runs.clone();
        move |r: Req, job: pelican::Job| {
            runs.hit(job.request_id());
            async move { Ok(Resp { i: r.i, by: r.tag }) }
        }
    };
    let w1 = Worker::spawn(&q, cfg.clone(), 4, tag_back.clone()).await;
    let w2 = Worker::spawn(&q, cfg, 4, tag_back).await;
    let p = Producer::<Req, Resp>::connect(q.clone(), producer_config(dedup))
        .await
        .unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let (over, over_rx) = tokio::sync::watch::channel(false);
    let limit = Arc::new(tokio::sync::Semaphore::new(32));
    let mut calls = JoinSet::new();
    let started = Instant::now();
    for i in 0..n as u64 {
        let (p, answered, limit) = (p.clone(), answered.clone(), limit.clone());
        let mut over = over_rx.clone();
        calls.spawn(async move {
            if i >= 2 * n as u64 / 3 {
                over.wait_for(|&o| o).await.expect("the run goes on");
            }
            let _slot = limit.acquire_owned().await.unwrap();
            // Every tenth body is large enough to be stored beside the stream (dedup on)
            // and written on the producer's own connection, which must follow the slot.
            let tag = if i % 10 == 0 {
                "f".repeat(8192)
            } else {
                "f".into()
            };
            let req = Req::new(i, &tag);
            let out = p.call(&req).await;
            if let Ok(r) = &out {
                assert_eq!(r.i, i, "another request's response");
                assert!(r.by == tag, "request {i}: its answer came back changed");
                answered.fetch_add(1, Ordering::SeqCst);
            }
            out.map(|_| ()).map_err(|e| format!("{e:#}"))
        });
    }
    let a2 = answered.clone();
    pelican_testkit::eventually(Duration::from_secs(30), "a third answered", || {
        let a = a2.clone();
        async move { a.load(Ordering::SeqCst) >= n / 3 }
    })
    .await;
    let victim_key = q.partition_keys(0).stream().to_string();
    let cluster = tokio::task::spawn_blocking(move || {
        match disruption {
            Disruption::KillMaster => {
                cluster.kill_master_of(&victim_key);
            }
            Disruption::MoveSlot => {
                let from = cluster.master_of(&victim_key);
                cluster.move_slot_of(&victim_key, (from + 1) % 3);
            }
            Disruption::HoldSlot(hold) => {
                let from = cluster.master_of(&victim_key);
                let moving = cluster.begin_slot_move(&victim_key, (from + 1) % 3);
                // The scenario: the slot stays half moved this long (not a wait for
                // anything to happen).
                std::thread::sleep(hold);
                cluster.finish_slot_move(&moving);
            }
        }
        cluster
    })
    .await
    .expect("disruption");
    over.send_replace(true);
    let mut errors = Vec::new();
    within(Duration::from_secs(90), "every call resolving", async {
        while let Some(r) = calls.join_next().await {
            if let Err(e) = r.expect("call task") {
                errors.push(e);
            }
        }
    })
    .await;
    let elapsed = started.elapsed();
    w1.stop().await;
    w2.stop().await;
    p.shutdown().await.unwrap();
    drop(cluster);
    eprintln!(
        "{disruption:?}, dedup {dedup}, lean {lean}: {} handler runs for {n} requests",
        runs.total()
    );
    (answered.load(Ordering::SeqCst), errors, elapsed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_loses_nothing_with_dedup() {
    killed_master_with_dedup(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_loses_nothing_with_dedup_library_connections() {
    killed_master_with_dedup(false).await;
}

async fn killed_master_with_dedup(lean: bool) {
    let (answered, errors, elapsed) = run_with_a_failover(true, 600, lean).await;
    eprintln!(
        "dedup on, lean {lean}: {answered} answered, {} errors in {elapsed:?}",
        errors.len()
    );
    assert!(errors.is_empty(), "calls failed: {errors:?}");
    assert_eq!(answered, 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_without_dedup_every_call_resolves() {
    killed_master_without_dedup(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_without_dedup_every_call_resolves_library_connections() {
    killed_master_without_dedup(false).await;
}

async fn killed_master_without_dedup(lean: bool) {
    // None hangs: `run_with_a_failover` gives every call 90 s; each one ended with an
    // answer or a typed error.
    let (answered, errors, elapsed) = run_with_a_failover(false, 600, lean).await;
    eprintln!(
        "dedup off, lean {lean}: {answered} answered, {} errors in {elapsed:?}: {errors:?}",
        errors.len()
    );
    assert_eq!(answered + errors.len(), 600);
}

/// A resharding moves partition 0's slot, with its stream, indexes, stored bodies and
/// answers, to another master while 600 calls run: the producers' and consumers' own
/// connections (stored bodies and answers, the reader, the writer) are answered `ASK`,
/// `TRYAGAIN`, then `MOVED`, and must follow the slot. Nothing is lost and every answer
/// comes back intact, dedup on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_mid_run_loses_nothing() {
    every_call_answered_across(Disruption::MoveSlot, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_mid_run_loses_nothing_library_connections() {
    every_call_answered_across(Disruption::MoveSlot, false).await;
}

/// A resharding that takes a while: partition 0's slot stays half moved for 3 s (the
/// source answers `TRYAGAIN` to every script of the partition, `ASK` for keys it does not
/// have), then its keys move. The partition stalls and resumes; nothing is lost and no
/// call fails, dedup on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_half_moved_for_seconds_loses_nothing() {
    every_call_answered_across(Disruption::HoldSlot(Duration::from_secs(3)), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_half_moved_for_seconds_loses_nothing_library_connections() {
    every_call_answered_across(Disruption::HoldSlot(Duration::from_secs(3)), false).await;
}

/// Runs 600 calls across `disruption`, dedup on and then off: every one answered.
async fn every_call_answered_across(disruption: Disruption, lean: bool) {
    for dedup in [true, false] {
        let (answered, errors, elapsed) = run_with(disruption, dedup, 600, lean).await;
        eprintln!(
            "{disruption:?}, dedup {dedup}, lean {lean}: {answered} answered, {} errors in {elapsed:?}",
            errors.len()
        );
        assert!(errors.is_empty(), "dedup {dedup}: calls failed: {errors:?}");
        assert_eq!(answered, 600, "dedup {dedup}");
    }
}

/// Replication is asynchronous: a submission the master acknowledged but had not passed
/// on to its replica is gone after the failover. The producer's sweep finds its request
/// unknown to the new master and submits it again; the caller gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_lost_in_a_failover_is_submitted_again() {
    lost_in_a_failover(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_lost_in_a_failover_is_submitted_again_library_connections() {
    lost_in_a_failover(true, false).await;
}

/// The same without dedup: no index to look up, but the entry is gone from the new
/// master's stream and no outcome came, which the sweep takes for lost (`sweep.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_without_dedup_lost_in_a_failover_is_submitted_again() {
    lost_in_a_failover(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_without_dedup_lost_in_a_failover_is_submitted_again_library_connections() {
    lost_in_a_failover(false, false).await;
}

async fn lost_in_a_failover(dedup: bool, lean: bool) {
    let mut cluster = replicated_cluster();
    let q = QueueConfig::new(cluster.cluster_url(), pelican_testkit::unique_name("lost"))
        .with_janitor_interval(Duration::from_millis(200))
        .with_partitions(PARTITIONS)
        .with_lean_connections(lean);
    let p = Producer::<Req, Resp>::connect(q.clone(), producer_config(dedup))
        .await
        .unwrap();
    let rid = "lost-0";
    let keys = q.partition_keys(q.partition_of(rid));
    // What the request leaves on its partition's master: its index with dedup, else
    // its stream entry (the stream holds no other).
    let key = if dedup {
        keys.req(rid)
    } else {
        keys.stream().to_string()
    };
    let master = cluster.master_of(&key);
    let replicas = cluster.replicas_of(master);
    assert_eq!(replicas.len(), 1, "one replica per master");
    // Cut the replica off: it cannot resync (a wrong masterauth), and its link is
    // killed. What the master acknowledges from now on is never replicated.
    let replica = &cluster.nodes()[replicas[0]];
    assert_eq!(
        replica.cli(&["CONFIG", "SET", "masterauth", "not-the-password"]),
        "OK"
    );
    cluster.nodes()[master].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    let ticket = p.submit_with_id(rid, &Req::new(1, "lost")).await.unwrap();
    assert_eq!(ticket.submitted(), pelican::Submitted::Queued);
    // The master has it; the replica, which is about to be promoted, never heard of it.
    // (Checked here, before the failover: after it, the producer's sweep may already
    // have submitted the request again by the time the test could look.)
    let mut on_replica = replica.sync_connection();
    let _: () = redis::cmd("READONLY").query(&mut on_replica).unwrap();
    // (the stream itself is there without dedup: the producer made its group)
    let seen: i64 = redis::cmd(if dedup { "EXISTS" } else { "XLEN" })
        .arg(&key)
        .query(&mut on_replica)
        .unwrap();
    assert_eq!(seen, 0, "dedup {dedup}: the submission reached the replica");
    drop(on_replica);
    let _cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_master_of(&key);
        cluster
    })
    .await
    .expect("failover");
    // A consumer now: it can only get the request if the producer submits it again.
    let (w, runs) = Worker::counting(&q, fast_consumer(), "heir").await;
    let out = within(Duration::from_secs(30), "the lost request's answer", ticket)
        .await
        .expect("answered after the sweep submitted it again");
    assert_eq!((out.i, out.by.as_str()), (1, "heir"));
    assert_eq!(runs.total(), 1);
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// Identical requests join the one in work across a failover: on a queue of 6 partitions
/// over 3 masters (each with a replica), a request is in work (its handler held by a
/// gate) while two more producers submit it again (joined, not queued); the master of its
/// partition is SIGKILLed and its replica takes over; a fourth producer submits it on
/// the new master (joined again: the index, with its waiters, came over); then the gate
/// opens. One handler run, one stream entry, the same answer for all four callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_join_the_one_in_work_across_a_failover() {
    let mut cluster = replicated_cluster();
    let q = QueueConfig::new(cluster.cluster_url(), pelican_testkit::unique_name("join"))
        .with_janitor_interval(Duration::from_millis(200))
        .with_partitions(PARTITIONS);
    // A lease far longer than the failover: the delivery stays with the consumer that
    // holds it (a reclaim after a lost lease would be a second run by design).
    let cfg = fast_consumer().with_claim_idle(Duration::from_secs(30));
    let (runs, gate) = (Runs::default(), Gate::default());
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (runs, gate) = (runs.clone(), gate.clone());
        workers.push(
            Worker::spawn(&q, cfg.clone(), 4, move |r: Req, job: pelican::Job| {
                let (runs, gate) = (runs.clone(), gate.clone());
                let rid = job.request_id().to_string();
                async move {
                    runs.hit(&rid);
                    gate.wait().await;
                    Ok(Resp {
                        i: r.i,
                        by: format!("solved {rid}"),
                    })
                }
            })
            .await,
        );
    }
    let mut producers = Vec::new();
    for _ in 0..4 {
        producers.push(
            Producer::<Req, Resp>::connect(q.clone(), producer_config(true))
                .await
                .unwrap(),
        );
    }
    let req = Req::new(42, "the same work");
    let first = producers[0].submit(&req).await.unwrap();
    assert_eq!(first.submitted(), pelican::Submitted::Queued);
    let rid = first.request_id().to_string();
    let keys = q.partition_keys(q.partition_of(&rid));
    let stream = keys.stream().to_string();
    let r2 = runs.clone();
    pelican_testkit::eventually(Duration::from_secs(20), "the handler at work", || {
        let r = r2.clone();
        let rid = rid.clone();
        async move { r.get(&rid) == 1 }
    })
    .await;
    // Two producers submit it while it is in work: they join it.
    let mut tickets = vec![first];
    for p in &producers[1..3] {
        let t = p.submit(&req).await.unwrap();
        assert_eq!(t.submitted(), pelican::Submitted::Joined);
        assert_eq!(t.request_id(), rid);
        tickets.push(t);
    }
    // What the master acknowledged has reached its replica (replication is asynchronous:
    // a join it lost would be submitted again by the sweep, which is another test).
    let master = cluster.master_of(&stream);
    let replica = cluster.replicas_of(master)[0];
    let offset = |node: usize, field: &str| -> u64 {
        let info = cluster.nodes()[node].cli(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{field}:"))?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {info}"))
    };
    let written = offset(master, "master_repl_offset");
    pelican_testkit::eventually_sync(Duration::from_secs(10), "the replica in sync", || {
        offset(replica, "slave_repl_offset") >= written
    });
    let victim = stream.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_master_of(&victim);
        cluster
    })
    .await
    .expect("failover");
    assert_ne!(cluster.master_of(&stream), master, "the replica took over");
    // On the new master: still in work, so a fourth producer joins it too.
    let t = producers[3].submit(&req).await.unwrap();
    assert_eq!(
        t.submitted(),
        pelican::Submitted::Joined,
        "after the failover"
    );
    tickets.push(t);
    assert_eq!(runs.get(&rid), 1, "not run again while in work");
    gate.open();
    let mut answers = Vec::new();
    for t in tickets {
        answers.push(
            within(Duration::from_secs(60), "every caller's answer", t)
                .await
                .expect("answered"),
        );
    }
    for a in &answers {
        assert_eq!((a.i, a.by.as_str()), (42, format!("solved {rid}").as_str()));
    }
    assert_eq!(runs.total(), 1, "one handler run: {:?}", runs.snapshot());
    let mut probe = redis::cluster::ClusterClient::new(
        cluster
            .nodes()
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.url())
            .collect::<Vec<_>>(),
    )
    .unwrap()
    .get_async_connection()
    .await
    .unwrap();
    let info: redis::Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(&stream)
        .query_async(&mut probe)
        .await
        .unwrap();
    let added = pelican_testkit::info_int(&info, "entries-added");
    assert_eq!(added, Some(1), "one stream entry for the four submissions");
    for w in workers {
        w.stop().await;
    }
    for p in producers {
        p.shutdown().await.unwrap();
    }
    drop(cluster);
}
