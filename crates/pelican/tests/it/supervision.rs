//! Owned tasks: a consumer task that panics surfaces as an error (it used to vanish and
//! `serve` returned `Ok(())`), and a consumer dropped without `shutdown` still writes
//! the outcomes it was given (they used to be lost, their entries waiting claim_idle).

use crate::common::*;
use pelican::{Codec, CodecError, Consumer, ConsumerConfig, ErrorKind, Producer};
use pelican_testkit::RedisServer;
use serde::{de::DeserializeOwned, Serialize};
use std::time::{Duration, Instant};

/// JSON, except that decoding a body that contains `boom` panics: a bug in user code
/// that runs inside the consumer's reader task.
struct PanickyJson;

impl Codec for PanickyJson {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
        pelican::Json::encode(value)
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
        if bytes.windows(4).any(|w| w == b"boom") {
            panic!("the codec met a bomb");
        }
        pelican::Json::decode(bytes)
    }
}

#[tokio::test]
async fn a_panicking_reader_makes_serve_fail() {
    let server = RedisServer::start();
    let q = queue(&server, "supervision");
    let c = Consumer::<Req, Resp, PanickyJson>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let worker = tokio::spawn(c.serve(2, |r: Req, _| async move { Ok(echo(&r, "w")) }));
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    assert_eq!(p.call(&Req::new(1, "fine")).await.unwrap().i, 1);
    let _bomb = p.submit(&Req::new(2, "boom")).await.unwrap();
    let served = within(Duration::from_secs(10), "serve returning", worker)
        .await
        .expect("serve task");
    let err = served.expect_err("serve must report the reader's panic");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.message().contains("reader"), "{err}");
    assert!(err.message().contains("the codec met a bomb"), "{err}");
}

#[tokio::test]
async fn next_reports_a_panicking_reader() {
    let server = RedisServer::start();
    let q = queue(&server, "supervision-next");
    let mut c = Consumer::<Req, Resp, PanickyJson>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let _bomb = p.submit(&Req::new(2, "boom")).await.unwrap();
    let err = within(Duration::from_secs(10), "next returning", c.next())
        .await
        .err()
        .expect("next must report the reader's panic");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    // And it stays failed.
    assert_eq!(
        c.next().await.err().map(|e| e.kind()),
        Some(ErrorKind::Internal)
    );
    let err = c.shutdown().await.expect_err("shutdown reports it too");
    assert_eq!(err.kind(), ErrorKind::Internal);
}

#[tokio::test]
async fn a_dropped_consumer_still_writes_the_outcomes_it_was_given() {
    let server = RedisServer::start();
    let q = queue(&server, "dropped-consumer");
    // A claim_idle far above the test's limits: only the writer can answer in time.
    let slow_reclaim = ConsumerConfig::default()
        .with_claim_idle(Duration::from_secs(60))
        .with_block(Duration::from_millis(200));
    let mut c = Consumer::<Req, Resp>::connect(q.clone(), slow_reclaim.clone())
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let answered = p.submit(&Req::new(1, "answered")).await.unwrap();
    let dropped = p.submit(&Req::new(2, "dropped")).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let d = within(Duration::from_secs(5), "a delivery", c.next())
            .await
            .unwrap()
            .expect("a delivery");
        got.push(d);
    }
    let (a, b): (Vec<_>, Vec<_>) = got.into_iter().partition(|d| d.request().i == 1);
    let (a, b) = (a.into_iter().next().unwrap(), b.into_iter().next().unwrap());
    // The handler has its answer; the consumer goes away before it is written.
    let respond = a.respond(&echo(&Req::new(1, ""), "gone"));
    drop(c);
    let started = Instant::now();
    let written = tokio::spawn(respond);
    let out = within(Duration::from_secs(10), "the answer", answered)
        .await
        .expect("the outcome given to a dropped consumer is written");
    assert_eq!(out.by, "gone");
    assert!(written.await.unwrap().unwrap(), "recorded as the outcome");
    // A delivery dropped unanswered after its consumer is released at once: another
    // consumer takes it long before claim_idle.
    drop(b);
    let (w, runs) = Worker::counting(
        &q,
        slow_reclaim.with_reclaim_interval(Duration::from_millis(100)),
        "next",
    )
    .await;
    let out = within(Duration::from_secs(10), "the released request", dropped)
        .await
        .unwrap();
    assert_eq!(out.by, "next");
    assert_eq!(runs.total(), 1);
    assert!(started.elapsed() < Duration::from_secs(20));
    w.stop().await;
}
