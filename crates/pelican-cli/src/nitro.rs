//! `pelican nitro`: Nitro's wire format (Arbitrum's Redis-streams `pubsub`) from the
//! command line: `worker` serves a stream Nitro's producers write, `call` sends one
//! request as Nitro's producers do, `stats` shows a stream.
//!
//! The worker reuses `pelican worker`'s handlers (`handlers.rs`, or a program in any
//! language: `external/`), signals and `--verbose` lines; the request and the echoed
//! response are the `msg` JSON byte for byte.

use crate::cli::{Global, NitroArgs, NitroCallArgs, NitroCommand, NitroWorkerArgs, StreamArg};
use crate::exit::{CliError, CliResult, GAVE_UP, REMOTE};
use crate::external::{self, Body, BodyKind, External};
use crate::handlers::Handler;
use pelican::nitro::{self, ConsumerConfig, Job, ProducerConfig, StreamConfig};
use pelican::{ErrorKind, HandlerError};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// Runs a `pelican nitro` subcommand.
pub async fn run(g: &Global, args: &NitroArgs) -> CliResult {
    match &args.command {
        NitroCommand::Worker(a) => worker(g, a).await,
        NitroCommand::Call(a) => call(g, a).await,
        NitroCommand::Stats(a) => stats(g, a).await,
    }
}

/// The stream's settings from the global options (URL, TLS CA), checked.
async fn stream_config(g: &Global, stream: &str) -> CliResult<StreamConfig> {
    let q = g.connectable().await?;
    let mut s = StreamConfig::new(q.url, stream).with_command_timeout(q.command_timeout);
    s.tls_root_ca_pem = q.tls_root_ca_pem;
    s.validate().map_err(|e| match e.kind() {
        ErrorKind::Config => CliError::usage(format!("{} (check --stream)", e.message())),
        _ => g.error(&e),
    })?;
    Ok(s)
}

fn error(g: &Global, stream: &str, e: &pelican::Error) -> CliError {
    match e.kind() {
        // The error key's text, as Nitro's producers get it.
        ErrorKind::Remote => CliError::new(REMOTE, e.message()),
        ErrorKind::Timeout => CliError::new(
            GAVE_UP,
            format!(
                "timeout: {}. Is a worker serving stream {stream:?}? Start one with \
                 `pelican nitro worker --stream {stream}`, look with `pelican nitro stats \
                 --stream {stream}`, or raise --timeout",
                e.message()
            ),
        ),
        ErrorKind::Cancelled => CliError::new(GAVE_UP, format!("{e:#}")),
        _ => g.error(e),
    }
}

/// Largest answer an external handler may give on Nitro's wire unless --max-body-bytes
/// says otherwise: Nitro's validation inputs run to many MB, its answers are small.
const NITRO_MAX_BODY_BYTES: usize = 64 << 20;

async fn worker(g: &Global, args: &NitroWorkerArgs) -> CliResult {
    let builtin = if args.external.exec.is_none() && args.external.http.is_none() {
        Some(Arc::new(Handler::parse(&args.handler)?))
    } else {
        None
    };
    let stream = stream_config(g, &args.stream.stream).await?;
    let external = External::start(
        &args.external,
        external::Settings {
            kind: BodyKind::Json,
            concurrency: args.concurrency as usize,
            max_body_bytes: g
                .settings
                .max_body_bytes
                .map_or(NITRO_MAX_BODY_BYTES, |n| n as usize),
            handler_timeout: external::DEFAULT_HANDLER_TIMEOUT,
            log_prefix: "pelican nitro worker",
        },
    )
    .await?
    .map(Arc::new);
    let handler = match (&builtin, &external) {
        (Some(h), _) => Handling::Builtin(h.clone()),
        (None, Some(e)) => Handling::External(e.clone()),
        (None, None) => unreachable!("no built-in handler without an external one"),
    };
    let served = serve(g, args, stream, handler).await;
    // Every entry is answered or handed back by now: the children can go.
    if let Some(ext) = external {
        ext.shutdown().await;
    }
    served
}

