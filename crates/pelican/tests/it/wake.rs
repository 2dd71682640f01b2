//! Waking the reader (docs/PROTOCOL.md, "Waking the reader"): whatever `block` is, a
//! released request (a handler's retry, a panic, a dropped delivery, a consumer leaving)
//! is read again within milliseconds by a consumer with a free slot, a `retry_after` when
//! its delay is up, and an idle consumer stops at once. Every consumer here blocks 10 s
//! and reclaims every 15 s (claim_idle 30 s): before the reader was woken, each of these
//! took a whole block or more.

use crate::common::*;
use pelican::{Consumer, ConsumerConfig, HandlerError, Producer, QueueConfig};
use pelican_testkit::{eventually, RedisCluster, RedisServer};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Far longer than anything here should take.
const BLOCK: Duration = Duration::from_secs(10);
/// What "at once" is allowed to take here (a tenth of the block).
const PROMPT: Duration = Duration::from_secs(1);

fn long_blocks() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_block(BLOCK)
        .with_claim_idle(Duration::from_secs(30))
        .with_shutdown_timeout(Duration::from_millis(100))
}

/// How many consumer readers are blocked in `XREADGROUP`, on every node of `target`.
async fn blocked_readers(target: &Target) -> usize {
    let mut n = 0;
    for url in target.node_urls() {
        let mut c = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut c)
            .await
            .unwrap();
        n += list
            .lines()
            .filter(|l| {
                let flags = l.split(' ').find_map(|f| f.strip_prefix("flags="));
                // `U`: a client on a Unix socket.
                l.contains(" cmd=xreadgroup ") && flags.is_some_and(|f| f.contains('b'))
            })
            .count();
    }
    n
}

async fn until_blocked(target: &Target, n: usize) {
    eventually(
        Duration::from_secs(10),
        &format!("{n} readers blocked"),
        || async move { blocked_readers(target).await == n },
    )
    .await;
}

/// How a handler gives its request back on the first delivery.
#[derive(Clone, Copy, Debug)]
enum GiveBack {
    Retry,
    Panic,
}

/// One consumer whose handler gives every request back once, then answers: each request
/// is answered within [`PROMPT`], on its second delivery, with one request in flight and
/// with several at once.
async fn given_back_once_is_answered_at_once(target: &Target, q: QueueConfig) {
    let partitions = q.partitions;
    let deliveries = Arc::new(AtomicU32::new(0));
    let d = deliveries.clone();
    let w = Worker::spawn(&q, long_blocks(), 4, move |r: Req, job| {
        let d = d.clone();
        async move {
            d.fetch_add(1, Ordering::SeqCst);
            let how = if r.i.is_multiple_of(2) {
                GiveBack::Retry
            } else {
                GiveBack::Panic
            };
            match (job.delivery_count(), how) {
                (1, GiveBack::Retry) => Err(HandlerError::retry("not yet")),
                (1, GiveBack::Panic) => panic!("not yet"),
                (n, _) => Ok(Resp {
                    i: u64::from(n),
                    by: "w".into(),
                }),
            }
        }
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    until_blocked(target, partitions as usize).await;
    for i in 0..4 {
        let t = Instant::now();
        let r = p.call(&Req::new(i, "once")).await.unwrap();
        let took = t.elapsed();
        assert_eq!(r.i, 2, "request {i} answered on its second delivery");
        assert!(took < PROMPT, "request {i} given back once took {took:?}");
    }
    // Several at once.
    let t = Instant::now();
    let calls = (10..18).map(|i| {
        let p = &p;
        async move { p.call(&Req::new(i, "many")).await }
    });
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.unwrap().i, 2);
    }
    let took = t.elapsed();
    assert!(took < PROMPT, "8 requests given back once took {took:?}");
    assert_eq!(deliveries.load(Ordering::SeqCst), 24);
    w.stop().await;
    p.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_back_is_read_again_at_once() {
    let target = Target::Node(RedisServer::start());
    let q = target.queue("wake-retry", 1);
    given_back_once_is_answered_at_once(&target, q).await;
}

/// Over a Unix socket the reader's connection is the client library's, not a lean one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_back_is_read_again_at_once_over_a_unix_socket() {
    let sock = std::env::temp_dir().join(format!("{}.sock", pelican_testkit::unique_name("wake")));
    let server = RedisServer::builder()
        .arg("--unixsocket")
        .arg(sock.display().to_string())
        .arg("--unixsocketperm")
        .arg("700")
        .start();
    let target = Target::Node(server);
    let mut q = target.queue("wake-unix", 1);
    q.url = format!("unix://{}", sock.display());
    given_back_once_is_answered_at_once(&target, q).await;
    let _ = std::fs::remove_file(&sock);
}

