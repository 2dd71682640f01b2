//! One test (or a few) per invariant of DESIGN.md; invariant 5 is in `lease`, 7 in
//! `garbage`, 9 in `faults`.

use crate::common::*;
use pelican::{Admin, Consumer, ErrorKind, Producer, Submitted};
use pelican_testkit::{eventually, Proxy, RedisServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Slack on top of a configured time before a test calls it a hang: the suite runs
/// tests in parallel on two cores.
const SLACK: Duration = Duration::from_secs(3);

// ---- 1. No hang ----------------------------------------------------------------

/// Nobody serves the queue: the caller gets a typed timeout after request_timeout,
/// and the withdrawn request leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv1_no_hang_without_consumers() {
    let server = RedisServer::start();
    let q = queue(&server, "inv1");
    let probe = Probe::new(&server, &q).await;
    let timeout = Duration::from_secs(1);
    let p =
        Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_request_timeout(timeout))
            .await
            .unwrap();
    let started = Instant::now();
    let e = within(
        timeout + SLACK,
        "the timeout",
        p.call(&Req::new(1, "nobody")),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_timeout() && e.is_retryable());
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    eventually(Duration::from_secs(5), "the request withdrawn", || async {
        probe.xlen().await == 0 && probe.pending_index_keys().await.is_empty()
    })
    .await;
}

/// A consumer takes the request and holds it without ever answering (alive, so it
/// keeps its lease): the caller still gets a typed timeout, and the withdrawal tells
/// the holder its lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv1_no_hang_when_the_holder_never_answers() {
    let server = RedisServer::start();
    let q = queue(&server, "inv1b");
    let timeout = Duration::from_millis(1500);
    let mut holder = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let p =
        Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_request_timeout(timeout))
            .await
            .unwrap();
    let started = Instant::now();
    let ticket = p.submit(&Req::new(2, "held")).await.unwrap();
    let d = within(Duration::from_secs(5), "the delivery", holder.next())
        .await
        .unwrap()
        .unwrap();
    let job = d.job().clone();
    let e = within(timeout + SLACK, "the timeout", ticket)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() >= timeout);
    // held past claim_idle (600 ms) without losing the lease to anybody...
    assert_eq!(job.delivery_count(), 1);
    // ...until the request was withdrawn
    within(
        Duration::from_secs(5),
        "the holder's lease lost",
        job.lease_lost().cancelled(),
    )
    .await;
    assert!(!d
        .respond(&echo(&Req::new(2, "held"), "late"))
        .await
        .unwrap());
}

// ---- 2. One outcome ------------------------------------------------------------

/// Consumer A takes a request and is cut off from Redis (its lease renewals stall in
/// a blackholed proxy) past claim_idle; B takes the request over and answers. When A
/// comes back its answer is dropped: `respond` returns false, the caller saw B's
/// answer only, the stored outcome is B's and no second reply was pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_one_outcome_late_duplicate_is_dropped() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let q = queue(&server, "inv2");
    let probe = Probe::new(&server, &q).await;
    let mut qa = q.clone();
    qa.url = proxy.url();
    let mut a = Consumer::<Req, Resp>::connect(qa, fast_consumer().with_name("A"))
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(3, "twice");
    let ticket = p.submit(&req).await.unwrap();
    let rid = ticket.request_id().to_string();
    let da = within(Duration::from_secs(5), "A's delivery", a.next())
        .await
        .unwrap()
        .unwrap();
    let job_a = da.job().clone();
    proxy.set_blackhole(true);

    let runs = Runs::default();
    let deliveries = Runs::default();
    let (r2, d2) = (runs.clone(), deliveries.clone());
    let b = Worker::spawn(&q, fast_consumer().with_name("B"), 4, move |r: Req, job| {
        let (runs, deliveries) = (r2.clone(), d2.clone());
        async move {
            runs.hit(job.request_id());
            deliveries.hit(&job.delivery_count().to_string());
            Ok(echo(&r, "B"))
        }
    })
    .await;
    let got = within(Duration::from_secs(10), "B's answer", ticket)
        .await
        .unwrap();
    assert_eq!(got, echo(&req, "B"));
    let outcome_b = probe.get(&probe.req(&rid)).await.expect("outcome cached");
    let replies = probe.entries_added_to(&probe.reply(p.id())).await;

    proxy.set_blackhole(false);
    within(
        Duration::from_secs(5),
        "A learning it lost the lease",
        job_a.lease_lost().cancelled(),
    )
    .await;
    let recorded = da.respond(&echo(&req, "A")).await.unwrap();
    assert!(!recorded, "A's late answer must be dropped");
    assert_eq!(probe.get(&probe.req(&rid)).await, Some(outcome_b));
    assert_eq!(
        probe.entries_added_to(&probe.reply(p.id())).await,
        replies,
        "the late answer was pushed to the caller"
    );
    // Asking again is answered from the cache: B's answer.
    let again = p.submit(&req).await.unwrap();
    assert_eq!(again.submitted(), Submitted::Cached);
    assert_eq!(again.await.unwrap(), echo(&req, "B"));
    assert_eq!(runs.get(&rid), 1);
    assert_eq!(deliveries.get("2"), 1, "B got it as the second delivery");
    b.stop().await;
}

