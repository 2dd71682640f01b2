//! `pelican demo`: the whole system in one run. Producers submit a mix of requests with
//! duplicates to worker processes (children of this binary); one worker is SIGKILLed
//! mid-run and its work is taken over by the others; then one poison request crashes
//! every worker that takes it until it is dead-lettered. Live progress, then a summary
//! table of measured numbers. Needs nothing but Redis, and starts a throwaway
//! `redis-server` when none answers at the default URL.

mod load;
mod say;

use crate::cli::{DemoArgs, Global, DEFAULT_REDIS_URL};
use crate::exit::{CliError, CliResult};
use crate::pool::{Event, Pool};
use crate::redis_local::{self, LocalRedis, Unreachable};
use crate::summary::Summary;
use load::{plan, produce, seed, Load};
use pelican::config::redacted_url;
use pelican::{Admin, ErrorKind, Producer, ProducerConfig, QueueConfig};
use say::Say;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long the producers take to submit the load (they pace themselves).
const LOAD_SPREAD: Duration = Duration::from_millis(2500);
/// The share of the load resolved when a worker is killed.
const KILL_AT: f64 = 0.35;
/// How long the workers may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the poison may take to be dead-lettered.
const POISON_TIMEOUT: Duration = Duration::from_secs(60);
/// Replacement workers allowed beyond the crashes the demo causes.
const SPARE_RESTARTS: usize = 10;
/// How long workers get to stop gracefully at the end.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a producer waits for any one response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the demo.
pub async fn run(g: &Global, args: &DemoArgs) -> CliResult {
    let started = Instant::now();
    g.queue_config()?;
    let out = Say::new(g.json);
    let (url, local) = redis_for_demo(g, args, &out).await?;
    let name = format!("{}-{}-{}", g.queue, std::process::id(), unix_secs());
    let queue = QueueConfig::new(url.clone(), name.clone());
    queue.validate().map_err(|e| g.error(&e))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::failure(format!("cannot find this program's path: {e}")))?;
    let handler = format!("crash-if:poison,sleep:{}", args.handler_ms);
    let worker_args: Vec<String> = [
        "--redis",
        &url,
        "--queue",
        &name,
        "--json",
        "worker",
        "--handler",
        &handler,
        "--concurrency",
        &args.concurrency.to_string(),
        "--claim-idle",
        &args.claim_idle.to_string(),
        "--max-deliveries",
        &args.max_deliveries.to_string(),
        "--verbose",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (pool, events) = Pool::new(exe, worker_args);
    out.say(format!(
        "pelican demo: queue {name} on {}\n  {} producers submit {} requests (some identical: \
         dedup) to {} worker processes (`pelican worker --handler {handler}`);\n  one worker is \
         killed mid-run, then a poison request crashes every worker that takes it until it \
         is dead-lettered.",
        redacted_url(&url),
        args.producers,
        args.requests,
        args.workers
    ));
    let mut demo = Demo {
        args: args.clone(),
        queue,
        url: url.clone(),
        throwaway: local.is_some(),
        out,
        pool,
        events,
        producers: Vec::new(),
        tasks: Vec::new(),
        admin: None,
        load: Arc::new(Load::default()),
        handled: 0,
        recovered: 0,
        crashes: 0,
        killed: None,
        count_held_of: None,
        killed_gone: false,
        stopping: false,
    };
    let result = tokio::select! {
        r = demo.play(started) => r,
        _ = crate::process::interrupted() => Err(CliError::failure(
            "interrupted: stopped the demo's workers and removed its keys",
        )),
    };
    demo.cleanup().await;
    drop(local);
    let mut summary = result?;
    summary.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    if g.json {
        println!("{}", summary.json());
    } else {
        println!(
            "\nsummary (every number measured in this run):\n{}",
            summary.table()
        );
    }
    if summary.failed > 0 {
        return Err(CliError::failure(format!(
            "{} requests failed during the demo (see the table); run with -v for logs",
            summary.failed
        )));
    }
    Ok(())
}

