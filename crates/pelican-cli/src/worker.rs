//! `pelican worker`: serves the queue until SIGINT/SIGTERM, then shuts down gracefully
//! (finishes or releases what it holds, leaves the group). The handler is a built-in one
//! (`handlers.rs`) or a program in any language (`--exec`, `--http`: `external/`).

use crate::cli::{BodyCodec, Global, WorkerArgs};
use crate::exit::{CliError, CliResult};
use crate::external::{self, Body, BodyKind, External};
use crate::handlers::Handler;
use pelican::{Bytes, Codec, Consumer, ConsumerConfig, HandlerError, Job, Json, QueueConfig, Raw};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{Instrument, Level};

/// Runs the worker.
pub async fn run(g: &Global, args: &WorkerArgs) -> CliResult {
    let ext = &args.external;
    let builtin = if ext.exec.is_none() && ext.http.is_none() {
        if args.codec == BodyCodec::Raw {
            return Err(CliError::usage(
                "--codec raw needs --exec or --http: the built-in handlers take JSON",
            ));
        }
        Some(Arc::new(Handler::parse(&args.handler)?))
    } else {
        None
    };
    let queue = g.connectable().await?;
    let kind = match args.codec {
        BodyCodec::Json => BodyKind::Json,
        BodyCodec::Raw => BodyKind::Raw,
    };
    let external = External::start(
        ext,
        external::Settings {
            kind,
            concurrency: args.concurrency as usize,
            max_body_bytes: queue.max_body_bytes,
            handler_timeout: external::DEFAULT_HANDLER_TIMEOUT,
            log_prefix: "pelican worker",
        },
    )
    .await?
    .map(Arc::new);
    let served = match (builtin, &external) {
        (Some(handler), _) => {
            let shown = format!("handler {handler}");
            serve::<Value, Value, Json, _, _>(g, args, queue, shown, move |req, _job| {
                let handler = handler.clone();
                async move { handler.handle(req).await }
            })
            .await
        }
        (None, Some(ext)) if kind == BodyKind::Json => {
            let ext = ext.clone();
            serve::<Box<RawValue>, Box<RawValue>, Json, _, _>(
                g,
                args,
                queue,
                ext.to_string(),
                move |req, job| {
                    let ext = ext.clone();
                    async move {
                        let r = ext.handle(request(&job, Body::Json(req))).await;
                        r.map(Body::into_json)
                    }
                },
            )
            .await
        }
        (None, Some(ext)) => {
            let ext = ext.clone();
            serve::<Bytes, Bytes, Raw, _, _>(g, args, queue, ext.to_string(), move |req, job| {
                let ext = ext.clone();
                async move {
                    let r = ext.handle(request(&job, Body::Raw(req))).await;
                    r.map(Body::into_raw)
                }
            })
            .await
        }
        (None, None) => unreachable!("no built-in handler without an external one"),
    };
    // Every request is answered or released by now: the children can go.
    if let Some(ext) = external {
        ext.shutdown().await;
    }
    served
}

/// What an external handler is told of a delivery.
fn request(job: &Job, body: Body) -> external::Request {
    let deadline_ms = job
        .deadline()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    external::Request {
        id: job.request_id().to_string(),
        body,
        delivery: job.delivery_count(),
        deadline_ms: Some(deadline_ms),
        traceparent: external::traceparent(job.trace_parent()),
        lease: Some(job.lease_lost()),
    }
}

/// Connects the consumer and serves with `handle` until a signal; `shown` names the
/// handler in the start line.
async fn serve<Req, Resp, C, F, Fut>(
    g: &Global,
    args: &WorkerArgs,
    queue: QueueConfig,
    shown: String,
    handle: F,
) -> CliResult
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
    F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, HandlerError>> + Send + 'static,
{
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
    let consumer = Consumer::<Req, Resp, C>::connect(queue, cfg)
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
            "pelican worker: serving queue {:?} on {} as consumer {} ({shown}, concurrency {}, claim idle {} ms, max deliveries {}){}; stop with Ctrl-C",
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
    let handle = Arc::new(handle);
    let served = {
        let out = out.clone();
        consumer.serve(args.concurrency as usize, move |req: Req, job: Job| {
            let handle = handle.clone();
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
                let result = handle(req, job.clone()).await;
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

    fn handled<T>(&self, job: &Job, result: &Result<T, HandlerError>, took: Duration) {
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
