//! Fault 8: a queue spread over a Redis Cluster (6 partitions on 3 masters), served by
//! `pelican worker` processes, this process as the producer, with a backlog in the
//! streams (more requests in flight than handler slots) the whole time.
//!
//! - `reshardings_under_load_lose_nothing`: partition slots moved to another master with
//!   all their keys (stream, indexes, cached outcomes, reply streams, stored bodies) as
//!   `redis-cli --cluster reshard` does; every other move holds the slot half moved for
//!   a second first (the old master answers `ASK` and `TRYAGAIN`), and during some of
//!   those holds a worker is SIGKILLed (its replacement starts mid-migration).
//! - `masters_killed_under_load_lose_nothing`: two masters SIGKILLed one after the other
//!   (3 masters with a replica each, AOF always); their replicas take over.
//!
//! Each runs with dedup on, then off; every tenth request carries 8 KiB (a stored body
//! with dedup on, the producer's own connection without) and is answered with it (a
//! stored answer). The load keeps going until the faults are over and a tail of
//! requests is answered after them. Every caller is answered once with its own response;
//! the memory check runs on every partition's master at the end (without dedup no stored
//! answer may be left: the producer deletes each once read, also across a move). (The reply spy of the
//! one-node scenarios reads one node's stream, which a resharding moves; a duplicate push
//! would show here as a caller resolved twice, which the load counts.)
//!
//! Short: 6 moves (each partition once, 2 kills) / 2 failovers, a few thousand requests.
//! Long (`PELICAN_SOAK=1`): 60 moves every 2-5 s (a kill every fifth) / 2 failovers 20 s
//! apart, with 60 s of load after the last fault.

use crate::common::*;
use pelican::admin::Keys;
use pelican_testkit::{eventually, unique_name, RedisCluster};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const PARTITIONS: u32 = 6;
const MASTERS: usize = 3;
const WORKERS: usize = 3;
/// 3 x 48 handler slots against 400 requests in flight: the rest waits in the streams.
const CONCURRENCY: u32 = 48;
const IN_FLIGHT: usize = 400;
const CLAIM_IDLE_MS: u64 = 1500;
/// How long a half-moved slot is held (the scenario's duration, not a wait).
const HOLD: Duration = Duration::from_secs(1);
/// Answers awaited between two faults of the short variants: the queue is seen working
/// again before the next one.
const BETWEEN: u64 = 800;
/// Answers awaited after the last fault of the short variants.
const TAIL: u64 = 2_000;
/// More requests than any run submits: the scenario stops the load (`LoadSpec::stop`).
const OPEN_ENDED: u64 = 5_000_000;
/// Every tenth request carries this many bytes more.
const PAD: usize = 8192;
/// How long the load may take to give the next batch of answers before the test calls
/// the queue stalled.
const STALL_LIMIT: Duration = Duration::from_secs(60);

fn spec(url: &str, queue: &str) -> WorkerSpec {
    WorkerSpec::new(url, queue)
        .handler("sleep:20")
        .concurrency(CONCURRENCY)
        .claim_idle(CLAIM_IDLE_MS)
        .env("PELICAN_PARTITIONS", &PARTITIONS.to_string())
}

/// Waits until `progress` has reached `at` answers; panics if the load stalls.
async fn answers(progress: &Progress, at: u64, what: &str) {
    let what = format!("{at} answers ({what})");
    eventually(STALL_LIMIT, &what, || async { progress.get() >= at }).await;
}

/// The stream key of partition `p`: its slot is the partition's.
pub(crate) fn stream_of(queue: &str, p: u32) -> String {
    Keys::partition(PREFIX, queue, p, PARTITIONS)
        .stream()
        .to_string()
}

/// Each partition's keys with a connection to the master that serves them now.
pub(crate) async fn partition_masters(
    cluster: &RedisCluster,
    queue: &str,
) -> Vec<(Keys, redis::aio::MultiplexedConnection)> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let names = Keys::partition(PREFIX, queue, p, PARTITIONS);
        let node = &cluster.nodes()[cluster.master_of(names.stream())];
        let c = raw_conn(&node.url())
            .await
            .expect("a connection to a master");
        out.push((names, c));
    }
    out
}

