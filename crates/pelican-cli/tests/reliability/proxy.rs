//! Fault 3: connections cut, stalled and slowed by a TCP proxy (pelican-testkit's)
//! between every client and Redis: the producer (this process) and each worker process
//! have a proxy of their own, so one of them can be cut off alone. Under load:
//!
//! 1. every connection cut, three times;
//! 2. one worker blackholed for three times claim_idle: its leases expire, the others
//!    take its requests over, and when it comes back its late outcomes are dropped (or,
//!    where it is still first, recorded): one outcome per request, never two;
//! 3. 30 ms of latency added to every chunk, both ways;
//! 4. a full outage: every connection cut and new ones refused for 2 s; the clients
//!    reconnect with backoff (a busy loop would log thousands of warnings);
//! 5. the producer blackholed for 2 s.
//!
//! Nothing panics, nothing hangs, no request is lost, none is answered twice.

use crate::common::*;
use pelican_testkit::{eventually, unique_name, Proxy};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const WORKERS: usize = 3;
const CONCURRENCY: u32 = 32;
const CLAIM_IDLE_MS: u64 = 1000;
const IN_FLIGHT: usize = 200;
/// Warnings a worker may log during the 2 s outage: each of its loops retries with a
/// backoff from 50 ms doubling to 2 s, so a handful each.
const OUTAGE_WARNINGS_MAX: u64 = 60;

