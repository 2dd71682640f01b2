//! The producer's sweep of requests without an index (dedup off): a request Redis lost is
//! submitted again, and one still in a handler's hands is left alone however many sweeps
//! pass over it. (With dedup, `failover::a_submission_lost_in_a_failover_is_submitted_again`
//! and the reliability suite's restarts.)

use crate::common::*;
use pelican::{Producer, ProducerConfig};
use pelican_testkit::{eventually, RedisServer};
use std::time::Duration;

fn producer_config() -> ProducerConfig {
    fast_producer()
        .with_dedup(false)
        .with_request_timeout(Duration::from_secs(30))
        .with_sweep_interval(Duration::from_millis(200))
}

/// Calls of `command` the server has run (INFO commandstats).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count of calls"))
}

/// Redis restarted without persistence forgets a request submitted without dedup before
/// any worker took it: no index, no outcome to look up, but its entry is gone from the
/// stream and no outcome came, so the sweep submits it again and the caller is answered
/// (before, the call ended in `Timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_dedup_redis_forgot_is_submitted_again() {
    logs();
    install_counters();
    let mut server = RedisServer::start();
    let q = queue(&server, "forgot");
    let p = Producer::<Req, Resp>::connect(q.clone(), producer_config())
        .await
        .unwrap();
    let probe = Probe::new(&server, &q).await;
    let ticket = p.submit(&Req::new(7, "forgot")).await.unwrap();
    assert_eq!(ticket.submitted(), pelican::Submitted::Queued);
    assert_eq!(probe.xlen().await, 1, "the request's entry");
    drop(probe);
    server.restart();
    let probe = Probe::new(&server, &q).await;
    assert_eq!(probe.xlen().await, 0, "Redis forgot the request");
    // The producer notices on its own: its reply reader reconnects, and the sweep finds
    // the entry gone without an outcome.
    eventually(
        Duration::from_secs(10),
        "the request submitted again",
        || async { probe.xlen().await > 0 },
    )
    .await;
    let (w, runs) = Worker::counting(&q, fast_consumer(), "after").await;
    let out = within(
        Duration::from_secs(20),
        "the forgotten request's answer",
        ticket,
    )
    .await
    .expect("answered");
    assert_eq!((out.i, out.by.as_str()), (7, "after"));
    assert_eq!(runs.total(), 1);
    assert_eq!(probe.entries_added().await, 1, "submitted again once");
    // Counted with its reason: once, or more where a try went to Redis before it was
    // back up and the next sweep tried again.
    assert!(
        resubmitted(&q.name, "lost") >= 1,
        "counted, with its reason"
    );
    assert_eq!(resubmitted(&q.name, "expired"), 0);
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// Requests without dedup held by a handler for many sweeps: each sweep finds their
/// entries in the stream (pending) and leaves them alone; none is submitted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_dedup_in_a_handler_are_not_submitted_again() {
    install_counters();
    let server = RedisServer::start();
    let q = queue(&server, "held");
    let p = Producer::<Req, Resp>::connect(q.clone(), producer_config())
        .await
        .unwrap();
    let probe = Probe::new(&server, &q).await;
    let (w, runs, gate) = Worker::gated(&q, fast_consumer(), "held".into()).await;
    let mut tickets = Vec::new();
    for i in 0..3 {
        tickets.push(p.submit(&Req::new(i, "held")).await.unwrap());
    }
    eventually(
        Duration::from_secs(10),
        "the handler to hold all 3",
        || async { runs.total() == 3 },
    )
    .await;
    // At least five sweeps over the three held requests: an XRANGE of each per sweep.
    let before = calls(&server, "xrange");
    eventually(
        Duration::from_secs(10),
        "five sweeps over the requests",
        || async { calls(&server, "xrange") >= before + 15 },
    )
    .await;
    assert_eq!(probe.entries_added().await, 3, "none submitted again");
    gate.open();
    for (i, t) in tickets.into_iter().enumerate() {
        let out = within(Duration::from_secs(10), "an answer", t)
            .await
            .expect("answered");
        assert_eq!(out.i, i as u64);
    }
    assert_eq!(runs.total(), 3, "each handled once");
    for why in ["lost", "expired", "answer_gone"] {
        assert_eq!(
            resubmitted(&q.name, why),
            0,
            "none counted as resubmitted ({why})"
        );
    }
    assert_eq!(probe.entries_added().await, 3);
    w.stop().await;
    p.shutdown().await.unwrap();
}