// ---- 3. Dedup ------------------------------------------------------------------

/// 20 concurrent submissions of one request from 3 producers: one stream entry ever,
/// one handler run, 20 identical answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv3_dedup_one_entry_one_run() {
    let server = RedisServer::start();
    let q = queue(&server, "inv3");
    let probe = Probe::new(&server, &q).await;
    let runs = Runs::default();
    let gate = Gate::default();
    let (r2, g2) = (runs.clone(), gate.clone());
    let w = Worker::spawn(&q, fast_consumer(), 4, move |r: Req, job| {
        let (runs, gate) = (r2.clone(), g2.clone());
        async move {
            runs.hit(job.request_id());
            gate.wait().await;
            Ok(echo(&r, "the one"))
        }
    })
    .await;
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
    // what is cached is the answer (had the expiry been cached, the resubmission would
    // have read it back and the joiner would have got "expired")
    let cached = probe
        .get(&probe.req(&rid))
        .await
        .expect("the outcome is cached");
    assert_eq!(cached.first(), Some(&b'O'));
    w.stop().await;
}

// ---- 4. Recovery ---------------------------------------------------------------

/// A consumer dies holding a request: after claim_idle another one gets it as its
/// second delivery and the caller gets that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_redelivers_after_claim_idle() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4");
    let claim_idle = Duration::from_millis(600);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut dier = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone())
        .await
        .unwrap();
    let req = Req::new(5, "recover");
    // the entry's idle time starts when it is delivered, after this
    let submitted = Instant::now();
    let ticket = p.submit(&req).await.unwrap();
    let d1 = within(Duration::from_secs(5), "the first delivery", dier.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d1.job().delivery_count(), 1);
    die(dier, d1);

    let mut heir = Consumer::<Req, Resp>::connect(q.clone(), cfg)
        .await
        .unwrap();
    let d2 = within(claim_idle + SLACK, "the redelivery", heir.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        submitted.elapsed() >= claim_idle,
        "redelivered {:?} after submission, before claim_idle",
        submitted.elapsed()
    );
    assert_eq!(d2.job().delivery_count(), 2);
    assert_eq!(d2.request(), &req);
    assert!(d2.respond(&echo(&req, "heir")).await.unwrap());
    assert_eq!(ticket.await.unwrap(), echo(&req, "heir"));
}

/// A request whose consumers keep dying is dead-lettered after max_deliveries: the
/// caller gets a Dead error, the dead letter says why, and the consumer that buried
/// it goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_dead_letters_past_max_deliveries() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4b");
    let probe = Probe::new(&server, &q).await;
    let cfg = fast_consumer().with_max_deliveries(2);
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let req = Req::new(6, "poison");
    let ticket = p.submit(&req).await.unwrap();
    let rid = ticket.request_id().to_string();
    let mut last = String::new();
    for n in 1..=2 {
        let mut c = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone())
            .await
            .unwrap();
        let d = within(Duration::from_secs(5), "a delivery", c.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.job().delivery_count(), n);
        last = c.name().to_string();
        die(c, d);
    }
    let (w, runs) = Worker::counting(&q, cfg, "survivor").await;
    let e = within(Duration::from_secs(5), "the dead letter", ticket)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Dead, "{e}");
    assert!(e.message().contains("max_deliveries"), "{e}");
    let admin = Admin::connect(q.clone()).await.unwrap();
    let dead = admin.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].rid.as_deref(), Some(rid.as_str()));
    assert_eq!(dead[0].deliveries, 2);
    assert_eq!(dead[0].consumer, last);
    assert!(dead[0].reason.contains("max_deliveries"), "{:?}", dead[0]);
    assert_eq!(runs.get(&rid), 0, "a dead request must not run again");
    // the consumer goes on serving
    let next = Req::new(7, "fine");
    assert_eq!(p.call(&next).await.unwrap(), echo(&next, "survivor"));
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    w.stop().await;
}