/// Waits (30 s deadline) until every partition's stream is empty, the workers still
/// running. After a failover the new master may hold entries whose
/// completion the old one had not passed on yet: pending with a consumer that finished
/// them, they are reclaimed after claim_idle and run again (counted as re-runs), and the
/// finished entries behind them are trimmed then.
pub(crate) async fn settled(cluster: &RedisCluster, queue: &str) {
    eventually(
        Duration::from_secs(30),
        "every partition's stream to empty",
        || async {
            for (names, mut c) in partition_masters(cluster, queue).await {
                let len: u64 = redis::cmd("XLEN")
                    .arg(names.stream())
                    .query_async(&mut c)
                    .await
                    .expect("XLEN");
                if len > 0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// Waits (30 s deadline) until no partition holds a stored answer, the producer still
/// running. Without dedup the producer deletes each stored answer it reads, and the answer
/// of an outcome it no longer waits for; a DEL refused because its slot was moving is
/// sent again after a backoff (`Undeleted`, in the producer's `answers.rs`), which may
/// come after the load has ended. On a timeout, the answers left are printed with their
/// ttl (how long ago they were written: the ttl is the result ttl and a minute).
async fn read_answers_deleted(cluster: &RedisCluster, queue: &str) {
    let left = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _report = LeftOnPanic(left.clone());
    eventually(
        Duration::from_secs(30),
        "the stored answers read to be deleted",
        || async {
            let mut found = Vec::new();
            for (names, mut c) in partition_masters(cluster, queue).await {
                let mut cursor = 0u64;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(names.body("a*"))
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut c)
                        .await
                        .expect("SCAN");
                    for k in keys {
                        let ttl: i64 = redis::cmd("PTTL")
                            .arg(&k)
                            .query_async(&mut c)
                            .await
                            .expect("PTTL");
                        found.push(format!("{k} (ttl {ttl} ms)"));
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            let done = found.is_empty();
            *left.lock().unwrap() = found;
            done
        },
    )
    .await;
}

/// Prints the stored answers last seen if the wait for their deletion panics.
struct LeftOnPanic(Arc<std::sync::Mutex<Vec<String>>>);

impl Drop for LeftOnPanic {
    fn drop(&mut self) {
        if let (true, Ok(left)) = (std::thread::panicking(), self.0.lock()) {
            eprintln!("stored answers left: {left:#?}");
        }
    }
}

/// The memory check of a partitioned queue: every partition's keys on the master that
/// serves them now, and the queue's own tag (only the record of its partition count).
pub(crate) async fn cluster_leftovers(cluster: &RedisCluster, queue: &str) -> Leftovers {
    let all = cluster_leftovers_unchecked(cluster, queue, false).await;
    all.assert_clean(queue);
    all
}

/// [`cluster_leftovers`] without the check: what is left, for the caller to report first
/// (dead letters counted as such when `dead_allowed`, else as keys left behind).
pub(crate) async fn cluster_leftovers_unchecked(
    cluster: &RedisCluster,
    queue: &str,
    dead_allowed: bool,
) -> Leftovers {
    let mut all = Leftovers::default();
    let mut names: Vec<Keys> = (0..PARTITIONS)
        .map(|p| Keys::partition(PREFIX, queue, p, PARTITIONS))
        .collect();
    names.push(Keys::new(PREFIX, queue));
    for n in &names {
        let node = &cluster.nodes()[cluster.master_of(n.stream())];
        let mut c = raw_conn(&node.url())
            .await
            .expect("a connection to a master");
        let l = leftovers_of(&mut c, n, dead_allowed).await;
        all.outcomes += l.outcomes;
        all.answers += l.answers;
        all.consumers = all.consumers.max(l.consumers);
        all.bad.extend(l.bad);
    }
    all
}

fn on_off(dedup: bool) -> &'static str {
    if dedup {
        "on"
    } else {
        "off"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshardings_under_load_lose_nothing() {
    let _one_at_a_time = serial().await;
    for dedup in [true, false] {
        reshardings(dedup).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_killed_under_load_lose_nothing() {
    let _one_at_a_time = serial().await;
    for dedup in [true, false] {
        failovers(dedup).await;
    }
}

/// One scenario's run: the cluster, the worker processes, this process's producer and
/// its open-ended load (every tenth request padded).
struct Run {
    name: &'static str,
    long: bool,
    dedup: bool,
    queue: String,
    /// Taken by the faults (they run on blocking threads) and given back.
    cluster: Option<RedisCluster>,
    fleet: Fleet,
    producer: JsonProducer,
    progress: Progress,
    stop: Arc<AtomicBool>,
    load: tokio::task::JoinHandle<LoadReport>,
    started: Instant,
}

/// How a run ended, and what it left.
struct Ending {
    report: LoadReport,
    duration: Duration,
    settle_s: f64,
    left: Leftovers,
}

impl Run {
    async fn start(name: &'static str, cluster: RedisCluster, dedup: bool) -> Run {
        let url = cluster.cluster_url();
        let queue = unique_name(&format!("{name}-{}", on_off(dedup)));
        let fleet = Fleet::start(spec(&url, &queue), WORKERS).await;
        let timeout = Duration::from_secs(60);
        let producer = producer_with(
            queue_config(&url, &queue).with_partitions(PARTITIONS),
            timeout,
            dedup,
        )
        .await;
        let progress = Progress::default();
        let mut load = LoadSpec::new(name, OPEN_ENDED, IN_FLIGHT, timeout);
        load.pad = PAD;
        load.padded = |i| i % 10 == 0;
        let stop = load.stop.clone();
        let load = tokio::spawn(drive(producer.clone(), load, progress.clone()));
        Run {
            name,
            long: soak(),
            dedup,
            queue,
            cluster: Some(cluster),
            fleet,
            producer,
            progress,
            stop,
            load,
            started: Instant::now(),
        }
    }

    /// Runs `fault` on the cluster on a blocking thread (the testkit's calls block).
    async fn on_cluster<T: Send + 'static>(
        &mut self,
        fault: impl FnOnce(&mut RedisCluster) -> T + Send + 'static,
    ) -> T {
        let mut c = self.cluster.take().expect("the cluster");
        let (c, out) = tokio::task::spawn_blocking(move || {
            let out = fault(&mut c);
            (c, out)
        })
        .await
        .expect("a fault on the cluster");
        self.cluster = Some(c);
        out
    }

    /// Waits for the next fault: `BETWEEN` more answers (the soak: `soak_pause`).
    async fn before_a_fault(&self, soak_pause: Duration, what: &str) {
        if self.long {
            // the soak's pace
            tokio::time::sleep(soak_pause).await;
        } else {
            answers(&self.progress, self.progress.get() + BETWEEN, what).await;
        }
    }

    /// The tail after the last fault, then the load stops; the queue settles, the
    /// workers and the producer stop, and the memory check runs.
    async fn finish(mut self) -> (Ending, Fleet) {
        if self.long {
            // the soak: a minute of load after the last fault
            tokio::time::sleep(Duration::from_secs(60)).await;
        } else {
            let at = self.progress.get() + TAIL;
            answers(&self.progress, at, "after the last fault").await;
        }
        self.stop.store(true, Ordering::SeqCst);
        let report = self.load.await.expect("load task");
        let duration = self.started.elapsed();
        eprintln!("cluster-{}: {}", self.name, report.one_line());
        let cluster = self.cluster.take().expect("the cluster");
        let settling = Instant::now();
        settled(&cluster, &self.queue).await;
        if !self.dedup {
            read_answers_deleted(&cluster, &self.queue).await;
        }
        let settle_s = settling.elapsed().as_secs_f64();
        self.fleet.stop().await;
        self.producer.shutdown().await.expect("producer shutdown");
        let left = cluster_leftovers(&cluster, &self.queue).await;
        let ending = Ending {
            report,
            duration,
            settle_s,
            left,
        };
        (ending, self.fleet)
    }
}

impl Ending {
    /// Emits the run's summary line (the scenario adds its own fields with `extra`), then
    /// asserts what every caller must have got.
    fn close(
        &self,
        fleet: &Fleet,
        fault: &str,
        setup: &str,
        dedup: bool,
        extra: impl FnOnce(&mut Summary),
    ) {
        let (rerun_requests, redelivered, max_delivery) = {
            let log = fleet.log.lock().unwrap();
            (log.rerun().0, log.redelivered, log.max_delivery)
        };
        let mut s = Summary::new(
            fault,
            &format!(
                "{setup}; {PARTITIONS} partitions, dedup {}; {WORKERS} workers x {CONCURRENCY}, handler sleep:20, {IN_FLIGHT} in flight (every tenth {PAD} B), claim_idle {CLAIM_IDLE_MS} ms",
                on_off(dedup)
            ),
        );
        s.account(self.duration, self.report.requests, &self.report, 0);
        s.reruns = redelivered;
        s.set("requests_run_twice_or_more", rerun_requests)
            .set("max_delivery", max_delivery)
            .set("submit_retries", self.report.submit_retries)
            .set("max_latency_s", self.report.max_latency.as_secs_f64())
            .set("cached_outcomes_left", self.left.outcomes)
            .set("stored_answers_left", self.left.answers)
            .set("settled_after_s", self.settle_s)
            .set("consumers_left", self.left.consumers);
        extra(&mut s);
        s.emit();
        self.assert_every_caller_answered(fleet, dedup);
    }

    /// What every caller must have got, what the workers must not have done, and what
    /// must not be left in Redis.
    fn assert_every_caller_answered(&self, fleet: &Fleet, dedup: bool) {
        let report = &self.report;
        assert!(report.requests > 0);
        assert_eq!(report.ok, report.requests, "{}", report.one_line());
        assert_eq!(report.lost(), 0, "{}", report.one_line());
        assert_eq!(report.hung, 0, "{}", report.one_line());
        assert_eq!(report.resolved_twice, 0, "{}", report.one_line());
        assert_eq!(
            fleet.panics(),
            0,
            "a worker panicked:\n{}",
            fleet.stderr_tails()
        );
        if !dedup {
            assert_eq!(
                self.left.answers, 0,
                "stored answers read but left in Redis"
            );
            assert_eq!(self.left.outcomes, 0, "outcomes cached without dedup");
        }
    }
}

async fn reshardings(dedup: bool) {
    let mut rng = Rng::new("cluster-reshard");
    let mut run = Run::start("reshard", RedisCluster::start(MASTERS), dedup).await;
    let moves: usize = if run.long { 60 } else { PARTITIONS as usize };
    let (mut held, mut killed_in_hold) = (0u64, 0u64);
    for k in 0..moves {
        let pause = Duration::from_millis(rng.range(2000, 5000));
        run.before_a_fault(pause, "before a move").await;
        let key = stream_of(&run.queue, (k % PARTITIONS as usize) as u32);
        let hold = k % 2 == 1;
        let kill = hold && if run.long { k % 5 == 0 } else { k % 4 == 1 };
        let moving = run
            .on_cluster(move |c| {
                let from = c.master_of(&key);
                c.begin_slot_move(&key, (from + 1) % MASTERS)
            })
            .await;
        if hold {
            held += 1;
            if kill {
                let pid = run.fleet.kill_one(&mut rng);
                killed_in_hold += 1;
                eprintln!("cluster-reshard: SIGKILLed worker {pid} while a slot moves");
            }
            // the scenario: the slot stays half moved this long
            tokio::time::sleep(HOLD).await;
        }
        run.on_cluster(move |c| c.finish_slot_move(&moving)).await;
        eprintln!(
            "cluster-reshard: move {} of {moves} done after {} answers ({:.1}s)",
            k + 1,
            run.progress.get(),
            run.started.elapsed().as_secs_f64()
        );
    }
    let (ending, fleet) = run.finish().await;
    ending.close(
        &fleet,
        "Redis Cluster reshardings under load (worker processes)",
        "3 masters",
        dedup,
        |s| {
            s.set("slot_moves", moves as u64)
                .set("held_half_moved", held)
                .set("hold_ms", HOLD.as_millis() as u64)
                .set("workers_killed_mid_move", killed_in_hold);
        },
    );
    assert_eq!(fleet.kills, killed_in_hold);
    assert!(killed_in_hold > 0, "no worker was killed mid-move");
}

async fn failovers(dedup: bool) {
    let cluster = RedisCluster::start_with(
        MASTERS,
        1,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let mut run = Run::start("failover", cluster, dedup).await;
    let mut failover_s = Vec::new();
    for k in 0..2 {
        run.before_a_fault(Duration::from_secs(20), "before a failover")
            .await;
        let queue = run.queue.clone();
        let t = Instant::now();
        let port = run
            .on_cluster(move |c| {
                // A partition whose master still has a replica to take over (the first
                // kill leaves its shard with none).
                let key = (0..PARTITIONS)
                    .map(|p| stream_of(&queue, p))
                    .find(|key| !c.replicas_of(c.master_of(key)).is_empty())
                    .expect("a master with a replica");
                let victim = c.kill_master_of(&key);
                c.nodes()[victim].port()
            })
            .await;
        failover_s.push(t.elapsed().as_secs_f64());
        eprintln!(
            "cluster-failover: master on port {port} killed, replica promoted ({} of 2, after {} answers, {:.1}s)",
            k + 1,
            run.progress.get(),
            run.started.elapsed().as_secs_f64()
        );
    }
    let (ending, fleet) = run.finish().await;
    ending.close(
        &fleet,
        "Redis Cluster masters SIGKILLed under load (worker processes)",
        "3 masters + 3 replicas, appendfsync always",
        dedup,
        |s| {
            s.set("failovers", 2u64).set("failover_s", failover_s);
        },
    );
}
