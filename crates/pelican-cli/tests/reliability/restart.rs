//! Fault 2: Redis restarted (SIGKILL, then started again on the same port) in the
//! middle of a run; every second time it stays down for 2.5 s (longer than claim_idle).
//!
//! - With `--appendonly yes --appendfsync always`: nothing is lost. Every request whose
//!   submission Redis acknowledged is answered with its own response after the restart;
//!   submissions tried while Redis was down fail fast with a retryable error and are
//!   submitted again by their caller (`Error::is_retryable`), then answered too.
//! - With persistence off: every request outstanding at the restart resolves, with its
//!   response or a typed error, within its timeout; none hangs. The same producer and
//!   the same worker processes, none restarted, then serve new requests.

use crate::common::*;
use pelican_testkit::{unique_name, RedisServer};
use std::time::{Duration, Instant};

const WORKERS: usize = 3;
const CONCURRENCY: u32 = 64;
const CLAIM_IDLE_MS: u64 = 1000;
const IN_FLIGHT: usize = 300;
/// How long every second restart keeps Redis down.
const LONG_OUTAGE: Duration = Duration::from_millis(2_500);

struct Run {
    report: LoadReport,
    duration: Duration,
    restarts: u64,
    outage: Duration,
    redelivered: u64,
    extra_runs: u64,
    pids_kept: bool,
    after: Option<LoadReport>,
    left: Leftovers,
}

/// Runs `n` requests and restarts the server `restarts` times at even points of the
/// run; with `then`, a second load of that many new requests follows on the same
/// producer and workers.
async fn run(
    mut server: RedisServer,
    name: &str,
    n: u64,
    restarts: u64,
    timeout: Duration,
    then: Option<u64>,
) -> Run {
    let url = server.url();
    let queue = unique_name(name);
    let spec = WorkerSpec::new(&url, &queue)
        .handler("sleep:20")
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS);
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let pids = fleet.pids();
    let p = producer(queue_config(&url, &queue), timeout).await;
    let progress = Progress::default();
    let load = tokio::spawn(drive(
        p.clone(),
        LoadSpec::new(name, n, IN_FLIGHT, timeout),
        progress.clone(),
    ));
    let started = Instant::now();
    let mut done_restarts = 0;
    let mut outage = Duration::ZERO;
    while !load.is_finished() {
        if done_restarts < restarts && progress.get() >= n * (done_restarts + 1) / (restarts + 2) {
            let t = Instant::now();
            // SIGKILL, then the same port and dir; returns once it answers PONG (the
            // append-only file loaded, when there is one). Every second restart keeps
            // Redis down for longer than claim_idle: connections are refused meanwhile.
            server.kill();
            if done_restarts % 2 == 1 {
                // the injected outage, not synchronization
                std::thread::sleep(LONG_OUTAGE);
            }
            server.restart();
            outage += t.elapsed();
            done_restarts += 1;
            eprintln!(
                "{name}: Redis restarted after {} answers (down {:?})",
                progress.get(),
                t.elapsed()
            );
        }
        // polling the load's progress, not waiting for it to happen
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = load.await.expect("load task");
    let duration = started.elapsed();
    eprintln!("{name}: {}", report.one_line());
    let after = match then {
        Some(m) => {
            let r = drive(
                p.clone(),
                LoadSpec::new(&format!("{name}-after"), m, IN_FLIGHT, timeout),
                Progress::default(),
            )
            .await;
            eprintln!("{name}, after: {}", r.one_line());
            Some(r)
        }
        None => None,
    };
    let pids_kept = fleet.all_alive() && fleet.pids() == pids;
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let (redelivered, extra_runs) = {
        let log = fleet.log.lock().unwrap();
        (log.redelivered, log.rerun().1)
    };
    let left = assert_only_outcomes_remain(&url, &queue, false).await;
    drop(server);
    Run {
        report,
        duration,
        restarts: done_restarts,
        outage,
        redelivered,
        extra_runs,
        pids_kept,
        after,
        left,
    }
}

fn summary(fault: &str, persistence: &str, n: u64, r: &Run) -> Summary {
    let mut s = Summary::new(
        fault,
        &format!(
            "{persistence}; {WORKERS} workers x {CONCURRENCY}, handler sleep:20, {IN_FLIGHT} in flight, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.duration = r.duration;
    s.requests = n;
    s.hung = r.report.hung;
    s.duplicates = r.report.wrong + r.report.resolved_twice;
    s.reruns = r.redelivered + r.extra_runs;
    s.set("restarts", r.restarts)
        .set("redis_down_s", r.outage.as_secs_f64())
        .set("submit_retries", r.report.submit_retries)
        .set("typed_errors", format!("{:?}", r.report.errors))
        .set("cached_outcomes_left", r.left.outcomes);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_aof_loses_nothing() {
    let _one_at_a_time = serial().await;
    let (n, restarts) = if soak() { (200_000, 10) } else { (4_000, 2) };
    let server = RedisServer::builder().appendonly(true).start();
    let r = run(
        server,
        "restart-aof",
        n,
        restarts,
        Duration::from_secs(60),
        None,
    )
    .await;
    let mut s = summary(
        "Redis restarted mid-run (SIGKILL), AOF on",
        "appendonly yes, appendfsync always",
        n,
        &r,
    );
    s.lost = r.report.lost();
    s.emit();
    assert_eq!(r.restarts, restarts);
    assert_eq!(r.report.ok, n, "{}", r.report.one_line());
    assert_eq!(
        r.report.lost() + r.report.hung,
        0,
        "{}",
        r.report.one_line()
    );
    assert_eq!(r.report.resolved_twice, 0);
    assert!(r.pids_kept, "a worker died or was replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_resolves_everything_and_recovers() {
    let _one_at_a_time = serial().await;
    let (n, restarts, m) = if soak() {
        (200_000, 10, 20_000)
    } else {
        (4_000, 2, 1_000)
    };
    // A short timeout: requests Redis forgot must resolve within it.
    let timeout = Duration::from_secs(10);
    let r = run(
        RedisServer::start(),
        "restart-mem",
        n,
        restarts,
        timeout,
        Some(m),
    )
    .await;
    let after = r.after.clone().expect("the second load ran");
    let mut s = summary(
        "Redis restarted mid-run (SIGKILL), persistence off",
        "no persistence",
        n + m,
        &r,
    );
    // Typed errors are allowed for what Redis forgot; lost means unanswered.
    s.lost = r.report.wrong + after.lost();
    s.hung += after.hung;
    s.set("answered_ok", r.report.ok)
        .set("new_requests_after", m)
        .set("new_requests_ok", after.ok)
        .set("max_latency_s", r.report.max_latency.as_secs_f64());
    s.emit();
    assert_eq!(r.restarts, restarts);
    assert_eq!(r.report.hung, 0, "{}", r.report.one_line());
    assert_eq!(r.report.wrong + r.report.resolved_twice, 0);
    assert!(
        r.report.max_latency <= timeout + HANG_SLACK,
        "{}",
        r.report.one_line()
    );
    assert_eq!(
        r.report.ok + r.report.errors.values().sum::<u64>(),
        n,
        "every request resolved: {}",
        r.report.one_line()
    );
    assert_eq!(
        after.ok,
        m,
        "new requests after the restarts: {}",
        after.one_line()
    );
    assert!(r.pids_kept, "a worker died or was replaced");
}
