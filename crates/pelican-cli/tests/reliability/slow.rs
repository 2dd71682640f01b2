//! Fault 6: handlers three times slower than claim_idle, under load, with every worker
//! reclaiming. While a worker lives it keeps its leases: every request is handled
//! exactly once (delivery 1), no worker is told it lost a lease, every caller is
//! answered once.

use crate::common::*;
use pelican_testkit::unique_name;
use std::time::{Duration, Instant};

const WORKERS: usize = 3;
const CONCURRENCY: u32 = 40;
const CLAIM_IDLE_MS: u64 = 800;
const HANDLER_MS: u64 = 2_400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_keep_their_leases_under_load() {
    let _one_at_a_time = serial().await;
    let long = soak();
    // Every slot busy, twice over: 2 x 120 requests of 2.4 s each.
    let in_flight = WORKERS * CONCURRENCY as usize;
    let n = if long { 20 * in_flight } else { 2 * in_flight } as u64;
    let server = server();
    let url = server.url();
    let queue = unique_name("slow");
    let spec = WorkerSpec::new(&url, &queue)
        .handler(&format!("sleep:{HANDLER_MS}"))
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS);
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let timeout = Duration::from_secs(60);
    let p = producer(queue_config(&url, &queue), timeout).await;
    let spy = ReplySpy::start(&url, &queue, p.id()).await;
    let started = Instant::now();
    let report = drive(
        p.clone(),
        LoadSpec::new("slow", n, in_flight, timeout),
        Progress::default(),
    )
    .await;
    let duration = started.elapsed();
    let spied = spy.finish().await;
    eprintln!("slow: {}", report.one_line());
    let alive = fleet.all_alive();
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let (runs, redelivered, rerun) = {
        let log = fleet.log.lock().unwrap();
        (log.runs, log.redelivered, log.rerun())
    };
    let leases_lost = fleet.leases_lost();
    let left = assert_only_outcomes_remain(&url, &queue, false).await;

    let mut s = Summary::new(
        "handlers slower than claim_idle under load",
        &format!(
            "{WORKERS} workers x {CONCURRENCY}, handler sleep:{HANDLER_MS}, {in_flight} in flight, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.account(duration, n, &report, spied.duplicated);
    s.reruns = redelivered + rerun.1;
    s.set("handler_runs", runs)
        .set("leases_lost", leases_lost)
        .set("cached_outcomes_left", left.outcomes);
    s.emit();

    assert!(alive, "a worker died:\n{}", fleet.stderr_tails());
    assert_eq!(report.ok, n, "{}", report.one_line());
    assert_eq!(report.hung, 0);
    assert_eq!(
        (runs, redelivered, rerun),
        (n, 0, (0, 0)),
        "every request handled exactly once, at its first delivery"
    );
    assert_eq!(
        leases_lost,
        0,
        "a live worker lost a lease:\n{}",
        fleet.stderr_tails()
    );
    assert_eq!(spied.duplicated + report.resolved_twice, 0);
}