/// Uses the Redis at --redis; starts a throwaway one when asked to, or when nothing
/// answers at the default URL and `redis-server` is on PATH.
async fn redis_for_demo(
    g: &Global,
    args: &DemoArgs,
    out: &Say,
) -> CliResult<(String, Option<LocalRedis>)> {
    let start = |why: String| async move {
        let bin = redis_local::find_redis_server().ok_or_else(|| {
            CliError::failure(
                "--throwaway-redis needs redis-server on PATH: install Redis (Debian/Ubuntu: \
                 `sudo apt-get install redis-server`; macOS: `brew install redis`)",
            )
        })?;
        let local = LocalRedis::start(&bin).await?;
        out.say(format!(
            "{why}; started a throwaway redis-server at {} for this demo (it is stopped at \
             the end)",
            local.url()
        ));
        Ok::<_, CliError>(local)
    };
    if args.throwaway_redis {
        let local = start("--throwaway-redis".into()).await?;
        return Ok((local.url(), Some(local)));
    }
    let url = g.redis.as_str();
    match redis_local::probe(url).await {
        Ok(()) => Ok((url.to_string(), None)),
        Err(Unreachable::Down(cause)) if url == DEFAULT_REDIS_URL => {
            if redis_local::find_redis_server().is_none() {
                return Err(redis_local::how_to_get_redis(
                    url,
                    &Unreachable::Down(cause),
                ));
            }
            let local = start(format!("No Redis answered at {url} ({cause})")).await?;
            Ok((local.url(), Some(local)))
        }
        Err(why) => Err(redis_local::unreachable_error(url, &why)),
    }
}

struct Demo {
    args: DemoArgs,
    queue: QueueConfig,
    url: String,
    throwaway: bool,
    out: Say,
    pool: Pool,
    events: mpsc::UnboundedReceiver<Event>,
    producers: Vec<Producer<Value, Value>>,
    tasks: Vec<JoinHandle<()>>,
    admin: Option<Admin>,
    load: Arc<Load>,
    handled: u64,
    recovered: u64,
    crashes: u64,
    /// The worker killed on purpose, and what it held.
    killed: Option<(usize, u64)>,
    /// The killed worker's consumer name, until its pending entries are counted after
    /// its death (exact: nobody takes them over before its leases run out).
    count_held_of: Option<String>,
    /// The killed worker's exit has been seen.
    killed_gone: bool,
    stopping: bool,
}

