//! Reading ahead (docs/PROTOCOL.md, "Connections and tasks"): a consumer of a queue of one
//! partition, all its slots held, reads as many new entries as the outcome writer's call
//! on the wire will free, so the next work arrives while that call is on its way back.
//! Its deliveries stay within `prefetch`, its pending list within one call's worth more.

use crate::common::*;
use pelican::{Producer, QueueConfig, Submitted, Ticket};
use pelican_testkit::{eventually, RedisServer};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PREFETCH: usize = 4;
const REQUESTS: u64 = 300;

/// A backlog of quick requests through a consumer with 4 slots: every request answered
/// once, entries read ahead of the completions that freed their slots (counted), and the
/// group's pending list never holds more for it than twice its slots, sampled every
/// millisecond throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_read_ahead_of_each_completion_within_twice_the_slots() {
    install_counters();
    let server = RedisServer::start();
    let q = queue(&server, "ahead");
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..REQUESTS {
        let t = p.submit(&Req::new(i, "ahead")).await.unwrap();
        assert_eq!(t.submitted(), Submitted::Queued);
        tickets.push(t);
    }
    // The group's pending count, sampled until the run ends.
    let probe = Probe::new(&server, &q).await;
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, most) = (done.clone(), most.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                most.fetch_max(probe.pending().await, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let (w, runs) = Worker::counting(&q, fast_consumer().with_prefetch(PREFETCH), "ahead").await;
    for (i, t) in tickets.into_iter().enumerate() {
        let out = within(Duration::from_secs(30), "an answer", t)
            .await
            .expect("answered");
        assert_eq!(out, echo(&Req::new(i as u64, "ahead"), "ahead"));
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    assert_eq!(runs.total(), REQUESTS as u32, "each handled once");
    assert!(
        runs.snapshot().values().all(|&n| n == 1),
        "none handled twice"
    );
    let ahead = counter("pelican_deliveries_read_ahead_total", &[("queue", &q.name)]);
    assert!(ahead > 0, "no entry was read ahead");
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 2 * PREFETCH as u64,
        "the pending list held {most} entries for a consumer of {PREFETCH} slots"
    );
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// A consumer whose outcome writer cannot write (its ACL user loses `SET`, which the
/// transaction of every stored answer starts with) while its reads go through: it handles
/// `SLOTS` requests, then reads ahead by the slots its failing call would free. Its
/// answers are `STORED_ANSWER` bytes, so every outcome it writes names a stored answer.
struct Stalled {
    server: RedisServer,
    q: QueueConfig,
    producer: Producer<Req, Resp>,
    tickets: Vec<(u64, Ticket<Resp>)>,
    /// The stalled consumer's runs per request id.
    a_runs: Runs,
    probe: Probe,
}

const SLOTS: usize = 2;
const STALLED_REQUESTS: u64 = 6;
/// Above `STORED_ANSWER_MIN` (4 KiB) once encoded.
const STORED_ANSWER: usize = 5_000;

impl Stalled {
    /// The queue, its producer's tickets and the stalled consumer, once it has read ahead.
    async fn start(claim_idle: Duration) -> (Stalled, Worker) {
        logs();
        install_counters();
        let server = RedisServer::start();
        let setuser = [
            "ACL", "SETUSER", "stalled", "on", ">s3cret", "~*", "&*", "+@all",
        ];
        assert_eq!(server.cli(&setuser).trim(), "OK");
        let q = queue(&server, "ahead-stalled");
        let producer = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
            .await
            .unwrap();
        // A backlog: the entries to read ahead are there when its first call fails.
        let mut tickets = Vec::new();
        for i in 0..STALLED_REQUESTS {
            tickets.push((i, producer.submit(&Req::new(i, "stalled")).await.unwrap()));
        }
        let mut qa = q.clone();
        qa.url = format!("redis://stalled:s3cret@127.0.0.1:{}", server.port());
        let a_runs = Runs::default();
        let gate = Gate::default();
        let (r, g) = (a_runs.clone(), gate.clone());
        let cfg = fast_consumer()
            .with_prefetch(SLOTS)
            .with_claim_idle(claim_idle);
        let a = Worker::spawn(&qa, cfg, SLOTS, move |req: Req, job| {
            let (runs, gate) = (r.clone(), g.clone());
            async move {
                runs.hit(job.request_id());
                gate.wait().await;
                Ok(Resp {
                    i: req.i,
                    by: "a".repeat(STORED_ANSWER),
                })
            }
        })
        .await;
        // Both slots taken (it connected with every right); from now on its outcomes
        // cannot be written, its reads can.
        let r = a_runs.clone();
        eventually(Duration::from_secs(10), "both slots in work", move || {
            let r = r.clone();
            async move { r.total() == SLOTS as u32 }
        })
        .await;
        let revoke = ["ACL", "SETUSER", "stalled", "-set"];
        assert_eq!(server.cli(&revoke).trim(), "OK");
        gate.open();
        let probe = Probe::new(&server, &q).await;
        let p = probe.clone();
        eventually(Duration::from_secs(10), "entries read ahead", move || {
            let p = p.clone();
            async move { p.pending().await > SLOTS as u64 }
        })
        .await;
        let s = Stalled {
            server,
            q,
            producer,
            tickets,
            a_runs,
            probe,
        };
        s.handled_only_its_slots();
        (s, a)
    }

    fn handled_only_its_slots(&self) {
        assert_eq!(
            self.a_runs.total(),
            SLOTS as u32,
            "the stalled consumer ({SLOTS} slots) handled entries it read ahead: {:?}",
            self.a_runs.snapshot()
        );
    }

    /// Every request handled exactly once in `runs` (runs per request id), nothing left
    /// pending.
    async fn each_handled_once(&self, runs: &std::collections::HashMap<String, u32>) {
        assert_eq!(runs.len(), STALLED_REQUESTS as usize, "{runs:?}");
        assert!(
            runs.values().all(|&n| n == 1),
            "a request handled twice: {runs:?}"
        );
        assert_eq!(self.probe.pending().await, 0, "entries left pending");
    }

    /// Every ticket's answer.
    async fn answers(&mut self, limit: Duration) {
        for (i, t) in self.tickets.drain(..) {
            let out = within(limit, "an answer", t).await.expect("answered");
            assert_eq!(out.i, i);
        }
    }
}

/// `pelican_deliveries_handed_back_total` of queue `queue` for entries read ahead.
fn handed_back(queue: &str) -> u64 {
    counter(
        "pelican_deliveries_handed_back_total",
        &[("queue", queue), ("why", "read_ahead")],
    )
}

/// Entries read ahead whose slots do not come free within a quarter of `claim_idle` (the
/// writer retrying a failed call) are handed back: counted, never handled by the stalled
/// consumer, and taken as soon as they are released, long before `claim_idle` would have
/// made them reclaimable. Every request is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_read_ahead_whose_slots_stay_taken_are_handed_back_and_handled_once() {
    let claim_idle = Duration::from_secs(12);
    let started = Instant::now();
    let (mut s, a) = Stalled::start(claim_idle).await;
    let name = s.q.name.clone();
    eventually(
        Duration::from_secs(10),
        "entries handed back (a quarter of claim_idle after they were read)",
        move || {
            let name = name.clone();
            async move { handed_back(&name) > 0 }
        },
    )
    .await;
    s.handled_only_its_slots();
    // The writer's next try goes through: its outcomes, then the releases.
    let restore = ["ACL", "SETUSER", "stalled", "+set"];
    assert_eq!(s.server.cli(&restore).trim(), "OK");
    let b_cfg = fast_consumer().with_claim_idle(claim_idle);
    let (b, b_runs) = Worker::counting(&s.q, b_cfg, "b").await;
    s.answers(Duration::from_secs(20)).await;
    let took = started.elapsed();
    assert!(
        took < claim_idle - Duration::from_secs(2),
        "answered after {took:?}: the entries read ahead waited for claim_idle ({claim_idle:?})"
    );
    let mut runs = s.a_runs.snapshot();
    for (rid, n) in b_runs.snapshot() {
        *runs.entry(rid).or_default() += n;
    }
    s.each_handled_once(&runs).await;
    b.stop().await;
    a.stop().await;
    s.producer.shutdown().await.unwrap();
}

/// A consumer stopped while entries it read ahead wait for slots (its writer failing)
/// leaves them, and the deliveries whose outcomes it could not write, for another
/// consumer to take at once: the entries read ahead are handed back, each request is
/// handled once by the other consumer, long before `claim_idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_entries_wait_for_slots_leaves_them_for_another_at_once() {
    let claim_idle = Duration::from_secs(30);
    let (mut s, a) = Stalled::start(claim_idle).await;
    let stopped = Instant::now();
    within(
        Duration::from_secs(15),
        "the stalled consumer's shutdown",
        a.stop(),
    )
    .await;
    assert!(
        handed_back(&s.q.name) > 0,
        "the entries read ahead were not handed back"
    );
    s.handled_only_its_slots();
    let b_cfg = fast_consumer().with_claim_idle(claim_idle);
    let (b, b_runs) = Worker::counting(&s.q, b_cfg, "b").await;
    s.answers(Duration::from_secs(20)).await;
    let took = stopped.elapsed();
    assert!(
        took < claim_idle / 2,
        "answered {took:?} after the stop: the entries waited for claim_idle ({claim_idle:?})"
    );
    s.each_handled_once(&b_runs.snapshot()).await;
    b.stop().await;
    s.producer.shutdown().await.unwrap();
}
