//! Invariants 1 (no hang) and 2 (one outcome).

use crate::common::*;
use pelican::{Consumer, ErrorKind, Producer, Submitted};
use pelican_testkit::{eventually, Proxy, RedisServer};
use std::time::{Duration, Instant};

use super::SLACK;

// ---- 1. No hang ----------------------------------------------------------------

/// Nobody serves the queue: the caller gets a typed timeout after request_timeout,
/// and the withdrawn request leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv1_no_hang_without_consumers() {
    let server = RedisServer::start();
    let q = queue(&server, "inv1");
    let probe = Probe::new(&server, &q).await;
    let timeout = Duration::from_secs(1);
    let p =
        Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_request_timeout(timeout))
            .await
            .unwrap();
    let started = Instant::now();
    let e = within(
        timeout + SLACK,
        "the timeout",
        p.call(&Req::new(1, "nobody")),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_timeout() && e.is_retryable());
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    eventually(Duration::from_secs(5), "the request withdrawn", || async {
        probe.xlen().await == 0 && probe.pending_index_keys().await.is_empty()
    })
    .await;
}

/// A consumer takes the request and holds it without ever answering (alive, so it
/// keeps its lease): the caller still gets a typed timeout, and the withdrawal tells
/// the holder its lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv1_no_hang_when_the_holder_never_answers() {
    let server = RedisServer::start();
    let q = queue(&server, "inv1b");
    let timeout = Duration::from_millis(1500);
    let mut holder = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let p =
        Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_request_timeout(timeout))
            .await
            .unwrap();
    let started = Instant::now();
    let ticket = p.submit(&Req::new(2, "held")).await.unwrap();
    let d = within(Duration::from_secs(5), "the delivery", holder.next())
        .await
        .unwrap()
        .unwrap();
    let job = d.job().clone();
    let e = within(timeout + SLACK, "the timeout", ticket)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() >= timeout);
    // held past claim_idle (600 ms) without losing the lease to anybody...
    assert_eq!(job.delivery_count(), 1);
    // ...until the request was withdrawn
    within(
        Duration::from_secs(5),
        "the holder's lease lost",
        job.lease_lost().cancelled(),
    )
    .await;
    assert!(!d
        .respond(&echo(&Req::new(2, "held"), "late"))
        .await
        .unwrap());
}

// ---- 2. One outcome ------------------------------------------------------------

/// Consumer A takes a request and is cut off from Redis (its lease renewals stall in
/// a blackholed proxy) past claim_idle; B takes the request over and answers. When A
/// comes back its answer is dropped: `respond` returns false, the caller saw B's
/// answer only, the stored outcome is B's and no second reply was pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_one_outcome_late_duplicate_is_dropped() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let q = queue(&server, "inv2");
    let probe = Probe::new(&server, &q).await;
    let mut qa = q.clone();
    qa.url = proxy.url();
    let mut a = Consumer::<Req, Resp>::connect(qa, fast_consumer().with_name("A"))
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(3, "twice");
    let ticket = p.submit(&req).await.unwrap();
    let rid = ticket.request_id().to_string();
    let da = within(Duration::from_secs(5), "A's delivery", a.next())
        .await
        .unwrap()
        .unwrap();
    let job_a = da.job().clone();
    proxy.set_blackhole(true);

    let runs = Runs::default();
    let deliveries = Runs::default();
    let (r2, d2) = (runs.clone(), deliveries.clone());
    let b = Worker::spawn(&q, fast_consumer().with_name("B"), 4, move |r: Req, job| {
        let (runs, deliveries) = (r2.clone(), d2.clone());
        async move {
            runs.hit(job.request_id());
            deliveries.hit(&job.delivery_count().to_string());
            Ok(echo(&r, "B"))
        }
    })
    .await;
    let got = within(Duration::from_secs(10), "B's answer", ticket)
        .await
        .unwrap();
    assert_eq!(got, echo(&req, "B"));
    let outcome_b = probe.get(&probe.req(&rid)).await.expect("outcome cached");
    let replies = probe.entries_added_to(&probe.reply(p.id())).await;

    proxy.set_blackhole(false);
    within(
        Duration::from_secs(5),
        "A learning it lost the lease",
        job_a.lease_lost().cancelled(),
    )
    .await;
    let recorded = da.respond(&echo(&req, "A")).await.unwrap();
    assert!(!recorded, "A's late answer must be dropped");
    assert_eq!(probe.get(&probe.req(&rid)).await, Some(outcome_b));
    assert_eq!(
        probe.entries_added_to(&probe.reply(p.id())).await,
        replies,
        "the late answer was pushed to the caller"
    );
    // Asking again is answered from the cache: B's answer.
    let again = p.submit(&req).await.unwrap();
    assert_eq!(again.submitted(), Submitted::Cached);
    assert_eq!(again.await.unwrap(), echo(&req, "B"));
    assert_eq!(runs.get(&rid), 1);
    assert_eq!(deliveries.get("2"), 1, "B got it as the second delivery");
    b.stop().await;
}
