//! `pelican demo`: the whole system in one run. Producers submit a mix of requests with
//! duplicates to worker processes (children of this binary); one worker is SIGKILLed
//! mid-run and its work is taken over by the others; then one poison request crashes
//! every worker that takes it until it is dead-lettered. Live progress, then a summary
//! table of measured numbers. Needs nothing but Redis, and starts a throwaway
//! `redis-server` when none answers at the default URL.
//!
//! Layout, in the order a run goes: `throwaway` (which Redis), `start` (worker processes,
//! producers), `load_phase` (the load, with `load` for what the producers submit and `kill`
//! for the worker killed mid-run), `poison` (the dead letter), `cleanup`. Throughout:
//! `events` (what the workers report, and the progress bar showing it) and `say` (output).
//! This file holds the entry point and the state every phase shares.

mod cleanup;
mod events;
mod kill;
mod load;
mod load_phase;
mod poison;
mod say;
mod start;
mod throwaway;

use crate::cli::{DemoArgs, Global};
use crate::exit::{CliError, CliResult};
use crate::pool::{Event, Pool};
use crate::redis_url::RedisUrl;
use crate::summary::Summary;
use load::Load;
use pelican::{Admin, Producer, QueueConfig};
use say::Say;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Runs the demo.
pub async fn run(g: &Global, args: &DemoArgs) -> CliResult {
    let started = Instant::now();
    g.queue_config()?;
    let out = Say::new(g.json);
    let (url, local) = throwaway::redis_for_demo(g, args, &out).await?;
    let name = format!("{}-{}-{}", g.queue, std::process::id(), unix_secs());
    let queue = QueueConfig::new(url.as_str(), name.clone());
    queue.validate().map_err(|e| g.error(&e))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::failure(format!("cannot find this program's path: {e}")))?;
    let handler = format!("crash-if:poison,sleep:{}", args.handler_ms);
    let (pool, events) = Pool::new(exe, start::worker_args(args, &url, &name, &handler));
    out.say(format!(
        "pelican demo: queue {name} on {}\n  {} producers submit {} requests (some identical: \
         dedup) to {} worker processes (`pelican worker --handler {handler}`);\n  one worker is \
         killed mid-run, then a poison request crashes every worker that takes it until it \
         is dead-lettered.",
        url.redacted(),
        args.producers,
        args.requests,
        args.workers
    ));
    let mut demo = Demo {
        args: args.clone(),
        queue,
        url,
        throwaway: local.is_some(),
        out,
        pool,
        events,
        producers: Vec::new(),
        tasks: Vec::new(),
        admin: None,
        load: Arc::new(Load::default()),
        seen: Seen::default(),
        kill: kill::Kill::default(),
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
        outln!("{}", summary.json());
    } else {
        outln!(
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

/// What one run has and knows; every phase is a method on it, in its own file.
struct Demo {
    args: DemoArgs,
    queue: QueueConfig,
    url: RedisUrl,
    /// Whether Redis is a throwaway server the demo started.
    throwaway: bool,
    out: Say,
    /// The worker processes, and what they report.
    pool: Pool,
    events: mpsc::UnboundedReceiver<Event>,
    producers: Vec<Producer<Value, Value>>,
    /// The producers' load tasks.
    tasks: Vec<JoinHandle<()>>,
    /// Connected once the workers are ready.
    admin: Option<Admin>,
    /// What the producers measured.
    load: Arc<Load>,
    /// What the workers reported.
    seen: Seen,
    /// The worker killed on purpose.
    kill: kill::Kill,
    /// Set by the clean-up: worker exits are expected from then on.
    stopping: bool,
}

/// What the workers reported, counted.
#[derive(Debug, Default)]
struct Seen {
    /// Requests handled.
    handled: u64,
    /// Of them, deliveries after the first (taken over from a dead worker).
    recovered: u64,
    /// Worker processes that died without being killed by the demo.
    crashes: u64,
}

impl Demo {
    /// The whole run, up to the summary (the clean-up is the caller's).
    async fn play(&mut self, started: Instant) -> CliResult<Summary> {
        self.start(started).await?;
        self.load_phase().await?;
        let (poison_deliveries, poison_dead_callers) = self.poison_phase().await?;
        self.summary(poison_deliveries, poison_dead_callers).await
    }

    /// Every number of the run, for the table (the wall time is the caller's).
    async fn summary(
        &self,
        poison_deliveries: u64,
        poison_dead_callers: u64,
    ) -> CliResult<Summary> {
        let st = self.admin().stats().await.map_err(|e| self.error(&e))?;
        let load = &self.load;
        let mut latencies = load.latencies_ms.lock().unwrap().clone();
        latencies.sort_by(f64::total_cmp);
        Ok(Summary {
            queue: self.queue.name.clone(),
            redis: self.url.redacted(),
            throwaway: self.throwaway,
            producers: self.args.producers,
            requests: self.args.requests + 2,
            joined: load.joined.load(Ordering::Relaxed),
            cached: load.cached.load(Ordering::Relaxed),
            answered: load.answered.load(Ordering::Relaxed),
            failed: load.failed.load(Ordering::Relaxed),
            entries: st.entries_added,
            handled: self.seen.handled,
            recovered: self.seen.recovered,
            workers: self.args.workers,
            started: self.pool.started() as u64,
            killed: self.kill.victim,
            crashes: self.seen.crashes,
            dead_letters: st.dead_letters,
            poison_deliveries,
            poison_dead_callers,
            latencies_ms: latencies,
            claim_idle_ms: self.args.claim_idle,
            wall_ms: 0.0,
        })
    }

    /// The admin connection; the phases that use it run after `play` connected it.
    fn admin(&self) -> &Admin {
        self.admin.as_ref().expect("connected")
    }

    /// A library error, with advice for the demo's queue.
    fn error(&self, e: &pelican::Error) -> CliError {
        CliError::from_pelican(e, self.url.as_str(), &self.queue.name)
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