/// On a cluster every partition's reader is woken on its own node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_back_is_read_again_at_once_on_a_cluster() {
    let target = Target::Cluster(RedisCluster::start(3));
    let q = target.queue("wake-retry", 3);
    given_back_once_is_answered_at_once(&target, q).await;
}

/// A consumer that does not reclaim hands what it gives back to the others, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_consumer_without_reclaim_is_taken_at_once_by_another() {
    let target = Target::Node(RedisServer::start());
    let q = target.queue("wake-other", 1);
    let giver = Worker::spawn(
        &q,
        long_blocks().with_reclaim(false),
        4,
        |_: Req, _| async { Err(HandlerError::retry("not here")) },
    )
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    until_blocked(&target, 1).await;
    let (taker, taken) = Worker::counting(&q, long_blocks(), "taker").await;
    until_blocked(&target, 2).await;
    // Redis hands a new entry to the reader that has waited longest: the giver's.
    let t = Instant::now();
    let r = within(PROMPT, "the request answered by the other", async {
        p.call(&Req::new(1, "other")).await
    })
    .await
    .unwrap();
    assert_eq!(r, echo(&Req::new(1, "other"), "taker"));
    assert!(t.elapsed() < PROMPT, "answered after {:?}", t.elapsed());
    assert_eq!(taken.total(), 1);
    giver.stop().await;
    taker.stop().await;
    p.shutdown().await.unwrap();
}

/// A delivery dropped unanswered (`Consumer::next`) is delivered again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_delivery_is_delivered_again_at_once() {
    let server = RedisServer::start();
    let q = queue(&server, "wake-drop");
    let mut c = Consumer::<Req, Resp>::connect(q.clone(), long_blocks())
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let ticket = p.submit(&Req::new(1, "drop")).await.unwrap();
    let first = c.next().await.unwrap().expect("a delivery");
    assert_eq!(first.job().delivery_count(), 1);
    let t = Instant::now();
    drop(first);
    let again = within(PROMPT, "the dropped delivery again", c.next())
        .await
        .unwrap()
        .expect("a delivery");
    assert_eq!(again.job().delivery_count(), 2);
    assert!(again
        .respond(&echo(&Req::new(1, "drop"), "c"))
        .await
        .unwrap());
    assert!(
        t.elapsed() < PROMPT,
        "delivered again after {:?}",
        t.elapsed()
    );
    assert_eq!(ticket.await.unwrap(), echo(&Req::new(1, "drop"), "c"));
    c.shutdown().await.unwrap();
    p.shutdown().await.unwrap();
}

