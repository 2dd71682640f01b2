//! Fault 4: poison requests (`crash-if:poison`: the worker that takes one aborts) among
//! normal ones, several workers, crashed workers replaced as a supervisor would. After
//! `max_deliveries` each poison request is in the dead-letter stream with its reason
//! and its caller got `Dead`; the normal requests keep flowing meanwhile, and none of
//! them is dead-lettered for having shared a worker with a poison request.

use crate::common::*;
use pelican::Admin;
use pelican_testkit::unique_name;
use std::time::{Duration, Instant};

const WORKERS: usize = 3;
const CONCURRENCY: u32 = 16;
const CLAIM_IDLE_MS: u64 = 800;
const MAX_DELIVERIES: u32 = 3;
const IN_FLIGHT: usize = 100;

/// Every 500th request is poison, the first one early.
fn poison(i: u64) -> bool {
    i % 500 == 100
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_and_normal_requests_flow() {
    let _one_at_a_time = serial().await;
    let long = soak();
    let n: u64 = if long { 50_000 } else { 2_500 };
    let server = server();
    let url = server.url();
    let queue = unique_name("poison");
    let spec = WorkerSpec::new(&url, &queue)
        .handler("crash-if:poison,sleep:20")
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS)
        .max_deliveries(MAX_DELIVERIES);
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let timeout = Duration::from_secs(60);
    let p = producer(queue_config(&url, &queue), timeout).await;
    let spy = ReplySpy::start(&url, &queue, p.id()).await;
    let progress = Progress::default();
    let mut load = LoadSpec::new("poison", n, IN_FLIGHT, timeout);
    load.poison = poison;
    let poisoned = (0..n).filter(|i| poison(*i)).count() as u64;
    let task = tokio::spawn(drive(p.clone(), load, progress.clone()));

    // The supervisor: a worker that crashed is replaced. Meanwhile, normal requests
    // must keep being answered: the longest stretch without a single answer is
    // recorded (a stall would mean poison stopped the queue).
    let started = Instant::now();
    let mut last_progress = (0, Instant::now());
    let mut longest_stall = Duration::ZERO;
    while !task.is_finished() {
        fleet.replace_crashed();
        let done = progress.get();
        if done != last_progress.0 {
            longest_stall = longest_stall.max(last_progress.1.elapsed());
            last_progress = (done, Instant::now());
        }
        // polling the fleet and the load's progress, not waiting for an event
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = task.await.expect("load task");
    let duration = started.elapsed();
    let spied = spy.finish().await;
    eprintln!("poison: {}", report.one_line());
    eprintln!(
        "poison: {} crashes, longest stall {longest_stall:?}, spy {spied:?}",
        fleet.crashes
    );

    let admin = Admin::connect(queue_config(&url, &queue))
        .await
        .expect("admin");
    let dead = admin.dead_letters(1000).await.expect("dead letters");
    fleet.replace_crashed();
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let (redelivered, max_delivery) = {
        let log = fleet.log.lock().unwrap();
        (log.redelivered, log.max_delivery)
    };
    let left = assert_only_outcomes_remain(&url, &queue, true).await;

    let mut s = Summary::new(
        "poison requests (crash-if) among normal ones",
        &format!(
            "{WORKERS} workers x {CONCURRENCY}, handler crash-if:poison,sleep:20, {IN_FLIGHT} in flight, 1 in 500 poison, max_deliveries {MAX_DELIVERIES}, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.account(duration, n, &report, spied.duplicated);
    s.reruns = redelivered;
    s.set("poison", poisoned)
        .set("poison_dead", report.poison_dead)
        .set("dead_letters", dead.len() as u64)
        .set("worker_crashes", fleet.crashes)
        .set("longest_stall_s", longest_stall.as_secs_f64())
        .set("max_delivery", max_delivery)
        .set("submit_retries", report.submit_retries)
        .set("cached_outcomes_left", left.outcomes);
    s.emit();

    assert_eq!(report.hung, 0, "{}", report.one_line());
    assert_eq!(report.poison_dead, poisoned, "{}", report.one_line());
    assert_eq!(
        report.ok,
        n - poisoned,
        "normal requests must all be answered: {}",
        report.one_line()
    );
    assert_eq!(report.lost(), 0, "{}", report.one_line());
    assert_eq!(report.resolved_twice + spied.duplicated, 0);
    assert_eq!(
        dead.len() as u64,
        poisoned,
        "dead letters: {:#?}",
        dead.iter()
            .map(|d| (&d.reason, d.deliveries))
            .collect::<Vec<_>>()
    );
    for d in &dead {
        assert!(
            report
                .poison_rids
                .contains(&d.rid.clone().unwrap_or_default()),
            "a normal request was dead-lettered: {d:?}"
        );
        assert!(
            d.reason.contains("max_deliveries") && d.deliveries >= u64::from(MAX_DELIVERIES),
            "{d:?}"
        );
    }
    // Every poison request crashed a worker at each of its deliveries; one crash may
    // take two poison requests at once.
    assert!(
        fleet.crashes >= u64::from(MAX_DELIVERIES)
            && fleet.crashes <= poisoned * u64::from(MAX_DELIVERIES),
        "{} crashes for {poisoned} poison requests",
        fleet.crashes
    );
    assert!(
        longest_stall < Duration::from_secs(5),
        "normal requests stalled for {longest_stall:?}"
    );
}
