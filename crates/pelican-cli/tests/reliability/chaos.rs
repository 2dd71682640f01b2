//! Fault 9: the chaos soak. A queue of 6 partitions on a Redis Cluster of 3 masters with a
//! replica each, served by `pelican worker` processes, with several producers in this
//! process under steady load (with dedup, and every fifth request submitted by every
//! producer at once: identical requests that must join), while a chaos loop, at random
//! moments, does one of:
//!
//! - SIGKILL a master: its replica takes over; the old master is restarted and comes back
//!   as the new master's replica;
//! - SIGSTOP a master until its replica has taken over (longer than
//!   `cluster-node-timeout`), a little more, then SIGCONT: on waking it runs the commands
//!   waiting in its sockets as the master it believes it still is and acknowledges them,
//!   then learns it was replaced and resyncs as a replica, dropping them: writes Redis
//!   acknowledged and lost. The producers' sweep finds those requests unknown and submits
//!   them again (`pelican_requests_resubmitted_total{why="lost"}`, counted per fault);
//! - SIGKILL a worker (a new one is started at once);
//! - move the slot of one partition to another master (a resharding, held half moved for
//!   up to a second).
//!
//! Every caller is accounted for: answered with its own response, answered wrong, a typed
//! error (lost), or still waiting past its deadline (hung); and every request's handler
//! runs, from the workers' own lines (handled twice). Zero lost, zero wrong, zero hung.
//!
//! Variants: pelican's lean connections (the default), the client library's alone
//! (`PELICAN_LEAN_CONNECTIONS=0` for the workers, `with_lean_connections(false)` for the
//! producers), and `min-replicas-to-write 1` (`min-replicas-max-lag 2`) on the lean path.
//!
//! Short (CI): the four faults once each, in a random order, within about 20 s of chaos.
//! `PELICAN_SOAK=1`: 10 minutes of chaos, a fault every 4-12 s; `PELICAN_SOAK_SECS=N`
//! sets the chaos time (either form). The counts are printed as a table at the end, and
//! as the suite's `RELIABILITY {json}` line.

use crate::cluster::{cluster_leftovers_unchecked, settled, stream_of, PARTITIONS};
use crate::common::*;
use pelican::admin::Keys;
use pelican_testkit::{eventually, unique_name, RedisCluster};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

