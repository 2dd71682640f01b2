//! `Consumer::serve`: at most `concurrency` handlers at once, and every way a handler
//! can end (a response, a failure, a retry, a retry after a delay, a panic) reaches the
//! caller or comes back for another delivery.

use crate::common::*;
use pelican::{Consumer, ErrorKind, HandlerError, Producer};
use pelican_testkit::RedisServer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the handler does with request `i` on its first delivery (later ones answer).
fn first_try(i: u64) -> &'static str {
    match i % 5 {
        1 => "panic",
        2 => "retry",
        3 => "fail",
        4 => "retry later",
        _ => "answer",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_at_most_concurrency_handlers_and_every_ending_reaches_the_caller() {
    const CONCURRENCY: usize = 3;
    let server = RedisServer::start();
    let q = queue(&server, "serve");
    let consumer = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let stop = consumer.stopper();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let deliveries: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let (r, m, d) = (running.clone(), most.clone(), deliveries.clone());
    let w = tokio::spawn(consumer.serve(CONCURRENCY, move |req: Req, _| {
        let (running, most, deliveries) = (r.clone(), m.clone(), d.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // Simulated work, so that handlers overlap.
            tokio::time::sleep(Duration::from_millis(5)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            let n = {
                let mut d = deliveries.lock().unwrap();
                let n = d.entry(req.i).or_default();
                *n += 1;
                *n
            };
            match (first_try(req.i), n) {
                ("fail", _) => Err(HandlerError::fail(format!("no {}", req.i))),
                ("panic", 1) => panic!("a handler panics on request {}", req.i),
                ("retry", 1) => Err(HandlerError::retry("not now")),
                ("retry later", 1) => Err(HandlerError::RetryAfter(
                    Duration::from_millis(50),
                    "later".into(),
                )),
                _ => Ok(echo(&req, "w")),
            }
        }
    }));
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let calls = (0..40u64).map(|i| {
        let p = &p;
        async move { (i, p.call(&Req::new(i, "serve")).await) }
    });
    let results = within(
        Duration::from_secs(60),
        "every call answered",
        futures_util::future::join_all(calls),
    )
    .await;
    for (i, r) in results {
        match first_try(i) {
            "fail" => {
                let e = r.expect_err("a failed request fails its caller");
                assert_eq!(e.kind(), ErrorKind::Remote, "{i}: {e:#}");
                assert!(e.message().contains(&format!("no {i}")), "{i}: {e:#}");
            }
            _ => assert_eq!(r.unwrap(), echo(&Req::new(i, "serve"), "w"), "{i}"),
        }
    }
    let deliveries = deliveries.lock().unwrap().clone();
    for i in 0..40u64 {
        let want = match first_try(i) {
            "panic" | "retry" | "retry later" => 2,
            _ => 1,
        };
        assert_eq!(deliveries.get(&i), Some(&want), "deliveries of request {i}");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (2..=CONCURRENCY).contains(&most),
        "{most} handlers ran at once (concurrency {CONCURRENCY})"
    );
    stop.stop();
    w.await.unwrap().unwrap();
}
