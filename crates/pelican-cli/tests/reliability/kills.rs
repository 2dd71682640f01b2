//! Fault 1: worker processes SIGKILLed at random moments while this process keeps 500
//! requests in flight (handler `sleep:20`). Every caller is answered exactly once with
//! its own response; the work the killed workers held is redelivered, and the reruns
//! are counted.
//!
//! Short: 10,000 requests, 8 kills at random points of the run. Long (`PELICAN_SOAK=1`):
//! 1,000,000 requests, a kill every 2 to 5 s.

use crate::common::*;
use pelican_testkit::unique_name;
use std::time::{Duration, Instant};

const IN_FLIGHT: usize = 500;
const WORKERS: usize = 4;
/// 4 x 128 slots: room for all 500 requests in flight.
const CONCURRENCY: u32 = 128;
const CLAIM_IDLE_MS: u64 = 1000;
const SHORT_REQUESTS: u64 = 10_000;
const SHORT_KILLS: usize = 8;
const LONG_REQUESTS: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_nothing() {
    let _one_at_a_time = serial().await;
    let long = soak();
    let n = if long { LONG_REQUESTS } else { SHORT_REQUESTS };
    let mut rng = Rng::new("kills");
    let server = server();
    let url = server.url();
    let queue = unique_name("kills");
    let spec = WorkerSpec::new(&url, &queue)
        .handler("sleep:20")
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS);
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let timeout = Duration::from_secs(if long { 120 } else { 60 });
    let p = producer(queue_config(&url, &queue), timeout).await;
    let spy = ReplySpy::start(&url, &queue, p.id()).await;
    let progress = Progress::default();
    let load = tokio::spawn(drive(
        p.clone(),
        LoadSpec::new("kills", n, IN_FLIGHT, timeout),
        progress.clone(),
    ));

    // Short: kill at random points of the run (by answers received), so every kill
    // lands while requests are in flight. Long: a kill every 2 to 5 s.
    let mut kill_at: Vec<u64> = (0..SHORT_KILLS)
        .map(|_| rng.range(n / 20, n * 17 / 20))
        .collect();
    kill_at.sort_unstable();
    let mut next_kill = Instant::now() + Duration::from_millis(rng.range(2000, 5000));
    let started = Instant::now();
    while !load.is_finished() {
        let done = progress.get();
        let due = if long {
            Instant::now() >= next_kill
        } else {
            kill_at.first().is_some_and(|k| done >= *k)
        };
        if due {
            let pid = fleet.kill_one(&mut rng);
            eprintln!(
                "kills: SIGKILLed worker {pid} after {done} answers ({:.1}s)",
                started.elapsed().as_secs_f64()
            );
            if long {
                next_kill = Instant::now() + Duration::from_millis(rng.range(2000, 5000));
            } else {
                kill_at.remove(0);
            }
        }
        // polling the progress of the load, not waiting for it to happen
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = load.await.expect("load task");
    let duration = started.elapsed();
    let spied = spy.finish().await;
    eprintln!("kills: {}", report.one_line());
    eprintln!("kills: spy {spied:?}");

    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let (rerun_requests, extra_runs, redelivered, max_delivery) = {
        let log = fleet.log.lock().unwrap();
        let (r, e) = log.rerun();
        (r, e, log.redelivered, log.max_delivery)
    };
    let left = assert_only_outcomes_remain(&url, &queue, false).await;
    let mut s = Summary::new(
        "worker processes SIGKILLed at random moments",
        &format!(
            "{WORKERS} workers x {CONCURRENCY}, handler sleep:20, {IN_FLIGHT} in flight, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.account(duration, n, &report, spied.duplicated);
    s.reruns = redelivered;
    s.set("kills", fleet.kills)
        .set("redelivered_runs", redelivered)
        .set("requests_run_twice_or_more", rerun_requests)
        .set("extra_handler_runs", extra_runs)
        .set("max_delivery", max_delivery)
        .set("submit_retries", report.submit_retries)
        .set("outcomes_pushed", spied.pairs)
        .set("spy_complete", spied.complete)
        .set("spy_missed_entries", spied.missed())
        .set("max_latency_s", report.max_latency.as_secs_f64())
        .set("cached_outcomes_left", left.outcomes)
        .set("consumers_left", left.consumers);
    s.emit();

    assert!(
        fleet.kills >= SHORT_KILLS as u64,
        "only {} kills",
        fleet.kills
    );
    assert_eq!(report.ok, n, "{}", report.one_line());
    assert_eq!(report.lost(), 0, "{}", report.one_line());
    assert_eq!(report.hung, 0, "{}", report.one_line());
    assert_eq!(report.resolved_twice, 0);
    spied.assert_one_push_per_request(n);
    assert!(
        redelivered > 0,
        "the kills stranded no work: nothing redelivered"
    );
    assert_eq!(
        fleet.panics(),
        0,
        "a worker panicked:\n{}",
        fleet.stderr_tails()
    );
}
