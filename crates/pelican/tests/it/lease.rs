//! Invariant 5, leases: a live consumer working longer than claim_idle keeps its
//! lease; a consumer that lost its lease learns it.

use crate::common::*;
use pelican::{Consumer, Producer};
use pelican_testkit::RedisServer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Handlers three times slower than claim_idle, three consumers all reclaiming:
/// every request runs exactly once, and no handler is told its lease was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv5_lease_kept_by_a_live_slow_consumer() {
    let server = RedisServer::start();
    let q = queue(&server, "inv5");
    let probe = Probe::new(&server, &q).await;
    let claim_idle = Duration::from_millis(700);
    let work = claim_idle * 3;
    let runs = Runs::default();
    let lost = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (runs, lost) = (runs.clone(), lost.clone());
        workers.push(
            Worker::spawn(
                &q,
                fast_consumer().with_claim_idle(claim_idle),
                2,
                move |r: Req, job| {
                    let (runs, lost) = (runs.clone(), lost.clone());
                    async move {
                        runs.hit(job.request_id());
                        tokio::time::sleep(work).await;
                        if job.is_lease_lost() {
                            lost.store(true, Ordering::SeqCst);
                        }
                        Ok(echo(&r, "slow"))
                    }
                },
            )
            .await,
        );
    }
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let started = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..4 {
        let p = p.clone();
        calls.spawn(async move { p.call(&Req::new(i, "slow")).await });
    }
    while let Some(r) = calls.join_next().await {
        assert_eq!(r.unwrap().unwrap().by, "slow");
    }
    assert!(started.elapsed() >= work);
    let runs = runs.snapshot();
    assert_eq!(runs.len(), 4);
    assert!(runs.values().all(|n| *n == 1), "redelivered: {runs:?}");
    assert!(!lost.load(Ordering::SeqCst), "a live consumer lost a lease");
    for w in workers {
        w.stop().await;
    }
    assert_eq!(probe.pending().await, 0);
}

/// The caller gives up (drops its ticket): the request is withdrawn and the consumer
/// working on it sees its lease lost; its answer is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv5_lease_lost_when_the_request_is_withdrawn() {
    let server = RedisServer::start();
    let q = queue(&server, "inv5b");
    let probe = Probe::new(&server, &q).await;
    let mut c = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(1, "withdrawn");
    let ticket = p.submit(&req).await.unwrap();
    let rid = ticket.request_id().to_string();
    let d = within(Duration::from_secs(5), "the delivery", c.next())
        .await
        .unwrap()
        .unwrap();
    let job = d.job().clone();
    assert!(!job.is_lease_lost());
    drop(ticket);
    within(
        Duration::from_secs(5),
        "the lease lost",
        job.lease_lost().cancelled(),
    )
    .await;
    assert!(!d.respond(&echo(&req, "late")).await.unwrap());
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    assert!(
        probe.get(&probe.req(&rid)).await.is_none(),
        "withdrawn: no index, no outcome"
    );
}

/// Another consumer takes the entry over (XCLAIM by a raw client, as a reclaim
/// after a stall would): the first one sees its lease lost within a renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv5_lease_lost_when_the_entry_is_taken_over() {
    let server = RedisServer::start();
    let q = queue(&server, "inv5c");
    let probe = Probe::new(&server, &q).await;
    let mut c = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(2, "stolen");
    let ticket = p.submit(&req).await.unwrap();
    let d = within(Duration::from_secs(5), "the delivery", c.next())
        .await
        .unwrap()
        .unwrap();
    let job = d.job().clone();
    let stolen: Vec<String> = probe
        .query(
            redis::cmd("XCLAIM")
                .arg(probe.stream())
                .arg(GROUP)
                .arg("thief")
                .arg(0)
                .arg(job.entry_id())
                .arg("JUSTID"),
        )
        .await;
    assert_eq!(stolen, vec![job.entry_id().to_string()]);
    within(
        Duration::from_secs(5),
        "the lease lost",
        job.lease_lost().cancelled(),
    )
    .await;
    // The thief never answers, so this is still the first outcome: it is recorded.
    assert!(d.respond(&echo(&req, "first")).await.unwrap());
    assert_eq!(ticket.await.unwrap(), echo(&req, "first"));
    assert_eq!(probe.pending().await, 0);
}
