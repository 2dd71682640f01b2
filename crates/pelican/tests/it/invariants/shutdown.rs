//! Invariant 8: graceful shutdown.

use crate::common::*;
use pelican::{Consumer, ErrorKind, Producer, Submitted};
use pelican_testkit::{eventually, RedisServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A consumer shuts down with requests in its hands: the short ones are finished,
/// the ones still running at shutdown_timeout and the ones read ahead are released
/// and finished by the next consumer at once, long before claim_idle (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_graceful_shutdown_loses_nothing() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8");
    let probe = Probe::new(&server, &q).await;
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    // A: requests tagged "long" take far longer than its shutdown timeout
    let a = Worker::spawn(
        &q,
        cfg.clone()
            .with_name("A")
            .with_prefetch(8)
            .with_shutdown_timeout(Duration::from_millis(500)),
        4,
        move |r: Req, job| {
            let started = s2.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let work = if r.tag == "long" {
                    Duration::from_secs(60)
                } else {
                    Duration::from_millis(200)
                };
                let lost = job.lease_lost();
                tokio::select! {
                    _ = tokio::time::sleep(work) => Ok(echo(&r, "A")),
                    _ = lost.cancelled() => Err(pelican::HandlerError::retry("cancelled")),
                }
            }
        },
    )
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..8 {
        let tag = if i % 2 == 0 { "long" } else { "short" };
        tickets.push((i, tag, p.submit(&Req::new(i, tag)).await.unwrap()));
    }
    // A holds all 8: 4 in its handlers, 4 read ahead
    eventually(
        Duration::from_secs(5),
        "A working on 4 requests",
        || async { started.load(Ordering::SeqCst) == 4 && probe.pending().await == 8 },
    )
    .await;
    let stopping = Instant::now();
    a.stop().await;
    let b = Worker::spawn(&q, cfg.with_name("B"), 8, |r: Req, _| async move {
        Ok(echo(&r, "B"))
    })
    .await;
    let mut by_a = 0;
    for (i, tag, t) in tickets {
        let resp = within(Duration::from_secs(10), "an answer", t)
            .await
            .unwrap();
        assert_eq!(resp.i, i);
        if tag == "long" {
            assert_eq!(resp.by, "B", "request {i} cannot have finished on A");
        }
        if resp.by == "A" {
            by_a += 1;
        }
    }
    assert!(by_a >= 2, "A finishes the short requests it was running");
    assert!(
        stopping.elapsed() < claim_idle / 3,
        "released work must not wait for claim_idle: {:?}",
        stopping.elapsed()
    );
    b.stop().await;
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    // A kept the released entries (backdated) until B took them, so it could not
    // leave the group itself; it owns nothing now and the janitor removes it later.
    assert!(
        probe.consumers().await.iter().all(|(_, owned)| *owned == 0),
        "{:?}",
        probe.consumers().await
    );
}

/// Same, with the next consumer already running when A shuts down (a rolling
/// restart): it takes the released work promptly, long before claim_idle (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_graceful_shutdown_hands_work_to_a_running_consumer() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8b");
    let probe = Probe::new(&server, &q).await;
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let mut a = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone().with_name("A"))
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..4 {
        tickets.push(p.submit(&Req::new(i, "handover")).await.unwrap());
    }
    // A takes one into its hands and has read the others ahead
    let d = within(Duration::from_secs(5), "A's delivery", a.next())
        .await
        .unwrap()
        .unwrap();
    eventually(Duration::from_secs(5), "A holding all 4", || async {
        probe.pending().await == 4
    })
    .await;
    let b = Worker::spawn(&q, cfg.with_name("B"), 8, |r: Req, _| async move {
        Ok(echo(&r, "B"))
    })
    .await;
    let stopping = Instant::now();
    drop(d); // given back unanswered
    a.shutdown().await.unwrap();
    for t in tickets {
        let resp = within(claim_idle / 3, "an answer from B", t).await.unwrap();
        assert_eq!(resp.by, "B");
    }
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "released work must be taken promptly: {:?}",
        stopping.elapsed()
    );
    b.stop().await;
    assert_eq!(probe.pending().await, 0);
}

/// A producer shuts down with calls waiting: its callers get Cancelled at once, the
/// request only it waited for is withdrawn, the one another producer joined is not
/// and is answered for that producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_producer_shutdown_cancels_its_calls_and_withdraws_only_its_own() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8c");
    let probe = Probe::new(&server, &q).await;
    let p1 = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let p2 = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let (alone, shared) = (Req::new(1, "alone"), Req::new(2, "shared"));
    let a = p1.submit(&alone).await.unwrap();
    let alone_rid = a.request_id().to_string();
    let b1 = p1.submit(&shared).await.unwrap();
    let b2 = p2.submit(&shared).await.unwrap();
    assert_eq!(b2.submitted(), Submitted::Joined);
    assert_eq!(probe.xlen().await, 2);
    p1.shutdown().await.unwrap();
    for t in [a, b1] {
        let e = within(Duration::from_secs(1), "a cancellation", t)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    }
    assert_eq!(probe.xlen().await, 1, "only the shared request is left");
    assert!(probe.get(&probe.req(&alone_rid)).await.is_none());
    let (w, runs) = Worker::counting(&q, fast_consumer(), "w").await;
    assert_eq!(
        within(Duration::from_secs(5), "the shared answer", b2)
            .await
            .unwrap(),
        echo(&shared, "w")
    );
    assert_eq!(runs.total(), 1, "the withdrawn request never ran");
    w.stop().await;
}
