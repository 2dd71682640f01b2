//! Invariant 4: recovery of idle work, bounded by max_deliveries.

use crate::common::*;
use pelican::{Admin, Consumer, ErrorKind, Producer};
use pelican_testkit::RedisServer;
use std::time::{Duration, Instant};

use super::SLACK;

/// A consumer dies holding a request: after claim_idle another one gets it as its
/// second delivery and the caller gets that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_redelivers_after_claim_idle() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4");
    let claim_idle = Duration::from_millis(600);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut dier = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone())
        .await
        .unwrap();
    let req = Req::new(5, "recover");
    // the entry's idle time starts when it is delivered, after this
    let submitted = Instant::now();
    let ticket = p.submit(&req).await.unwrap();
    let d1 = within(Duration::from_secs(5), "the first delivery", dier.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d1.job().delivery_count(), 1);
    die(dier, d1);

    let mut heir = Consumer::<Req, Resp>::connect(q.clone(), cfg)
        .await
        .unwrap();
    let d2 = within(claim_idle + SLACK, "the redelivery", heir.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        submitted.elapsed() >= claim_idle,
        "redelivered {:?} after submission, before claim_idle",
        submitted.elapsed()
    );
    assert_eq!(d2.job().delivery_count(), 2);
    assert_eq!(d2.request(), &req);
    assert!(d2.respond(&echo(&req, "heir")).await.unwrap());
    assert_eq!(ticket.await.unwrap(), echo(&req, "heir"));
}

/// A request whose consumers keep dying is dead-lettered after max_deliveries: the
/// caller gets a Dead error, the dead letter says why, and the consumer that buried
/// it goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_dead_letters_past_max_deliveries() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4b");
    let probe = Probe::new(&server, &q).await;
    let cfg = fast_consumer().with_max_deliveries(2);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(6, "poison");
    let ticket = p.submit(&req).await.unwrap();
    let rid = ticket.request_id().to_string();
    let mut last = String::new();
    for n in 1..=2 {
        let mut c = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone())
            .await
            .unwrap();
        let d = within(Duration::from_secs(5), "a delivery", c.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.job().delivery_count(), n);
        last = c.name().to_string();
        die(c, d);
    }
    let (w, runs) = Worker::counting(&q, cfg, "survivor").await;
    let e = within(Duration::from_secs(5), "the dead letter", ticket)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Dead, "{e}");
    assert!(e.message().contains("max_deliveries"), "{e}");
    let admin = Admin::connect(q.clone()).await.unwrap();
    let dead = admin.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].rid.as_deref(), Some(rid.as_str()));
    assert_eq!(dead[0].deliveries, 2);
    assert_eq!(dead[0].consumer, last);
    assert!(dead[0].reason.contains("max_deliveries"), "{:?}", dead[0]);
    assert_eq!(runs.get(&rid), 0, "a dead request must not run again");
    // the consumer goes on serving
    let next = Req::new(7, "fine");
    assert_eq!(p.call(&next).await.unwrap(), echo(&next, "survivor"));
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    w.stop().await;
}

/// A handler that asks for a retry gets the request again at once (claim_idle is
/// 30 s here), as the next delivery; one that keeps asking, or keeps panicking, is
/// dead-lettered after max_deliveries and its caller gets a Dead error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_retries_are_counted_and_bounded() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4c");
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer()
        .with_claim_idle(claim_idle)
        .with_max_deliveries(3);
    let deliveries = Runs::default();
    let d2 = deliveries.clone();
    let w = Worker::spawn(&q, cfg, 4, move |r: Req, job| {
        let deliveries = d2.clone();
        async move {
            let n = job.delivery_count();
            deliveries.hit(&format!("{} {n}", r.tag));
            match (r.tag.as_str(), n) {
                ("once", 1) | ("always", _) => Err(pelican::HandlerError::retry("not now")),
                ("panics", _) => panic!("a handler bug"),
                _ => Ok(echo(&r, "w")),
            }
        }
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let started = Instant::now();
    let once = Req::new(1, "once");
    assert_eq!(p.call(&once).await.unwrap(), echo(&once, "w"));
    for tag in ["always", "panics"] {
        let e = p.call(&Req::new(2, tag)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Dead, "{tag}: {e}");
        assert!(e.message().contains("max_deliveries"), "{tag}: {e}");
    }
    assert!(
        started.elapsed() < claim_idle / 3,
        "retries must not wait for claim_idle: {:?}",
        started.elapsed()
    );
    let mut seen: Vec<(String, u32)> = deliveries.snapshot().into_iter().collect();
    seen.sort();
    let expected: Vec<(String, u32)> = [
        "always 1", "always 2", "always 3", "once 1", "once 2", "panics 1", "panics 2", "panics 3",
    ]
    .iter()
    .map(|s| (s.to_string(), 1))
    .collect();
    assert_eq!(seen, expected, "each delivery once, counted");
    w.stop().await;
}
