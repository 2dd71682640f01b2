//! Invariant 3: identical requests in flight are solved once.

use crate::common::*;
use pelican::{ErrorKind, Producer, Submitted};
use pelican_testkit::{eventually, RedisServer};
use std::time::Duration;
use tokio::task::JoinSet;

use super::SLACK;

/// 20 concurrent submissions of one request from 3 producers: one stream entry ever,
/// one handler run, 20 identical answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv3_dedup_one_entry_one_run() {
    let server = RedisServer::start();
    let q = queue(&server, "inv3");
    let probe = Probe::new(&server, &q).await;
    let (w, runs, gate) = Worker::gated(&q, fast_consumer(), "the one".to_string()).await;
    let mut producers = Vec::new();
    for _ in 0..3 {
        producers.push(
            Producer::<Req, Resp>::connect(q.clone(), fast_producer())
                .await
                .unwrap(),
        );
    }
    let before = probe.entries_added().await;
    let req = Req::new(4, "same");
    // 20 callers at once; each reports how its submission was taken, then waits
    let submitted = Runs::default();
    let mut calls = JoinSet::new();
    for n in 0..20 {
        let (p, req, submitted) = (producers[n % 3].clone(), req.clone(), submitted.clone());
        calls.spawn(async move {
            let t = p.submit(&req).await.unwrap();
            submitted.hit(&format!("{:?}", t.submitted()));
            (t.request_id().to_string(), t.await)
        });
    }
    // every submission is in before the one run may finish
    eventually(Duration::from_secs(5), "20 submissions", || async {
        submitted.total() == 20
    })
    .await;
    gate.open();
    assert_eq!(
        submitted.get("Queued"),
        1,
        "exactly one submission queues work"
    );
    assert_eq!(submitted.get("Joined"), 19);
    let mut rids = std::collections::HashSet::new();
    let mut n = 0;
    while let Some(a) = calls.join_next().await {
        let (rid, out) = a.unwrap();
        assert_eq!(out.unwrap(), echo(&req, "the one"));
        rids.insert(rid);
        n += 1;
    }
    assert_eq!(rids.len(), 1, "one request id");
    let rid = rids.into_iter().next().unwrap();
    assert_eq!(n, 20);
    assert_eq!(
        probe.entries_added().await - before,
        1,
        "stream entries added"
    );
    assert_eq!(runs.get(&rid), 1);
    assert_eq!(runs.total(), 1);
    w.stop().await;
}

/// Identical requests share the first submitter's deadline. A joiner with more time must
/// not be told "expired" when that deadline passes: it submits again with its own, and
/// gets the answer; the expiry is not cached for later identical requests either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv3_dedup_joiner_outlives_the_first_deadline() {
    install_counters();
    let server = RedisServer::start();
    let q = queue(&server, "inv3-deadline");
    let probe = Probe::new(&server, &q).await;
    let short = Producer::<Req, Resp>::connect(
        q.clone(),
        fast_producer().with_request_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let long = Producer::<Req, Resp>::connect(
        q.clone(),
        fast_producer().with_request_timeout(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let req = Req::new(7, "patient");
    let first = short.submit(&req).await.unwrap();
    assert_eq!(first.submitted(), Submitted::Queued);
    let joiner = long.submit(&req).await.unwrap();
    assert_eq!(joiner.submitted(), Submitted::Joined);
    let rid = joiner.request_id().to_string();
    // nobody serves the queue yet: the first submitter times out
    let e = first.await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let (w, runs) = Worker::counting(&q, fast_consumer(), "late but in time").await;
    let out = within(SLACK * 3, "the joiner's answer", joiner).await;
    assert_eq!(out.unwrap(), echo(&req, "late but in time"));
    assert_eq!(
        runs.get(&rid),
        1,
        "the handler ran once, for the resubmission"
    );
    assert_eq!(
        resubmitted(&q.name, "expired"),
        1,
        "counted, with its reason"
    );
    assert_eq!(resubmitted(&q.name, "lost"), 0);
    // what is cached is the answer (had the expiry been cached, the resubmission would
    // have read it back and the joiner would have got "expired")
    let cached = probe
        .get(&probe.req(&rid))
        .await
        .expect("the outcome is cached");
    assert_eq!(cached.first(), Some(&b'O'));
    w.stop().await;
}