/// A handler that asks for a retry gets the request again at once (claim_idle is
/// 30 s here), as the next delivery; one that keeps asking, or keeps panicking, is
/// dead-lettered after max_deliveries and its caller gets a Dead error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_recovery_retries_are_counted_and_bounded() {
    let server = RedisServer::start();
    let q = queue(&server, "inv4c");
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer()
        .with_claim_idle(claim_idle)
        .with_max_deliveries(3);
    let deliveries = Runs::default();
    let d2 = deliveries.clone();
    let w = Worker::spawn(&q, cfg, 4, move |r: Req, job| {
        let deliveries = d2.clone();
        async move {
            let n = job.delivery_count();
            deliveries.hit(&format!("{} {n}", r.tag));
            match (r.tag.as_str(), n) {
                ("once", 1) | ("always", _) => Err(pelican::HandlerError::retry("not now")),
                ("panics", _) => panic!("a handler bug"),
                _ => Ok(echo(&r, "w")),
            }
        }
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let started = Instant::now();
    let once = Req::new(1, "once");
    assert_eq!(p.call(&once).await.unwrap(), echo(&once, "w"));
    for tag in ["always", "panics"] {
        let e = p.call(&Req::new(2, tag)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Dead, "{tag}: {e}");
        assert!(e.message().contains("max_deliveries"), "{tag}: {e}");
    }
    assert!(
        started.elapsed() < claim_idle / 3,
        "retries must not wait for claim_idle: {:?}",
        started.elapsed()
    );
    let mut seen: Vec<(String, u32)> = deliveries.snapshot().into_iter().collect();
    seen.sort();
    let expected: Vec<(String, u32)> = [
        "always 1", "always 2", "always 3", "once 1", "once 2", "panics 1", "panics 2", "panics 3",
    ]
    .iter()
    .map(|s| (s.to_string(), 1))
    .collect();
    assert_eq!(seen, expected, "each delivery once, counted");
    w.stop().await;
}

// ---- 6. Bounded memory ---------------------------------------------------------

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

// ---- 8. Graceful shutdown ------------------------------------------------------

/// A consumer shuts down with requests in its hands: the short ones are finished,
/// the ones still running at shutdown_timeout and the ones read ahead are released
/// and finished by the next consumer at once, long before claim_idle (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_graceful_shutdown_loses_nothing() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8");
    let probe = Probe::new(&server, &q).await;
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    // A: requests tagged "long" take far longer than its shutdown timeout
    let a = Worker::spawn(
        &q,
        cfg.clone()
            .with_name("A")
            .with_prefetch(8)
            .with_shutdown_timeout(Duration::from_millis(500)),
        4,
        move |r: Req, job| {
            let started = s2.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let work = if r.tag == "long" {
                    Duration::from_secs(60)
                } else {
                    Duration::from_millis(200)
                };
                let lost = job.lease_lost();
                tokio::select! {
                    _ = tokio::time::sleep(work) => Ok(echo(&r, "A")),
                    _ = lost.cancelled() => Err(pelican::HandlerError::retry("cancelled")),
                }
            }
        },
    )
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..8 {
        let tag = if i % 2 == 0 { "long" } else { "short" };
        tickets.push((i, tag, p.submit(&Req::new(i, tag)).await.unwrap()));
    }
    // A holds all 8: 4 in its handlers, 4 read ahead
    eventually(
        Duration::from_secs(5),
        "A working on 4 requests",
        || async { started.load(Ordering::SeqCst) == 4 && probe.pending().await == 8 },
    )
    .await;
    let stopping = Instant::now();
    a.stop().await;
    let b = Worker::spawn(&q, cfg.with_name("B"), 8, |r: Req, _| async move {
        Ok(echo(&r, "B"))
    })
    .await;
    let mut by_a = 0;
    for (i, tag, t) in tickets {
        let resp = within(Duration::from_secs(10), "an answer", t)
            .await
            .unwrap();
        assert_eq!(resp.i, i);
        if tag == "long" {
            assert_eq!(resp.by, "B", "request {i} cannot have finished on A");
        }
        if resp.by == "A" {
            by_a += 1;
        }
    }
    assert!(by_a >= 2, "A finishes the short requests it was running");
    assert!(
        stopping.elapsed() < claim_idle / 3,
        "released work must not wait for claim_idle: {:?}",
        stopping.elapsed()
    );
    b.stop().await;
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    // A kept the released entries (backdated) until B took them, so it could not
    // leave the group itself; it owns nothing now and the janitor removes it later.
    assert!(
        probe.consumers().await.iter().all(|(_, owned)| *owned == 0),
        "{:?}",
        probe.consumers().await
    );
}

