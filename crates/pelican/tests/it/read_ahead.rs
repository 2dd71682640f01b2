//! Reading ahead (docs/PROTOCOL.md, "Connections and tasks"): a consumer of a queue of one
//! partition, all its slots held, reads as many new entries as the outcome writer's call
//! on the wire will free, so the next work arrives while that call is on its way back.
//! Its deliveries stay within `prefetch`, its pending list within one call's worth more.

use crate::common::*;
use pelican::{Producer, Submitted};
use pelican_testkit::RedisServer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PREFETCH: usize = 4;
const REQUESTS: u64 = 300;

/// A backlog of quick requests through a consumer with 4 slots: every request answered
/// once, entries read ahead of the completions that freed their slots (counted), and the
/// group's pending list never holds more for it than twice its slots, sampled every
/// millisecond throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_read_ahead_of_each_completion_within_twice_the_slots() {
    install_counters();
    let server = RedisServer::start();
    let q = queue(&server, "ahead");
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..REQUESTS {
        let t = p.submit(&Req::new(i, "ahead")).await.unwrap();
        assert_eq!(t.submitted(), Submitted::Queued);
        tickets.push(t);
    }
    // The group's pending count, sampled until the run ends.
    let probe = Probe::new(&server, &q).await;
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, most) = (done.clone(), most.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                most.fetch_max(probe.pending().await, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let (w, runs) = Worker::counting(&q, fast_consumer().with_prefetch(PREFETCH), "ahead").await;
    for (i, t) in tickets.into_iter().enumerate() {
        let out = within(Duration::from_secs(30), "an answer", t)
            .await
            .expect("answered");
        assert_eq!(out, echo(&Req::new(i as u64, "ahead"), "ahead"));
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    assert_eq!(runs.total(), REQUESTS as u32, "each handled once");
    assert!(
        runs.snapshot().values().all(|&n| n == 1),
        "none handled twice"
    );
    let ahead = counter("pelican_deliveries_read_ahead_total", &[("queue", &q.name)]);
    assert!(ahead > 0, "no entry was read ahead");
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 2 * PREFETCH as u64,
        "the pending list held {most} entries for a consumer of {PREFETCH} slots"
    );
    w.stop().await;
    p.shutdown().await.unwrap();
}
