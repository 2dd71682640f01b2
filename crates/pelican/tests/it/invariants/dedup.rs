//! Invariant 3: identical requests in flight are solved once.

use crate::common::*;
use pelican::admin::RequestState;
use pelican::{Admin, ErrorKind, HandlerError, Producer, Submitted};
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

/// A handler's failure (`HandlerError::fail`): every caller waiting while the request ran
/// gets it, it stays recorded for `result_ttl` (`Admin::inspect`), and a later submission
/// of the same request runs it again, unless within `failure_ttl` of the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_told_to_its_waiters_and_not_served_to_a_later_submission() {
    let server = RedisServer::start();
    for failure_ttl in [Duration::ZERO, Duration::from_secs(60)] {
        let q = queue(&server, "failures").with_failure_ttl(failure_ttl);
        let runs = Runs::default();
        let gate = Gate::default();
        let (r, g) = (runs.clone(), gate.clone());
        // Fails its first run (after the gate opens), answers the later ones.
        let w = Worker::spawn(&q, fast_consumer(), 4, move |req: Req, job| {
            let (runs, gate) = (r.clone(), g.clone());
            async move {
                let n = runs.hit(job.request_id());
                gate.wait().await;
                if n == 1 {
                    Err(HandlerError::fail("the source image is missing"))
                } else {
                    Ok(echo(&req, "w"))
                }
            }
        })
        .await;
        let (p1, p2) = (
            Producer::<Req, Resp>::connect(q.clone(), fast_producer())
                .await
                .unwrap(),
            Producer::<Req, Resp>::connect(q.clone(), fast_producer())
                .await
                .unwrap(),
        );
        let req = Req::new(1, "thumbnail");
        let first = p1.submit(&req).await.unwrap();
        let joiner = p2.submit(&req).await.unwrap();
        assert_eq!(joiner.submitted(), Submitted::Joined);
        let rid = first.request_id().to_string();
        gate.open();
        for t in [first, joiner] {
            let e = t.await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Remote, "{e:#}");
            assert!(e.message().contains("source image"), "{e:#}");
        }
        let info = Admin::connect(q.clone())
            .await
            .unwrap()
            .inspect(&rid)
            .await
            .unwrap()
            .expect("the failure is recorded");
        assert_eq!(info.state, RequestState::Error);
        let later = p2.call(&req).await;
        if failure_ttl.is_zero() {
            assert_eq!(later.unwrap(), echo(&req, "w"), "run again");
            assert_eq!(runs.get(&rid), 2);
        } else {
            let e = later.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Remote, "the failure, from the cache");
            assert_eq!(runs.get(&rid), 1);
        }
        w.stop().await;
        p1.shutdown().await.unwrap();
        p2.shutdown().await.unwrap();
    }
}
