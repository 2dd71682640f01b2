//! Options of one call (`CallOptions`: its timeout, its request id), detached tickets and
//! `Producer::watch`: what the HTTP gateway builds on.

use crate::common::*;
use pelican::{CallOptions, Consumer, ErrorKind, HandlerError, Producer, Submitted};
use pelican_testkit::RedisServer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn slow_producer() -> pelican::ProducerConfig {
    fast_producer().with_request_timeout(Duration::from_secs(60))
}

/// Serves `q` with a handler that counts its runs and answers `{i, by: tag}`, or fails
/// requests tagged "fail".
fn serve(
    q: &pelican::QueueConfig,
    runs: Arc<AtomicU64>,
) -> (
    pelican::Stopper,
    tokio::task::JoinHandle<pelican::Result<()>>,
) {
    let q = q.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let task = tokio::spawn(async move {
        let consumer = Consumer::<Req, Resp>::connect(q, fast_consumer())
            .await
            .unwrap();
        tx.send(consumer.stopper()).unwrap();
        consumer
            .serve(4, move |r: Req, _| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if r.tag == "fail" {
                        return Err(HandlerError::fail("no such photo"));
                    }
                    Ok(Resp { i: r.i, by: r.tag })
                }
            })
            .await
    });
    let stop = loop {
        if let Ok(s) = rx.try_recv() {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (stop, task)
}

/// The index value of request `rid` (`P<entry>;<deadline>;<waiters>` or an outcome).
fn index_value(server: &RedisServer, q: &pelican::QueueConfig, rid: &str) -> Option<String> {
    let mut c = server.sync_connection();
    redis::cmd("GET")
        .arg(q.keys().req(rid))
        .query(&mut c)
        .unwrap()
}

/// A call's own timeout bounds its wait and is its request's deadline in the queue,
/// whatever the producer's `request_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_has_its_own_timeout_and_deadline() {
    let server = RedisServer::start();
    let q = queue(&server, "per-call-timeout");
    let p = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let ticket = p
        .submit_with(
            &Req::new(1, "a"),
            CallOptions::new().with_timeout(Duration::from_millis(400)),
        )
        .await
        .unwrap();
    let rid = ticket.request_id().to_string();
    let v = index_value(&server, &q, &rid).expect("indexed");
    let deadline: u64 = v.split(';').nth(1).unwrap().parse().unwrap();
    assert!(
        deadline <= now_ms() + 400,
        "deadline {deadline} is the call's: {v}"
    );
    let started = Instant::now();
    let err = ticket.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(err.message().contains("400ms"), "{err}");
    let zero = p
        .call_with(
            &Req::new(2, "a"),
            CallOptions::new().with_timeout(Duration::ZERO),
        )
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config);
    let bad = p
        .call_with(&Req::new(2, "a"), CallOptions::new().with_request_id(""))
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::Config);
}

/// A caller-chosen id is the dedup key: two bodies under one id are one request, solved
/// once, with the first body's answer for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_chosen_id_is_the_dedup_key() {
    let server = RedisServer::start();
    let q = queue(&server, "per-call-id");
    let p = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let p2 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let first = p
        .submit_with(
            &Req::new(1, "first"),
            CallOptions::new().with_request_id("order-7"),
        )
        .await
        .unwrap();
    let second = p2
        .submit_with(
            &Req::new(1, "retried"),
            CallOptions::new().with_request_id("order-7"),
        )
        .await
        .unwrap();
    assert_eq!(second.submitted(), Submitted::Joined);
    assert_eq!(second.request_id(), "order-7");
    let runs = Arc::new(AtomicU64::new(0));
    let (stop, w) = serve(&q, runs.clone());
    assert_eq!(first.await.unwrap().by, "first");
    assert_eq!(second.await.unwrap().by, "first");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    stop.stop();
    w.await.unwrap().unwrap();
}

/// A detached request is not withdrawn when its producer shuts down; another producer
/// finds it by its id with `watch`, waits for it while it is in work (a watch that
/// gives up withdraws nothing), and finds its outcome once it is finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_request_runs_and_is_watched_by_id() {
    let server = RedisServer::start();
    let q = queue(&server, "per-call-detach");
    let p1 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let ticket = p1
        .submit_with(
            &Req::new(5, "kept"),
            CallOptions::new().with_timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let rid = ticket.detach();
    p1.shutdown().await.unwrap();
    assert!(index_value(&server, &q, &rid).is_some_and(|v| v.starts_with('P')));

    let p2 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    assert!(p2
        .watch("never-submitted", Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
    // In flight, nobody serves it yet: the watch gives up, the request stays.
    let w = p2
        .watch(&rid, Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.submitted(), Submitted::Joined);
    assert_eq!(w.await.unwrap_err().kind(), ErrorKind::Timeout);
    // Dropping a watch withdraws nothing either.
    drop(
        p2.watch(&rid, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(index_value(&server, &q, &rid).is_some_and(|v| v.starts_with('P')));

    let waiting = p2
        .watch(&rid, Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let (stop, worker) = serve(&q, runs.clone());
    assert_eq!(
        waiting.await.unwrap(),
        Resp {
            i: 5,
            by: "kept".into()
        }
    );
    // Finished: a third producer gets the recorded outcome at once.
    let p3 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let cached = p3
        .watch(&rid, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cached.submitted(), Submitted::Cached);
    assert_eq!(cached.await.unwrap().i, 5);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    stop.stop();
    worker.await.unwrap().unwrap();
}

/// A recorded failure is what a watch gets, like the call that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_finds_a_recorded_failure() {
    let server = RedisServer::start();
    let q = queue(&server, "per-call-fail");
    let runs = Arc::new(AtomicU64::new(0));
    let (stop, worker) = serve(&q, runs.clone());
    let p = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let t = p.submit(&Req::new(9, "fail")).await.unwrap();
    let rid = t.request_id().to_string();
    assert_eq!(t.await.unwrap_err().kind(), ErrorKind::Remote);
    let p2 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    let w = p2
        .watch(&rid, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.submitted(), Submitted::Cached);
    let err = w.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert_eq!(err.message(), "no such photo");
    stop.stop();
    worker.await.unwrap().unwrap();
}

/// Without dedup there is no index: nothing to watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dedup_there_is_nothing_to_watch() {
    let server = RedisServer::start();
    let q = queue(&server, "per-call-nodedup");
    let p = Producer::<Req, Resp>::connect(q.clone(), slow_producer().with_dedup(false))
        .await
        .unwrap();
    let t = p.submit(&Req::new(1, "x")).await.unwrap();
    let rid = t.detach();
    let p2 = Producer::<Req, Resp>::connect(q.clone(), slow_producer())
        .await
        .unwrap();
    assert!(p2
        .watch(&rid, Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
}