/// Answers the load must get, after a fault, before the next one: the system has
/// recovered (waited for, with a deadline) and runs undisturbed for a while.
const CALM_ANSWERS: u64 = 1_000;
/// Answers between two cuts of every connection: each cut hits reconnected, working
/// connections.
const ANSWERS_BETWEEN_CUTS: u64 = 100;
/// Longest wait for the load to flow again after a fault (reconnect backoff tops out at
/// 2 s; work held by a blackholed worker waits claim_idle).
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// Waits until `n` more requests were answered since the call: the load flows again.
async fn flowing(progress: &Progress, n: u64, after: &str) {
    let from = progress.get();
    eventually(
        RECOVERY_LIMIT,
        &format!("{n} more answers after {after}"),
        || async { progress.get() >= from + n },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_stalled_and_slow_connections() {
    let _one_at_a_time = serial().await;
    let rounds = if soak() { 20 } else { 1 };
    let server = server();
    let url = server.url();
    let queue = unique_name("proxy");
    let producer_proxy = Proxy::start(server.port());
    let worker_proxies: Vec<Proxy> = (0..WORKERS).map(|_| Proxy::start(server.port())).collect();
    let mut fleet = {
        let spec = WorkerSpec::new(&url, &queue)
            .handler("sleep:20")
            .concurrency(CONCURRENCY)
            .claim_idle(CLAIM_IDLE_MS);
        let mut f = Fleet::start(spec.clone(), 0).await;
        for proxy in &worker_proxies {
            let mut s = spec.clone();
            s.url = proxy.url();
            let mut w = WorkerProc::spawn(&s, &f.log);
            w.wait_ready(READY_LIMIT).await;
            f.workers.push(w);
        }
        f
    };
    let all = || std::iter::once(&producer_proxy).chain(worker_proxies.iter());
    let timeout = Duration::from_secs(60);
    let p = producer(queue_config(&producer_proxy.url(), &queue), timeout).await;
    // The spy reads straight from the server: it sees what was pushed, not what the
    // proxy let through.
    let spy = ReplySpy::start(&url, &queue, p.id()).await;
    let spec = LoadSpec::new("proxy", 1_000_000, IN_FLIGHT, timeout);
    let stop = spec.stop.clone();
    let progress = Progress::default();
    let load = tokio::spawn(drive(p.clone(), spec, progress.clone()));
    let started = Instant::now();
    let mut outage_warnings = Vec::new();
    for round in 0..rounds {
        flowing(&progress, CALM_ANSWERS, "the start").await;
        eprintln!("proxy[{round}]: cut every connection, 3 times");
        for _ in 0..3 {
            for x in all() {
                x.cut_all();
            }
            flowing(&progress, ANSWERS_BETWEEN_CUTS, "a cut").await;
        }
        flowing(&progress, CALM_ANSWERS, "the cuts").await;
        eprintln!("proxy[{round}]: blackhole worker 1 for 3 x claim_idle");
        worker_proxies[0].set_blackhole(true);
        tokio::time::sleep(Duration::from_millis(3 * CLAIM_IDLE_MS)).await;
        worker_proxies[0].set_blackhole(false);
        flowing(&progress, CALM_ANSWERS, "the blackhole").await;
        eprintln!("proxy[{round}]: 30 ms latency everywhere for 2 s");
        for x in all() {
            x.set_latency(Duration::from_millis(30));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for x in all() {
            x.set_latency(Duration::ZERO);
        }
        flowing(&progress, CALM_ANSWERS, "the latency").await;
        eprintln!("proxy[{round}]: full outage (cut + refuse) for 2 s");
        let before: Vec<u64> = fleet.workers.iter().map(|w| w.warnings()).collect();
        for x in all() {
            x.set_refuse(true);
            x.cut_all();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for x in all() {
            x.set_refuse(false);
        }
        let during: Vec<u64> = fleet
            .workers
            .iter()
            .zip(before)
            .map(|(w, b)| w.warnings() - b)
            .collect();
        outage_warnings.push(during);
        flowing(&progress, CALM_ANSWERS, "the outage").await;
        eprintln!("proxy[{round}]: blackhole the producer for 2 s");
        producer_proxy.set_blackhole(true);
        tokio::time::sleep(Duration::from_secs(2)).await;
        producer_proxy.set_blackhole(false);
        flowing(&progress, CALM_ANSWERS, "the producer's blackhole").await;
    }
    stop.store(true, Ordering::SeqCst);
    let report = load.await.expect("load task");
    let duration = started.elapsed();
    let spied = spy.finish().await;
    eprintln!("proxy: {}", report.one_line());
    eprintln!("proxy: spy {spied:?}; warnings during the outage {outage_warnings:?}");
    let alive = fleet.all_alive();
    let panics = fleet.panics();
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let (redelivered, extra_runs) = {
        let log = fleet.log.lock().unwrap();
        (log.redelivered, log.rerun().1)
    };
    let left = assert_only_outcomes_remain(&url, &queue, false).await;

    let n = report.requests;
    let mut s = Summary::new(
        "connections cut, blackholed (> claim_idle) and slowed by a TCP proxy",
        &format!(
            "{WORKERS} workers x {CONCURRENCY} (a proxy each), handler sleep:20, {IN_FLIGHT} in flight, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.account(duration, n, &report, spied.duplicated);
    s.reruns = redelivered + extra_runs;
    s.set("submit_retries", report.submit_retries)
        .set("outcomes_pushed", spied.pairs)
        .set("spy_complete", spied.complete)
        .set("spy_missed_entries", spied.missed())
        .set("max_latency_s", report.max_latency.as_secs_f64())
        .set(
            "worker_warnings_in_2s_outage",
            format!("{outage_warnings:?}"),
        )
        .set("cached_outcomes_left", left.outcomes);
    s.emit();

    assert!(alive, "a worker died:\n{}", fleet.stderr_tails());
    assert_eq!(panics, 0);
    assert!(n > 1000, "the load hardly ran: {}", report.one_line());
    assert_eq!(report.ok, n, "{}", report.one_line());
    assert_eq!(report.lost() + report.hung, 0, "{}", report.one_line());
    assert_eq!(report.resolved_twice, 0);
    spied.assert_one_push_per_request(n);
    assert!(
        redelivered > 0,
        "the blackholed worker's requests were not taken over"
    );
    for w in outage_warnings.iter().flatten() {
        assert!(
            *w <= OUTAGE_WARNINGS_MAX,
            "a worker retried without backoff: {outage_warnings:?} warnings in 2 s"
        );
    }
}