/// What a `pelican nitro worker` runs on each request.
#[derive(Clone)]
enum Handling {
    Builtin(Arc<Handler>),
    External(Arc<External>),
}

impl std::fmt::Display for Handling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handling::Builtin(h) => write!(f, "handler {h}"),
            Handling::External(e) => write!(f, "{e}"),
        }
    }
}

impl Handling {
    async fn handle(&self, req: Box<RawValue>, job: &Job) -> Result<Box<RawValue>, HandlerError> {
        match self {
            Handling::Builtin(handler) => match serde_json::from_str::<Value>(req.get()) {
                Ok(v) => handler.handle(v).await.map(|_| req),
                Err(e) => Err(HandlerError::fail(format!("the request is not JSON: {e}"))),
            },
            // Nitro's wire carries no deadline and no trace context.
            Handling::External(ext) => ext
                .handle(external::Request {
                    id: job.entry_id().to_string(),
                    body: Body::Json(req),
                    delivery: job.delivery_count(),
                    deadline_ms: None,
                    traceparent: None,
                    lease: Some(job.lease_lost()),
                })
                .await
                .map(Body::into_json),
        }
    }
}

async fn serve(
    g: &Global,
    args: &NitroWorkerArgs,
    stream: StreamConfig,
    handler: Handling,
) -> CliResult {
    let mut cfg = ConsumerConfig::default()
        .with_idletime(Duration::from_millis(args.idletime))
        .with_max_retry_count(u32::try_from(args.max_retry_count).ok())
        .with_response_ttl(Duration::from_secs(args.response_ttl))
        .with_prefetch(args.prefetch.unwrap_or(args.concurrency) as usize)
        .with_shutdown_timeout(Duration::from_millis(args.shutdown_timeout))
        .with_dedup(args.dedup)
        .with_dedup_cache_ttl(match args.dedup_cache_ttl {
            None => Some(nitro::DEFAULT_DEDUP_CACHE_TTL),
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
        });
    if let Some(name) = &args.name {
        cfg = cfg.with_name(name.clone());
    }
    if let Some(ms) = g.settings.consumer_gc_after {
        cfg = cfg.with_consumer_gc_after(Duration::from_millis(ms));
    }
    let signal_error =
        |e: std::io::Error| CliError::failure(format!("cannot listen for signals: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let consumer = nitro::Consumer::<Box<RawValue>, Box<RawValue>>::connect(stream.clone(), cfg)
        .await
        .map_err(|e| error(g, &stream.stream, &e))?;
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
        eprintln!(
            "pelican nitro worker: stopping: finishing the requests in hand, then handing \
             back the rest (send the signal again to exit at once)"
        );
        stop.stop();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!(
            "pelican nitro worker: second signal: exiting now; the requests in hand are \
             taken over by other workers after the idletime"
        );
        std::process::exit(crate::exit::FAILURE.into());
    });
    eprintln!(
        "pelican nitro worker: serving stream {:?} on {} as consumer {} ({handler}, \
         concurrency {}, idletime {} ms, max retry count {}, dedup {}); stop with Ctrl-C",
        stream.stream,
        g.redis.redacted(),
        out.consumer,
        args.concurrency,
        args.idletime,
        args.max_retry_count,
        if args.dedup { "on" } else { "off" },
    );
    out.event(json!({"event": "ready", "consumer": out.consumer, "pid": std::process::id()}));
    let served = {
        let out = out.clone();
        consumer.serve(
            args.concurrency as usize,
            move |req: Box<RawValue>, job: Job| {
                let handler = handler.clone();
                let out = out.clone();
                async move {
                    let started = Instant::now();
                    let result = handler.handle(req, &job).await;
                    out.handled(&job, &result, started.elapsed());
                    result
                }
            },
        )
    };
    served.await.map_err(|e| error(g, &stream.stream, &e))?;
    let handled = out.handled.load(Ordering::Relaxed);
    eprintln!("pelican nitro worker: stopped after {handled} handler runs");
    out.event(json!({"event": "stopped", "consumer": out.consumer, "handled": handled}));
    Ok(())
}