impl Demo {
    async fn play(&mut self, started: Instant) -> CliResult<Summary> {
        let workers = self.args.workers as usize;
        for _ in 0..workers {
            self.pool.spawn()?;
        }
        self.wait_ready(workers).await?;
        self.out.say(format!(
            "{workers} workers ready after {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        let cfg = ProducerConfig::default().with_request_timeout(REQUEST_TIMEOUT);
        for _ in 0..self.args.producers {
            let p = Producer::<Value, Value>::connect(self.queue.clone(), cfg.clone())
                .await
                .map_err(|e| self.error(&e))?;
            self.producers.push(p);
        }
        self.admin = Some(
            Admin::connect(self.queue.clone())
                .await
                .map_err(|e| self.error(&e))?,
        );
        self.load_phase().await?;
        let (poison_deliveries, poison_dead_callers) = self.poison_phase().await?;
        let admin = self.admin.as_ref().expect("connected");
        let st = admin.stats().await.map_err(|e| self.error(&e))?;
        let load = &self.load;
        let mut latencies = load.latencies_ms.lock().unwrap().clone();
        latencies.sort_by(f64::total_cmp);
        Ok(Summary {
            queue: self.queue.name.clone(),
            redis: redacted_url(&self.url),
            throwaway: self.throwaway,
            producers: self.args.producers,
            requests: self.args.requests + 2,
            joined: load.joined.load(Ordering::Relaxed),
            cached: load.cached.load(Ordering::Relaxed),
            answered: load.answered.load(Ordering::Relaxed),
            failed: load.failed.load(Ordering::Relaxed),
            entries: st.entries_added,
            handled: self.handled,
            recovered: self.recovered,
            workers: self.args.workers,
            started: self.pool.started() as u64,
            killed: self.killed,
            crashes: self.crashes,
            dead_letters: st.dead_letters,
            poison_deliveries,
            poison_dead_callers,
            latencies_ms: latencies,
            claim_idle_ms: self.args.claim_idle,
            wall_ms: 0.0,
        })
    }

    fn error(&self, e: &pelican::Error) -> CliError {
        CliError::from_pelican(e, &self.url, &self.queue.name)
    }

    async fn wait_ready(&mut self, n: usize) -> CliResult {
        let deadline = tokio::time::sleep(READY_TIMEOUT);
        tokio::pin!(deadline);
        while self.pool.counts().1 < n {
            tokio::select! {
                ev = self.events.recv() => {
                    let Some(ev) = ev else { break };
                    if let Event::Exited { stderr, status, .. } = &ev {
                        return Err(CliError::failure(format!(
                            "a worker process exited before it was ready ({}): {}",
                            status.map(|s| s.to_string()).unwrap_or_default(),
                            stderr.join(" | ")
                        )));
                    }
                    self.on_event(ev)?;
                }
                _ = &mut deadline => {
                    return Err(CliError::failure(format!(
                        "the worker processes were not ready within {READY_TIMEOUT:?}; run \
                         `pelican worker --queue {} -v` to see why",
                        self.queue.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The producers submit the load; a worker is killed once a share of it is done.
    async fn load_phase(&mut self) -> CliResult {
        let total = self.args.requests;
        let plans = plan(self.args.producers as usize, total as usize, seed());
        let per = plans.iter().map(Vec::len).max().unwrap_or(1).max(1) as u32;
        let interval = (LOAD_SPREAD / per).max(Duration::from_millis(1));
        for (p, plan) in self.producers.iter().zip(plans) {
            self.tasks.push(tokio::spawn(produce(
                p.clone(),
                plan,
                interval,
                self.load.clone(),
            )));
        }
        self.out.bar.set_length(total);
        self.out.bar.set_prefix("load");
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut kill_tried = false;
        loop {
            tokio::select! {
                Some(ev) = self.events.recv() => self.on_event(ev)?,
                _ = tick.tick() => {
                    self.update_bar();
                    let resolved = self.load.resolved.load(Ordering::Relaxed);
                    if !kill_tried && resolved as f64 >= total as f64 * KILL_AT {
                        kill_tried = self.try_kill().await?;
                    }
                    if self.killed_gone {
                        self.count_held().await?;
                    }
                    if resolved >= total {
                        break;
                    }
                }
            }
        }
        self.update_bar();
        if self.killed.is_none() {
            self.out
                .say("no worker held any request when it was time to kill one; none was killed");
        }
        if let Some(e) = self.load.first_error.lock().unwrap().as_ref() {
            self.out.say(format!("a request failed: {e}"));
        }
        Ok(())
    }

    /// Kills the live worker that holds the most requests; true once done (or pointless).
    async fn try_kill(&mut self) -> CliResult<bool> {
        let admin = self.admin.as_ref().expect("connected");
        let st = admin.stats().await.map_err(|e| self.error(&e))?;
        let best = st
            .consumers
            .iter()
            .filter_map(|c| self.pool.by_consumer(&c.name).map(|slot| (slot, c.pending)))
            .max_by_key(|(_, pending)| *pending);
        let Some((slot, held)) = best.filter(|(_, held)| *held > 0) else {
            return Ok(false);
        };
        let Some(w) = self.pool.get(slot).cloned() else {
            return Ok(false);
        };
        if !self.pool.signal(slot, libc::SIGKILL) {
            return Ok(false);
        }
        self.killed = Some((slot, held));
        self.count_held_of = w.consumer;
        self.out.say(format!(
            "killed worker {slot} (pid {}) with SIGKILL while it was busy; the other workers \
             take its requests over once its leases run out (claim idle {} ms)",
            w.pid, self.args.claim_idle
        ));
        Ok(true)
    }

    /// Counts what the killed worker held when it died: its pending entries, before
    /// anyone takes them over.
    async fn count_held(&mut self) -> CliResult {
        self.killed_gone = false;
        let (Some(name), Some((slot, _))) = (self.count_held_of.take(), self.killed) else {
            return Ok(());
        };
        let admin = self.admin.as_ref().expect("connected");
        let st = admin.stats().await.map_err(|e| self.error(&e))?;
        if let Some(c) = st.consumers.iter().find(|c| c.name == name) {
            self.killed = Some((slot, c.pending));
            self.out.say(format!(
                "worker {slot} died holding {} request{} (XPENDING)",
                c.pending,
                if c.pending == 1 { "" } else { "s" }
            ));
        }
        Ok(())
    }

    /// Two producers submit the same poison request; both must get Dead. Returns the
    /// dead letter's delivery count and how many callers got Dead.
    async fn poison_phase(&mut self) -> CliResult<(u64, u64)> {
        let poison = json!({"task": "poison", "poison": true});
        self.out.say(
            "submitting a poison request from two producers (one stream entry: dedup); every \
             worker that takes it crashes",
        );
        self.out.bar.set_prefix("poison");
        let a = self.producers[0].clone();
        let b = self.producers[1 % self.producers.len()].clone();
        let t1 = a.submit(&poison).await.map_err(|e| self.error(&e))?;
        let t2 = b.submit(&poison).await.map_err(|e| self.error(&e))?;
        self.load.submitted(t1.submitted());
        self.load.submitted(t2.submitted());
        let waiter = tokio::spawn(async move { (t1.await, t2.await) });
        tokio::pin!(waiter);
        let deadline = tokio::time::sleep(POISON_TIMEOUT);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let (r1, r2) = loop {
            tokio::select! {
                Some(ev) = self.events.recv() => self.on_event(ev)?,
                _ = tick.tick() => self.update_bar(),
                r = &mut waiter => break r.map_err(|e| CliError::failure(format!("poison waiter: {e}")))?,
                _ = &mut deadline => return Err(CliError::failure(format!(
                    "the poison request was not dead-lettered within {POISON_TIMEOUT:?}; look \
                     at `pelican stats --queue {}`", self.queue.name
                ))),
            }
        };
        let mut dead_callers = 0;
        for r in [&r1, &r2] {
            match r {
                Err(e) if e.kind() == ErrorKind::Dead => dead_callers += 1,
                Err(e) => self.out.say(format!("a poison caller got: {e}")),
                Ok(v) => self
                    .out
                    .say(format!("a poison caller got a response?! {v}")),
            }
        }
        if let Err(e) = &r1 {
            self.out.say(format!("both callers got: {e}"));
        }
        let admin = self.admin.as_ref().expect("connected");
        let letters = admin.dead_letters(100).await.map_err(|e| self.error(&e))?;
        let deliveries = letters
            .iter()
            .find(|d| d.body_preview.contains("poison"))
            .map(|d| d.deliveries)
            .unwrap_or(0);
        Ok((deliveries, dead_callers))
    }

    fn on_event(&mut self, ev: Event) -> CliResult {
        self.pool.observe(&ev);
        match ev {
            Event::Ready { slot, .. } => {
                if slot > self.args.workers as usize {
                    let pid = self.pool.get(slot).map(|w| w.pid).unwrap_or(0);
                    self.out.say(format!("worker {slot} (pid {pid}) is up"));
                }
            }
            Event::Handled { delivery, .. } => {
                self.handled += 1;
                if delivery > 1 {
                    self.recovered += 1;
                }
            }
            Event::Exited {
                slot,
                pid,
                status,
                stderr,
            } => {
                if self.stopping {
                    return Ok(());
                }
                let how = status
                    .map(|s| {
                        use std::os::unix::process::ExitStatusExt;
                        match s.signal() {
                            Some(sig) => crate::process::signal_name(sig),
                            None => s.to_string(),
                        }
                    })
                    .unwrap_or_else(|| "unknown status".into());
                if self.killed.map(|k| k.0) == Some(slot) {
                    self.killed_gone = true;
                    self.out
                        .say(format!("worker {slot} (pid {pid}) is gone ({how})"));
                } else {
                    self.crashes += 1;
                    let why = stderr
                        .iter()
                        .rev()
                        .find(|l| l.contains("crash-if"))
                        .or(stderr.last())
                        .map(|l| l.trim_start_matches("pelican worker: ").to_string())
                        .unwrap_or_default();
                    let why = why.split(';').next().unwrap_or_default();
                    self.out
                        .say(format!("worker {slot} (pid {pid}) crashed ({how}): {why}"));
                }
                let limit = self.args.workers as usize
                    + self.args.max_deliveries as usize
                    + 1
                    + SPARE_RESTARTS;
                if self.pool.started() >= limit {
                    return Err(CliError::failure(format!(
                        "worker processes keep dying; the last one said: {}",
                        stderr.join(" | ")
                    )));
                }
                let new = self.pool.spawn()?;
                self.out
                    .say(format!("started worker {new} in place of worker {slot}"));
            }
        }
        Ok(())
    }

    fn update_bar(&self) {
        let l = &self.load;
        let (live, ready) = self.pool.counts();
        self.out
            .bar
            .set_position(l.resolved.load(Ordering::Relaxed));
        self.out.bar.set_message(format!(
            "answered · new {} · joined {} · cached {} · handled {} · recovered {} · workers {ready}/{live}{}",
            l.queued.load(Ordering::Relaxed),
            l.joined.load(Ordering::Relaxed),
            l.cached.load(Ordering::Relaxed),
            self.handled,
            self.recovered,
            if self.crashes > 0 {
                format!(" · crashes {}", self.crashes)
            } else {
                String::new()
            }
        ));
    }

    /// Stops everything the demo started, in order: producers, workers (gracefully, then
    /// by force), the queue's keys.
    async fn cleanup(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for p in self.producers.drain(..) {
            let _ = p.shutdown().await;
        }
        self.stopping = true;
        self.pool.signal_all(libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut forced = false;
        while self.pool.counts().0 > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(10)), self.events.recv())
                .await
            {
                Ok(Some(ev)) => {
                    let _ = self.on_event(ev);
                }
                Ok(None) => break,
                Err(_) if !forced => {
                    self.pool.signal_all(libc::SIGKILL);
                    forced = true;
                }
                Err(_) => break,
            }
            if forced && Instant::now() > deadline + Duration::from_secs(2) {
                break;
            }
        }
        self.out.bar.finish_and_clear();
        if let Some(admin) = &self.admin {
            if self.args.keep && !self.throwaway {
                self.out.say(format!(
                    "kept the demo queue: `pelican stats --queue {}`",
                    self.queue.name
                ));
            } else if let Err(e) = admin.destroy().await {
                self.out
                    .say(format!("could not remove the demo queue's keys: {e}"));
            }
        }
    }
}
fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