const MASTERS: usize = 3;
const WORKERS: usize = 3;
const CONCURRENCY: u32 = 32;
/// Producers in this process; every fifth request is submitted by each of them at once.
const PRODUCERS: usize = 3;
/// Requests in flight (an identical request submitted by every producer counts once).
const IN_FLIGHT: usize = 200;
const CLAIM_IDLE_MS: u64 = 1500;
const HANDLER: &str = "sleep:10";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Chaos time of the short variant (it also runs each fault once, however long that takes).
const SHORT_SECS: u64 = 20;
/// Chaos time of the soak.
const LONG_SECS: u64 = 600;
/// Answers awaited after the last fault: the queue is seen working again.
const TAIL: u64 = 1_000;
/// How long the load may take to give the next batch of answers before the test calls the
/// queue stalled.
const STALL_LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_loses_nothing() {
    let _one_at_a_time = serial().await;
    chaos(Variant {
        lean: true,
        min_replicas: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_loses_nothing_library_connections() {
    let _one_at_a_time = serial().await;
    chaos(Variant {
        lean: false,
        min_replicas: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_loses_nothing_with_min_replicas_to_write() {
    let _one_at_a_time = serial().await;
    chaos(Variant {
        lean: true,
        min_replicas: true,
    })
    .await;
}

#[derive(Debug, Clone, Copy)]
struct Variant {
    /// The lean connections (else the client library's alone).
    lean: bool,
    /// `min-replicas-to-write 1`, `min-replicas-max-lag 2` on every node.
    min_replicas: bool,
}

impl Variant {
    fn name(self) -> String {
        format!(
            "{} connections{}",
            if self.lean { "lean" } else { "library" },
            if self.min_replicas {
                ", min-replicas-to-write 1"
            } else {
                ""
            }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillMaster,
    PauseMaster,
    KillWorker,
    MoveSlot,
}

const FAULTS: [Fault; 4] = [
    Fault::KillMaster,
    Fault::PauseMaster,
    Fault::KillWorker,
    Fault::MoveSlot,
];

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::KillMaster => "master SIGKILLed",
            Fault::PauseMaster => "master SIGSTOPped",
            Fault::KillWorker => "worker SIGKILLed",
            Fault::MoveSlot => "slot moved",
        }
    }
}

/// Seconds of chaos: `PELICAN_SOAK_SECS`, else 10 minutes under `PELICAN_SOAK=1`, else
/// the short form's.
fn chaos_secs() -> u64 {
    match std::env::var("PELICAN_SOAK_SECS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("PELICAN_SOAK_SECS={v:?} is not a number of seconds")),
        Err(_) if soak() => LONG_SECS,
        Err(_) => SHORT_SECS,
    }
}

/// The producers' counters (`pelican_requests_resubmitted_total`), read from a
/// Prometheus recorder installed once for this test binary.
fn recorder() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder in this test binary")
    })
}

/// Requests the producers of `queue` submitted again because Redis had lost them.
fn resubmitted_lost(queue: &str) -> u64 {
    let text = recorder().render();
    text.lines()
        .filter(|l| l.starts_with("pelican_requests_resubmitted_total{"))
        .filter(|l| l.contains(&format!("queue=\"{queue}\"")) && l.contains("why=\"lost\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// What became of the load's callers.
#[derive(Default)]
struct Tally {
    /// Calls made (each producer's submission of a shared request counts).
    calls: u64,
    /// Distinct requests.
    requests: u64,
    /// Requests submitted by every producer at once.
    shared: u64,
    ok: u64,
    wrong: u64,
    hung: u64,
    errors: BTreeMap<String, u64>,
    submit_retries: u64,
    longest_wait: Duration,
    /// Each request's id, and whether it was shared.
    rids: Vec<(String, bool)>,
}

impl Tally {
    fn lost(&self) -> u64 {
        self.errors.values().sum()
    }

    fn add(&mut self, r: One) {
        self.calls += 1;
        self.submit_retries += r.retries;
        self.longest_wait = self.longest_wait.max(r.latency);
        match r.fate {
            Fate::Ok => self.ok += 1,
            Fate::Wrong => self.wrong += 1,
            Fate::Hung => self.hung += 1,
            Fate::Error(k) => *self.errors.entry(k).or_default() += 1,
        }
    }
}

/// Keeps `IN_FLIGHT` requests going until `stop`: request `i` is submitted by producer
/// `i % PRODUCERS`, or, every fifth, by every producer at once (identical bodies: one
/// request id, which dedup joins).
async fn load(producers: Vec<JsonProducer>, spec: LoadSpec, progress: Progress) -> Tally {
    let spec = Arc::new(spec);
    let limit = Arc::new(Semaphore::new(IN_FLIGHT));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut tasks = JoinSet::new();
    for i in 0.. {
        let permit = limit.clone().acquire_owned().await.expect("never closed");
        if spec.stop.load(Ordering::SeqCst) {
            break;
        }
        let shared = i % 5 == 0;
        let callers: Vec<JsonProducer> = if shared {
            producers.clone()
        } else {
            vec![producers[i as usize % PRODUCERS].clone()]
        };
        let (spec, tally, progress) = (spec.clone(), tally.clone(), progress.clone());
        tasks.spawn(async move {
            let mut calls = JoinSet::new();
            for p in callers {
                let spec = spec.clone();
                calls.spawn(async move { one(&p, &spec, i).await });
            }
            let mut rid = None;
            while let Some(r) = calls.join_next().await {
                let r = r.expect("a caller's task");
                if rid.is_none() {
                    rid = r.rid.clone();
                }
                tally.lock().unwrap().add(r);
            }
            let mut t = tally.lock().unwrap();
            t.requests += 1;
            t.shared += u64::from(shared);
            if let Some(rid) = rid {
                t.rids.push((rid, shared));
            }
            drop(t);
            progress.bump();
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            if let Err(e) = r {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let t = std::mem::take(&mut *tally.lock().unwrap());
    t
}

/// What the chaos loop did, per fault.
#[derive(Default)]
struct Faults {
    done: BTreeMap<Fault, u64>,
    /// Seconds from the fault to the cluster (or the fleet) being whole again.
    recovery_s: BTreeMap<Fault, Vec<f64>>,
    /// Requests submitted again because Redis had lost them, counted from the fault to
    /// the next one.
    resubmitted_lost: BTreeMap<Fault, u64>,
    /// The fault whose window is open, and the counter at its start.
    window: Option<(Fault, u64)>,
}

impl Faults {
    /// Gives what was submitted again since the open window's start (`now`: the counter
    /// now) to its fault.
    fn close_window(&mut self, now: u64) {
        if let Some((f, at)) = self.window.take() {
            *self.resubmitted_lost.entry(f).or_default() += now.saturating_sub(at);
        }
    }
}

async fn chaos(variant: Variant) {
    let recorder = recorder();
    let secs = chaos_secs();
    let name = variant.name();
    let mut rng = Rng::new(&format!("chaos ({name})"));
    let mut args = vec!["--appendonly", "no"];
    if variant.min_replicas {
        args.extend([
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "2",
        ]);
    }
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(MASTERS, 1, &args))
        .await
        .expect("the cluster starts");
    let url = cluster.cluster_url();
    let queue = unique_name("chaos");
    let spec = WorkerSpec::new(&url, &queue)
        .handler(HANDLER)
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS)
        .env("PELICAN_PARTITIONS", &PARTITIONS.to_string())
        .env(
            "PELICAN_LEAN_CONNECTIONS",
            if variant.lean { "1" } else { "0" },
        );
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let q = queue_config(&url, &queue)
            .with_partitions(PARTITIONS)
            .with_lean_connections(variant.lean);
        producers.push(producer_with(q, REQUEST_TIMEOUT, true).await);
    }
    let progress = Progress::default();
    let spec = LoadSpec::new(&queue, u64::MAX, IN_FLIGHT, REQUEST_TIMEOUT);
    let stop = spec.stop.clone();
    let load = tokio::spawn(load(producers.clone(), spec, progress.clone()));
    let started = Instant::now();
    // The longest time without a single answer (a stall), sampled every 100 ms.
    let pause = Arc::new(Mutex::new((Duration::ZERO, 0.0f64)));
    let watch = {
        let (progress, pause, stop) = (progress.clone(), pause.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut last, mut since) = (progress.get(), Instant::now());
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = progress.get();
                if now != last {
                    (last, since) = (now, Instant::now());
                }
                let mut p = pause.lock().unwrap();
                if since.elapsed() > p.0 {
                    *p = (since.elapsed(), (since - started).as_secs_f64());
                }
            }
        })
    };
    let mut cluster = Some(cluster);
    let mut faults = Faults::default();
    // Every kind once, in a random order, then at random.
    let mut order = FAULTS.to_vec();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.range(0, k as u64 + 1) as usize);
    }
    let deadline = started + Duration::from_secs(secs);
    let (gap_lo, gap_hi) = if secs > SHORT_SECS {
        (4_000, 12_000)
    } else {
        (1_000, 3_000)
    };
    let mut n = 0;
    while n < order.len() || Instant::now() < deadline {
        // the chaos's pace: a random moment, not a wait for anything
        tokio::time::sleep(Duration::from_millis(rng.range(gap_lo, gap_hi))).await;
        let fault = order
            .get(n)
            .copied()
            .unwrap_or(FAULTS[rng.range(0, 4) as usize]);
        n += 1;
        let key = stream_of(&queue, rng.range(0, u64::from(PARTITIONS)) as u32);
        // What the producers submitted again since the previous fault's start is that
        // fault's (their sweep finds a lost request within an interval or two).
        let lost_now = resubmitted_lost(&queue);
        faults.close_window(lost_now);
        faults.window = Some((fault, lost_now));
        let t = Instant::now();
        let mut c = cluster.take().expect("the cluster");
        let what = match fault {
            Fault::KillWorker => {
                let pid = fleet.kill_one(&mut rng);
                format!("worker {pid}")
            }
            Fault::KillMaster => {
                let (back, what) = tokio::task::spawn_blocking(move || {
                    let victim = c.kill_master_of(&key);
                    c.restart_as_replica(victim);
                    let port = c.nodes()[victim].port();
                    (c, format!("master on port {port}, back as a replica"))
                })
                .await
                .expect("a master killed");
                c = back;
                what
            }
            Fault::PauseMaster => {
                let extra = Duration::from_millis(rng.range(1_500, 3_000));
                let (back, what) = tokio::task::spawn_blocking(move || {
                    let victim = c.pause_master_of(&key);
                    let taken_over = t.elapsed();
                    // the scenario: it stays stopped this much longer
                    std::thread::sleep(extra);
                    c.resume(victim);
                    let port = c.nodes()[victim].port();
                    let what = format!(
                        "master on port {port} stopped {:.1} s (replaced after {:.1} s), back as a replica",
                        (taken_over + extra).as_secs_f64(),
                        taken_over.as_secs_f64()
                    );
                    (c, what)
                })
                .await
                .expect("a master paused");
                c = back;
                what
            }
            Fault::MoveSlot => {
                let pick = rng.next();
                let hold = Duration::from_millis(rng.range(0, 1_000));
                let (back, what) = tokio::task::spawn_blocking(move || {
                    let from = c.master_of(&key);
                    let others: Vec<usize> =
                        c.masters().into_iter().filter(|&m| m != from).collect();
                    assert!(!others.is_empty(), "another master to move a slot to");
                    let to = others[pick as usize % others.len()];
                    let moving = c.begin_slot_move(&key, to);
                    // the scenario: the slot stays half moved this long
                    std::thread::sleep(hold);
                    c.finish_slot_move(&moving);
                    let what = format!(
                        "{key} from port {} to {}",
                        c.nodes()[from].port(),
                        c.nodes()[to].port()
                    );
                    (c, what)
                })
                .await
                .expect("a slot moved");
                c = back;
                what
            }
        };
        cluster = Some(c);
        let took = t.elapsed().as_secs_f64();
        *faults.done.entry(fault).or_default() += 1;
        faults.recovery_s.entry(fault).or_default().push(took);
        eprintln!(
            "chaos ({name}): {:.1}s, {} answered: {} ({what}), whole again after {took:.1} s",
            started.elapsed().as_secs_f64(),
            progress.get(),
            fault.label()
        );
        recorder.run_upkeep();
    }
    let chaos_s = started.elapsed().as_secs_f64();
    // The tail: the queue answers again after the last fault.
    let at = progress.get() + TAIL;
    eventually(
        STALL_LIMIT,
        &format!("{at} answers after the chaos"),
        || async { progress.get() >= at },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let tally = load.await.expect("the load");
    watch.await.expect("the stall watch");
    let (longest_pause, pause_at) = *pause.lock().unwrap();
    let duration = started.elapsed();
    let cluster = cluster.take().expect("the cluster");
    settled(&cluster, &queue).await;
    // Lost requests found after the last fault are its.
    faults.close_window(resubmitted_lost(&queue));
    fleet.stop().await;
    for p in producers {
        p.shutdown().await.expect("producer shutdown");
    }
    // Dead letters are checked below, one by one.
    let left = cluster_leftovers_unchecked(&cluster, &queue, true).await;
    let dead = dead_letters(&cluster, &queue).await;

    // Handler runs per request, from the workers' own lines.
    let (runs, twice, shared_twice, never_ran) = {
        let log = fleet.log.lock().unwrap();
        let mut twice = 0u64;
        let mut shared_twice = 0u64;
        let mut never_ran = 0u64;
        for (rid, shared) in &tally.rids {
            match log.runs_of(rid) {
                0 => never_ran += 1,
                1 => {}
                _ => {
                    twice += 1;
                    shared_twice += u64::from(*shared);
                }
            }
        }
        (log.runs, twice, shared_twice, never_ran)
    };
    let total_lost_resubmits = resubmitted_lost(&queue);
    let count = |f: Fault| faults.done.get(&f).copied().unwrap_or(0);
    let resub = |f: Fault| faults.resubmitted_lost.get(&f).copied().unwrap_or(0);
    let range = |f: Fault| {
        let v = faults.recovery_s.get(&f).cloned().unwrap_or_default();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{lo:.1}-{hi:.1} s")
        }
    };
    println!(
        "\nchaos soak ({name}): {:.0} s of chaos, {:.1} s in all\n\
         | fault | times | whole again after | lost requests submitted again |\n\
         |---|---|---|---|\n\
         | master SIGKILLed (restarted as a replica) | {} | {} | {} |\n\
         | master SIGSTOPped, then SIGCONTed | {} | {} | {} |\n\
         | worker SIGKILLed (restarted) | {} | {} | {} |\n\
         | slot moved | {} | {} | {} |\n\n\
         | submitted (calls) | requests | answered | answered wrong | lost | hung | handled twice (of them shared) | longest wait |\n\
         |---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {} | {} | {} | {} ({}) | {:.1} s |\n\
         shared requests (submitted by {PRODUCERS} producers at once): {}; handler runs {}; \
         submissions refused and retried: {}; lost requests submitted again: {total_lost_resubmits}; \
         longest time without an answer: {:.1} s (from {pause_at:.0} s); dead letters: {}\n",
        chaos_s,
        duration.as_secs_f64(),
        count(Fault::KillMaster),
        range(Fault::KillMaster),
        resub(Fault::KillMaster),
        count(Fault::PauseMaster),
        range(Fault::PauseMaster),
        resub(Fault::PauseMaster),
        count(Fault::KillWorker),
        range(Fault::KillWorker),
        resub(Fault::KillWorker),
        count(Fault::MoveSlot),
        range(Fault::MoveSlot),
        resub(Fault::MoveSlot),
        tally.calls,
        tally.requests,
        tally.ok,
        tally.wrong,
        tally.lost(),
        tally.hung,
        twice,
        shared_twice,
        tally.longest_wait.as_secs_f64(),
        tally.shared,
        runs,
        tally.submit_retries,
        longest_pause.as_secs_f64(),
        dead.len(),
    );
    let mut s = Summary::new(
        &format!("chaos soak on a Redis Cluster ({name})"),
        &format!(
            "3 masters + 3 replicas, no persistence; {PARTITIONS} partitions, dedup on; {PRODUCERS} producers, every fifth request from all at once; {WORKERS} workers x {CONCURRENCY}, handler {HANDLER}, {IN_FLIGHT} in flight, claim_idle {CLAIM_IDLE_MS} ms"
        ),
    );
    s.duration = duration;
    s.requests = tally.calls;
    s.lost = tally.lost();
    s.hung = tally.hung;
    s.duplicates = tally.wrong;
    s.reruns = twice;
    s.set("distinct_requests", tally.requests)
        .set("answered", tally.ok)
        .set("wrong", tally.wrong)
        .set("errors", format!("{:?}", tally.errors))
        .set("handled_twice", twice)
        .set("shared_handled_twice", shared_twice)
        .set("shared_requests", tally.shared)
        .set("handler_runs", runs)
        .set("longest_wait_s", tally.longest_wait.as_secs_f64())
        .set("submit_retries", tally.submit_retries)
        .set("masters_killed", count(Fault::KillMaster))
        .set("masters_paused", count(Fault::PauseMaster))
        .set("workers_killed", count(Fault::KillWorker))
        .set("slots_moved", count(Fault::MoveSlot))
        .set("resubmitted_lost", total_lost_resubmits)
        .set("resubmitted_lost_after_pause", resub(Fault::PauseMaster))
        .set("resubmitted_lost_after_kill", resub(Fault::KillMaster))
        .set("longest_pause_s", longest_pause.as_secs_f64())
        .set("longest_pause_from_s", pause_at)
        .set("cached_outcomes_left", left.outcomes)
        .set("chaos_s", chaos_s);
    s.set("dead_letters", dead.len() as u64);
    s.emit();
    for d in &dead {
        eprintln!("chaos ({name}): dead letter: {d}");
    }

    assert!(tally.calls > 0);
    let tails = fleet.stderr_tails();
    assert_eq!(tally.lost(), 0, "lost: {:?}\n{tails}", tally.errors);
    assert_eq!(tally.wrong, 0, "answered wrong");
    assert_eq!(tally.hung, 0, "hung\n{tails}");
    assert_eq!(tally.ok, tally.calls);
    assert_eq!(never_ran, 0, "requests answered without a handler run");
    assert_eq!(
        fleet.panics(),
        0,
        "a worker panicked:\n{}",
        fleet.stderr_tails()
    );
    for f in FAULTS {
        assert!(count(f) > 0, "{} never happened", f.label());
    }
    left.assert_clean(&queue);
    // A known fault (RELIABILITY.md, "Notes and limits"): after a failover an entry is
    // sometimes delivered max_deliveries times without an outcome and dead-lettered
    // although its request was answered (its caller got its own response: no caller was
    // lost, checked above). Such a dead letter is tolerated and counted; any other is not.
    let answered: std::collections::HashSet<&str> =
        tally.rids.iter().map(|(rid, _)| rid.as_str()).collect();
    for d in &dead {
        let rid = d
            .split(" head=")
            .nth(1)
            .and_then(|h| h.split(';').next())
            .unwrap_or_default();
        assert!(
            d.contains("reason=delivered ") && answered.contains(rid),
            "a dead letter of a request not answered: {d}"
        );
    }
}

/// A stream entry as `XRANGE` gives it: its id and its fields.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

/// Every partition's dead letters (their fields), read on the master that serves it.
async fn dead_letters(cluster: &RedisCluster, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let names = Keys::partition(PREFIX, queue, p, PARTITIONS);
        let node = &cluster.nodes()[cluster.master_of(names.stream())];
        let mut c = raw_conn(&node.url())
            .await
            .expect("a connection to a master");
        let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
            .arg(names.dead())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(20)
            .query_async(&mut c)
            .await
            .expect("XRANGE of the dead letters");
        for (id, fields) in entries {
            let fields: Vec<String> = fields
                .into_iter()
                .map(|(k, v)| {
                    let v = String::from_utf8_lossy(&v);
                    format!("{k}={}", v.chars().take(200).collect::<String>())
                })
                .collect();
            out.push(format!("partition {p} {id}: {}", fields.join(" ")));
        }
    }
    out
}