/// A `retry_after` is read again when its delay is up: not before, and not at the end of
/// the block (or of the reclaim interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_is_read_again_when_its_delay_is_up() {
    const DELAY: Duration = Duration::from_millis(1500);
    let server = RedisServer::start();
    let target = Target::Node(server);
    let q = target.queue("wake-later", 1);
    let w = Worker::spawn(&q, long_blocks(), 4, move |r: Req, job| async move {
        if job.delivery_count() == 1 {
            Err(HandlerError::retry_after(DELAY, "later"))
        } else {
            Ok(echo(&r, "w"))
        }
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    until_blocked(&target, 1).await;
    let t = Instant::now();
    assert_eq!(
        p.call(&Req::new(1, "later")).await.unwrap(),
        echo(&Req::new(1, "later"), "w")
    );
    let took = t.elapsed();
    assert!(
        took >= DELAY && took < DELAY + PROMPT,
        "a retry after {DELAY:?} was answered after {took:?}"
    );
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// A consumer that stops with a request in hand releases it, and another consumer,
/// blocked on the empty stream, takes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_released_on_shutdown_is_taken_at_once_by_another_consumer() {
    let target = Target::Node(RedisServer::start());
    let q = target.queue("wake-leave", 1);
    // Holds every request until its consumer gives up on it (shutdown timeout).
    let (holder, held, _never) = Worker::gated(&q, long_blocks(), "holder".into()).await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let call = {
        let p = p.clone();
        tokio::spawn(async move { p.call(&Req::new(1, "leave")).await })
    };
    eventually(Duration::from_secs(10), "the holder has it", || async {
        held.total() == 1
    })
    .await;
    let (taker, taken) = Worker::counting(&q, long_blocks(), "taker").await;
    until_blocked(&target, 2).await;
    let t = Instant::now();
    within(PROMPT, "the holder stops", holder.stop()).await;
    let r = within(PROMPT, "the released request answered", call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r, echo(&Req::new(1, "leave"), "taker"));
    assert!(
        t.elapsed() < PROMPT,
        "answered {:?} after the stop",
        t.elapsed()
    );
    assert_eq!(taken.total(), 1);
    taker.stop().await;
    p.shutdown().await.unwrap();
}

/// An idle consumer stops at once (`serve` and `shutdown`), on one node and on every
/// partition of a cluster.
async fn an_idle_consumer_stops_at_once(target: &Target, partitions: u32) {
    let q: QueueConfig = target.queue("wake-stop", partitions);
    // A stop waits this long for work in hand; there is none.
    let cfg = long_blocks().with_shutdown_timeout(Duration::from_secs(30));
    let (w, _) = Worker::counting(&q, cfg.clone(), "w").await;
    until_blocked(target, partitions as usize).await;
    let t = Instant::now();
    within(PROMPT, "serve returns", w.stop()).await;
    assert!(t.elapsed() < PROMPT, "stopped after {:?}", t.elapsed());

    let c = Consumer::<Req, Resp>::connect(q.clone(), cfg)
        .await
        .unwrap();
    until_blocked(target, partitions as usize).await;
    let t = Instant::now();
    within(PROMPT, "shutdown returns", c.shutdown())
        .await
        .unwrap();
    assert!(t.elapsed() < PROMPT, "shut down after {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_stops_at_once_on_one_node() {
    an_idle_consumer_stops_at_once(&Target::Node(RedisServer::start()), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_stops_at_once_on_a_cluster() {
    an_idle_consumer_stops_at_once(&Target::Cluster(RedisCluster::start(3)), 3).await;
}

/// A Redis user that may not run `CLIENT ID` or `CLIENT UNBLOCK` still gets its retries
/// and its stop, when the block runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_rights_a_retry_waits_for_the_block() {
    let server = RedisServer::start();
    assert_eq!(
        server
            .cli(&["ACL", "SETUSER", "noclient", "on", ">s3cret", "~*", "&*", "+@all", "-client"])
            .trim(),
        "OK"
    );
    let mut q = queue(&server, "wake-acl");
    q.url = format!("redis://noclient:s3cret@127.0.0.1:{}", server.port());
    let block = Duration::from_millis(300);
    let w = Worker::spawn(
        &q,
        long_blocks().with_block(block),
        4,
        |r: Req, job| async move {
            if job.delivery_count() == 1 {
                Err(HandlerError::retry("not yet"))
            } else {
                Ok(echo(&r, "w"))
            }
        },
    )
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let r = within(Duration::from_secs(10), "the retried request", async {
        p.call(&Req::new(1, "acl")).await
    })
    .await
    .unwrap();
    assert_eq!(r, echo(&Req::new(1, "acl"), "w"));
    within(Duration::from_secs(5), "the stop", w.stop()).await;
    p.shutdown().await.unwrap();
}