/// Same, with the next consumer already running when A shuts down (a rolling
/// restart): it takes the released work promptly, long before claim_idle (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_graceful_shutdown_hands_work_to_a_running_consumer() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8b");
    let probe = Probe::new(&server, &q).await;
    let claim_idle = Duration::from_secs(30);
    let cfg = fast_consumer().with_claim_idle(claim_idle);
    let mut a = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone().with_name("A"))
        .await
        .unwrap();
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..4 {
        tickets.push(p.submit(&Req::new(i, "handover")).await.unwrap());
    }
    // A takes one into its hands and has read the others ahead
    let d = within(Duration::from_secs(5), "A's delivery", a.next())
        .await
        .unwrap()
        .unwrap();
    eventually(Duration::from_secs(5), "A holding all 4", || async {
        probe.pending().await == 4
    })
    .await;
    let b = Worker::spawn(&q, cfg.with_name("B"), 8, |r: Req, _| async move {
        Ok(echo(&r, "B"))
    })
    .await;
    let stopping = Instant::now();
    drop(d); // given back unanswered
    a.shutdown().await.unwrap();
    for t in tickets {
        let resp = within(claim_idle / 3, "an answer from B", t).await.unwrap();
        assert_eq!(resp.by, "B");
    }
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "released work must be taken promptly: {:?}",
        stopping.elapsed()
    );
    b.stop().await;
    assert_eq!(probe.pending().await, 0);
}

/// A producer shuts down with calls waiting: its callers get Cancelled at once, the
/// request only it waited for is withdrawn, the one another producer joined is not
/// and is answered for that producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv8_producer_shutdown_cancels_its_calls_and_withdraws_only_its_own() {
    let server = RedisServer::start();
    let q = queue(&server, "inv8c");
    let probe = Probe::new(&server, &q).await;
    let p1 = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let p2 = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let (alone, shared) = (Req::new(1, "alone"), Req::new(2, "shared"));
    let a = p1.submit(&alone).await.unwrap();
    let alone_rid = a.request_id().to_string();
    let b1 = p1.submit(&shared).await.unwrap();
    let b2 = p2.submit(&shared).await.unwrap();
    assert_eq!(b2.submitted(), Submitted::Joined);
    assert_eq!(probe.xlen().await, 2);
    p1.shutdown().await.unwrap();
    for t in [a, b1] {
        let e = within(Duration::from_secs(1), "a cancellation", t)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    }
    assert_eq!(probe.xlen().await, 1, "only the shared request is left");
    assert!(probe.get(&probe.req(&alone_rid)).await.is_none());
    let (w, runs) = Worker::counting(&q, fast_consumer(), "w").await;
    assert_eq!(
        within(Duration::from_secs(5), "the shared answer", b2)
            .await
            .unwrap(),
        echo(&shared, "w")
    );
    assert_eq!(runs.total(), 1, "the withdrawn request never ran");
    w.stop().await;
}
