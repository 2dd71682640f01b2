//! Invariant 6: bounded memory.

use crate::common::*;
use pelican::{Admin, Consumer, Producer};
use pelican_testkit::{eventually, RedisServer};
use std::time::Duration;

use super::SLACK;

/// After the work: the stream is empty, no index remains, outcomes expire after
/// result_ttl, the reply stream of a producer that died expires after reply_ttl, and
/// a consumer that is gone leaves the group (a live one stays, or, on Redis 7.0, where an
/// idle live consumer looks like a gone one, is a member again once it serves a request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv6_bounded_memory() {
    let server = RedisServer::start();
    // The gc age is well above how long a live consumer's reads can stall on a loaded
    // machine (with 1 s, a starved live consumer was once taken for a gone one).
    let gc_after = Duration::from_secs(3);
    let q = queue(&server, "inv6")
        .with_result_ttl(Duration::from_secs(1))
        .with_consumer_gc_after(gc_after);
    let probe = Probe::new(&server, &q).await;
    let live = Worker::spawn(&q, fast_consumer(), 4, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    // a consumer that goes away without a word, owning nothing
    let gone = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let gone_name = gone.name().to_string();
    drop(gone);
    let p = Producer::<Req, Resp>::connect(
        q.clone(),
        fast_producer().with_reply_ttl(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let reply = probe.reply(p.id());
    let mut rids = Vec::new();
    for i in 0..20 {
        let t = p.submit(&Req::new(i, "mem")).await.unwrap();
        rids.push(t.request_id().to_string());
        t.await.unwrap();
    }
    let last = probe.req(rids.last().unwrap());
    assert!(
        probe.exists(&last).await,
        "outcomes are cached for result_ttl"
    );
    let ttl: i64 = probe.query(redis::cmd("PTTL").arg(&last)).await;
    assert!(ttl > 0 && ttl <= 1000, "PTTL {ttl}");
    assert!(
        probe.exists(&reply).await,
        "a live producer keeps its reply stream"
    );
    drop(p); // dies: no shutdown, its reply stream is left to expire

    let admin = Admin::connect(q.clone()).await.unwrap();
    eventually(
        Duration::from_secs(5),
        "the stream emptied by the janitor",
        || async {
            admin.janitor().await.unwrap();
            probe.xlen().await == 0
        },
    )
    .await;
    assert_eq!(probe.pending().await, 0);
    assert_eq!(probe.pending_index_keys().await, Vec::<String>::new());
    eventually(
        Duration::from_secs(1) + SLACK,
        "cached outcomes and the dead producer's reply stream expiring",
        || async {
            for rid in &rids {
                if probe.exists(&probe.req(rid)).await {
                    return false;
                }
            }
            !probe.exists(&reply).await
        },
    )
    .await;
    eventually(
        gc_after + SLACK,
        "the gone consumer removed from the group",
        || async {
            admin.janitor().await.unwrap();
            !probe.consumers().await.iter().any(|(n, _)| *n == gone_name)
        },
    )
    .await;
    // A live consumer with nothing to do may be collected too: Redis 7.0 refreshes a
    // consumer's idle time only when it is given entries (7.2 and later on every read,
    // so there it stays). It owns nothing, and its next read that gets work makes it a
    // member again: the queue goes on.
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(100, "after the gc");
    assert_eq!(p.call(&req).await.unwrap(), echo(&req, "w"));
    assert!(
        probe.consumers().await.iter().any(|(n, _)| *n == live.name),
        "the live consumer is a member after serving a request"
    );
    p.shutdown().await.unwrap();
    live.stop().await;
    assert_eq!(probe.leftovers(&[]).await, Vec::<String>::new());
}
