//! `Consumer::serve`: at most `concurrency` handlers at once, and every way a handler
//! can end (a response, a failure, a retry, a retry after a delay, a panic, a `?` on its
//! own error) reaches the caller or comes back for another delivery; `Queue`, the typed
//! handle both sides are made from.

use crate::common::*;
use pelican::{Consumer, ErrorKind, HandlerError, HandlerResultExt, Producer, Queue};
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

/// What the `?` test's handler does with request `i`.
fn question_mark(i: u64) -> &'static str {
    match i % 4 {
        0 => "? once",
        1 => "or_fail",
        2 => "or_retry_after once",
        _ => "? always",
    }
}

/// A handler's own errors under `?`: a bare `?` retries (request answered on its second
/// delivery; one that always errs is dead-lettered after `max_deliveries`, its caller gets
/// `Dead`), `.or_fail()?` fails for good (caller gets `Remote` with the error's message,
/// one delivery), `.or_retry_after(d)?` retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_uses_question_mark_on_its_own_errors() {
    let server = RedisServer::start();
    let queue = Queue::<Req, Resp>::new(queue(&server, "question-mark"));
    let runs: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let r = runs.clone();
    let worker = queue
        .serve(
            fast_consumer().with_max_deliveries(2),
            4,
            move |req: Req, job| {
                let runs = r.clone();
                async move {
                    *runs.lock().unwrap().entry(req.i).or_default() += 1;
                    let first = job.delivery_count() == 1;
                    match question_mark(req.i) {
                        "? once" if first => {
                            std::fs::read("/nonexistent/pelican-question-mark")?;
                        }
                        "or_fail" => {
                            let n: u64 = format!("x{}", req.i).parse().or_fail()?;
                            return Ok(Resp {
                                i: n,
                                by: "?".into(),
                            });
                        }
                        "or_retry_after once" if first => {
                            Err::<(), _>(std::io::Error::other("busy"))
                                .or_retry_after(Duration::from_millis(50))?;
                        }
                        "? always" => {
                            Err::<(), _>(std::io::Error::other(format!("never {}", req.i)))?;
                        }
                        _ => {}
                    }
                    Ok(echo(&req, "w"))
                }
            },
        )
        .await
        .unwrap();
    let p = queue.producer(fast_producer()).await.unwrap();
    let calls = (0..12u64).map(|i| {
        let p = &p;
        async move { (i, p.call(&Req::new(i, "question-mark")).await) }
    });
    let results = within(
        Duration::from_secs(60),
        "every call answered",
        futures_util::future::join_all(calls),
    )
    .await;
    for (i, r) in results {
        match question_mark(i) {
            "or_fail" => {
                let e = r.expect_err("an error under .or_fail()? fails the caller");
                assert_eq!(e.kind(), ErrorKind::Remote, "{i}: {e:#}");
                assert!(e.message().contains("invalid digit"), "{i}: {e:#}");
            }
            "? always" => {
                let e = r.expect_err("a request that always errs is dead-lettered");
                assert_eq!(e.kind(), ErrorKind::Dead, "{i}: {e:#}");
            }
            _ => assert_eq!(r.unwrap(), echo(&Req::new(i, "question-mark"), "w"), "{i}"),
        }
    }
    let runs = runs.lock().unwrap().clone();
    for i in 0..12u64 {
        let want = match question_mark(i) {
            "or_fail" => 1,
            _ => 2,
        };
        assert_eq!(runs.get(&i), Some(&want), "handler runs of request {i}");
    }
    let dead = queue.admin().await.unwrap().dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 3, "{dead:?}");
    worker.stop().await.unwrap();
    p.shutdown().await.unwrap();
}

/// `Queue` makes both sides with its types: a consumer taking deliveries one by one, a
/// producer, a worker that stops gracefully; what one submits the other answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_handle_makes_both_sides() {
    let server = RedisServer::start();
    let queue = Queue::<Req, Resp>::new(queue(&server, "typed"));
    let p = queue.producer(fast_producer()).await.unwrap();

    // One by one: a consumer from the handle.
    let mut c = queue.consumer(fast_consumer()).await.unwrap();
    let ticket = p.submit(&Req::new(1, "typed")).await.unwrap();
    let d = within(Duration::from_secs(10), "a delivery", c.next())
        .await
        .unwrap()
        .expect("a delivery");
    assert_eq!(d.request(), &Req::new(1, "typed"));
    let resp = echo(d.request(), "next");
    assert!(d.respond(&resp).await.unwrap());
    assert_eq!(ticket.await.unwrap(), resp);
    c.shutdown().await.unwrap();

    // A worker from the handle, on a clone of it.
    let worker = queue
        .clone()
        .serve(
            fast_consumer().with_name("typed-worker"),
            2,
            |req: Req, _| async move { Ok(echo(&req, "worker")) },
        )
        .await
        .unwrap();
    assert_eq!(worker.name(), "typed-worker");
    let out = p.call(&Req::new(2, "typed")).await.unwrap();
    assert_eq!(out, echo(&Req::new(2, "typed"), "worker"));
    within(Duration::from_secs(10), "the worker stops", worker.stop())
        .await
        .unwrap();
    let stats = queue.admin().await.unwrap().stats().await.unwrap();
    assert_eq!(stats.pending, 0, "{stats:?}");
    p.shutdown().await.unwrap();
}