/// The worker's data lines on stdout (with --verbose): one per handler run.
struct Output {
    json: bool,
    verbose: bool,
    consumer: String,
    handled: AtomicU64,
}

impl Output {
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
                &[("entry", job.entry_id())],
                job.delivery_count(),
                result,
                took,
            );
        }
    }
}

async fn call(g: &Global, args: &NitroCallArgs) -> CliResult {
    let text = if args.request == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::failure(format!("cannot read the request from stdin: {e}")))?;
        s
    } else {
        args.request.clone()
    };
    let request: Box<RawValue> = serde_json::from_str(text.trim()).map_err(|e| {
        CliError::usage(format!(
            "the request is not valid JSON ({e}); quote it for the shell, as in \
             pelican nitro call --stream S '{{\"n\": 1}}', or pass - to read it from stdin"
        ))
    })?;
    let stream = stream_config(g, &args.stream.stream).await?;
    let cfg = ProducerConfig::default()
        .with_request_timeout(Duration::from_millis(args.timeout))
        .with_poll_interval(Duration::from_millis(args.poll_interval));
    let producer = nitro::Producer::<Box<RawValue>, Box<RawValue>>::connect(stream.clone(), cfg)
        .await
        .map_err(|e| error(g, &stream.stream, &e))?;
    let result = match producer.submit(&request).await {
        Ok(ticket) => {
            tracing::info!(entry = %ticket.entry_id(), "submitted");
            ticket.await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = producer.shutdown().await {
        tracing::debug!(error = %format_args!("{e:#}"), "producer shutdown");
    }
    let response = result.map_err(|e| error(g, &stream.stream, &e))?;
    outln!("{}", response.get());
    Ok(())
}

async fn stats(g: &Global, args: &StreamArg) -> CliResult {
    let stream = stream_config(g, &args.stream).await?;
    let st = nitro::stats(&stream).await.map_err(|e| g.error(&e))?;
    if g.json {
        let text = serde_json::to_string_pretty(&st)
            .map_err(|e| CliError::failure(format!("cannot encode the stats: {e}")))?;
        outln!("{text}");
        return Ok(());
    }
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<16}{v}\n"));
    line("stream", format!("{} on {}", st.stream, g.redis.redacted()));
    if !st.exists {
        line("", "does not exist".into());
    } else {
        line("entries", st.length.to_string());
    }
    match &st.group {
        None => line("group", "none".into()),
        Some(gr) => {
            line(
                "group",
                format!(
                    "last delivered {}, {} pending{}",
                    gr.last_delivered_id,
                    gr.pending,
                    gr.lag.map(|l| format!(", {l} waiting")).unwrap_or_default()
                ),
            );
            if let (Some(id), Some(idle)) = (&gr.oldest_pending_id, gr.oldest_pending_idle_ms) {
                line(
                    "oldest pending",
                    format!(
                        "{id} held by {} idle {}",
                        gr.oldest_pending_owner.as_deref().unwrap_or("?"),
                        crate::fmt::duration_ms(idle as f64)
                    ),
                );
            }
        }
    }
    line("consumers", st.consumers.len().to_string());
    for c in &st.consumers {
        line(
            "",
            format!(
                "{}  pending {}  idle {}",
                c.name,
                c.pending,
                crate::fmt::duration_ms(c.idle_ms as f64)
            ),
        );
    }
    line(
        "answer keys",
        format!("{} results, {} errors", st.result_keys, st.error_keys),
    );
    line(
        "dedup",
        format!(
            "{} jobs in flight, {} cached",
            st.dedup_jobs, st.dedup_cached
        ),
    );
    out!("{o}");
    Ok(())
}
