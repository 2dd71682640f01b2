//! `pelican worker`: serves the queue with a built-in handler until SIGINT/SIGTERM, then
//! shuts down gracefully (finishes or releases what it holds, leaves the group).

use crate::cli::{Global, WorkerArgs};
use crate::exit::{CliError, CliResult};
use crate::handlers::Handler;
use pelican::{Consumer, ConsumerConfig, HandlerError, Job};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{Instrument, Level};

/// Runs the worker.
pub async fn run(g: &Global, args: &WorkerArgs) -> CliResult {
    let handler = Arc::new(Handler::parse(&args.handler)?);
    let queue = g.connectable().await?;
    let metrics_addr = match args.metrics {
        Some(addr) => Some(crate::metrics_http::serve(addr).await?),
        None => None,
    };
    let prefetch = args.prefetch.unwrap_or(args.concurrency) as usize;
    let mut cfg = ConsumerConfig::default()
        .with_claim_idle(Duration::from_millis(args.claim_idle))
        .with_max_deliveries(args.max_deliveries)
        .with_prefetch(prefetch)
        .with_shutdown_timeout(Duration::from_millis(args.shutdown_timeout));
    if let Some(name) = &args.name {
        cfg = cfg.with_name(name.clone());
    }
    // Listen before connecting: a signal that arrives while we connect still stops us
    // gracefully.
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let consumer = Consumer::<Value, Value>::connect(queue, cfg)
        .await
        .map_err(|e| g.error(&e))?;
    let stop = consumer.stopper();
    let out = Arc::new(Output {
        json: g.json,
        verbose: args.verbose,
        consumer: consumer.name().to_string(),
        handled: AtomicU64::new(0),
    });
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        crate::logging::say(
            Level::INFO,
            "pelican worker: stopping: finishing the requests in hand (send the signal again \
             to exit at once)",
        );
        stop.stop();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        crate::logging::say(
            Level::WARN,
            "pelican worker: second signal: exiting now; the requests in hand are taken over \
             by other workers after claim_idle",
        );
        std::process::exit(crate::exit::FAILURE.into());
    });
    crate::logging::say(
        Level::INFO,
        &format!(
            "pelican worker: serving queue {:?} on {} as consumer {} (handler {handler}, \
         concurrency {}, claim idle {} ms, max deliveries {}){}; stop with Ctrl-C",
            g.queue,
            g.redis.redacted(),
            out.consumer,
            args.concurrency,
            args.claim_idle,
            args.max_deliveries,
            metrics_addr
                .map(|a| format!(", metrics on http://{a}/metrics"))
                .unwrap_or_default(),
        ),
    );
    out.event(json!({"event": "ready", "consumer": out.consumer, "pid": std::process::id()}));
    let served = {
        let out = out.clone();
        consumer.serve(args.concurrency as usize, move |req: Value, job: Job| {
            let handler = handler.clone();
            let out = out.clone();
            let span = tracing::info_span!(
                "request",
                rid = %job.request_id(),
                entry = %job.entry_id(),
                delivery = job.delivery_count()
            );
            async move {
                tracing::debug!("handling");
                let started = Instant::now();
                let result = handler.handle(req).await;
                out.handled(&job, &result, started.elapsed());
                result
            }
            .instrument(span)
        })
    };
    served.await.map_err(|e| g.error(&e))?;
    let handled = out.handled.load(Ordering::Relaxed);
    crate::logging::say(
        Level::INFO,
        &format!("pelican worker: stopped after handling {handled} requests"),
    );
    out.event(json!({"event": "stopped", "consumer": out.consumer, "handled": handled}));
    Ok(())
}

fn signal_error(e: std::io::Error) -> CliError {
    CliError::failure(format!("cannot listen for signals: {e}"))
}

/// The worker's data lines on stdout (with --verbose).
struct Output {
    json: bool,
    verbose: bool,
    consumer: String,
    handled: AtomicU64,
}

impl Output {
    /// A lifecycle event, printed only with `--verbose --json` (humans get it on stderr).
    fn event(&self, v: Value) {
        if self.verbose && self.json {
            outln!("{v}");
        }
    }

    fn handled(&self, job: &Job, result: &Result<Value, HandlerError>, took: Duration) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        if self.verbose {
            crate::handlers::print_handled(
                self.json,
                &self.consumer,
                &[("rid", job.request_id()), ("entry", job.entry_id())],
                job.delivery_count(),
                result,
                took,
            );
        }
    }
}
