//! `pelican nitro`: Nitro's wire format (Arbitrum's Redis-streams `pubsub`) from the
//! command line: `worker` serves a stream Nitro's producers write, `call` sends one
//! request as Nitro's producers do, `stats` shows a stream.
//!
//! The worker reuses `pelican worker`'s handlers (`handlers.rs`), signals and `--verbose`
//! lines; the request and the echoed response are the `msg` JSON byte for byte.

use crate::cli::Global;
use crate::exit::{CliError, CliResult, GAVE_UP, REMOTE};
use crate::handlers::Handler;
use clap::{Args, Subcommand};
use pelican::nitro::{self, ConsumerConfig, Job, ProducerConfig, StreamConfig};
use pelican::{ErrorKind, HandlerError};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// `pelican nitro`.
#[derive(Debug, Clone, Args)]
pub struct NitroArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: NitroCommand,
}

/// `pelican nitro ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum NitroCommand {
    /// Serve a Nitro stream until SIGINT/SIGTERM, then hand the work in hand back.
    Worker(WorkerArgs),
    /// Send one request as Nitro's producers do and print the response JSON.
    Call(CallArgs),
    /// A Nitro stream at a glance: length, group, consumers, answer keys, dedup jobs.
    Stats(StreamArg),
}

/// `--stream`.
#[derive(Debug, Clone, Args)]
pub struct StreamArg {
    /// The stream (and consumer group) name, e.g. stream:0x<module root>.
    #[arg(long, value_name = "NAME")]
    pub stream: String,
}

/// `pelican nitro worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub stream: StreamArg,
    /// What to do with each request (JSON in, JSON out): echo, sleep:MS, fail-if:FIELD,
    /// crash-if:FIELD, or several joined by commas. echo answers the request unchanged.
    #[arg(long, default_value = "echo", value_name = "H")]
    pub handler: String,
    /// Requests handled at once.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Requests held at once, in work and read ahead (default: --concurrency).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub prefetch: Option<u64>,
    /// Nitro's idletime-to-autoclaim: a request idle this long is taken over, in ms. The
    /// same for every process of the stream, Nitro's included.
    #[arg(long, default_value_t = 300_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(3..))]
    pub idletime: u64,
    /// Nitro's max-retry-count: a request taken over after more deliveries than this is
    /// answered "too many retries"; -1 = unlimited (Nitro's default).
    #[arg(long, default_value_t = -1, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=1_000_000))]
    pub max_retry_count: i64,
    /// Nitro's response-entry-timeout: the TTL of result and error keys, in seconds
    /// (0: no expiry).
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    pub response_ttl: u64,
    /// Solve identical requests in flight once (every entry gets the answer).
    #[arg(long)]
    pub dedup: bool,
    /// With --dedup: answer a repeat of a request solved within this many ms from a cache.
    #[arg(long, value_name = "MS", requires = "dedup", value_parser = clap::value_parser!(u64).range(1..))]
    pub dedup_cache_ttl: Option<u64>,
    /// How long to wait for the requests in work on SIGINT/SIGTERM before handing them
    /// back, in ms.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub shutdown_timeout: u64,
    /// The consumer's name in the group (default: host-pid-random).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print one line per handler run on stdout (JSON with --json).
    #[arg(long)]
    pub verbose: bool,
}

/// `pelican nitro call`.
#[derive(Debug, Clone, Args)]
pub struct CallArgs {
    #[command(flatten)]
    pub stream: StreamArg,
    /// Give up after this long, in ms (by the Redis clock); the request is withdrawn.
    #[arg(long, default_value_t = 30_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// How often the answer keys are polled, in ms.
    #[arg(long, default_value_t = 10, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub poll_interval: u64,
    /// The request, as JSON (`-` reads it from stdin).
    #[arg(value_name = "JSON")]
    pub request: String,
}

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

async fn worker(g: &Global, args: &WorkerArgs) -> CliResult {
    let handler = Arc::new(Handler::parse(&args.handler)?);
    let stream = stream_config(g, &args.stream.stream).await?;
    let mut cfg = ConsumerConfig::default()
        .with_idletime(Duration::from_millis(args.idletime))
        .with_max_retry_count(u32::try_from(args.max_retry_count).ok())
        .with_response_ttl(Duration::from_secs(args.response_ttl))
        .with_prefetch(args.prefetch.unwrap_or(args.concurrency) as usize)
        .with_shutdown_timeout(Duration::from_millis(args.shutdown_timeout))
        .with_dedup(args.dedup)
        .with_dedup_cache_ttl(args.dedup_cache_ttl.map(Duration::from_millis));
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
        "pelican nitro worker: serving stream {:?} on {} as consumer {} (handler {handler}, \
         concurrency {}, idletime {} ms, max retry count {}, dedup {}); stop with Ctrl-C",
        stream.stream,
        crate::redis_local::redacted(&g.redis),
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
                    let result = match serde_json::from_str::<Value>(req.get()) {
                        Ok(v) => handler.handle(v).await.map(|_| req),
                        Err(e) => Err(HandlerError::fail(format!("the request is not JSON: {e}"))),
                    };
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
            println!("{v}");
        }
    }

    fn handled<T>(&self, job: &Job, result: &Result<T, HandlerError>, took: Duration) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        if !self.verbose {
            return;
        }
        let (outcome, error) = match result {
            Ok(_) => ("ok", None),
            Err(HandlerError::Fail(m)) => ("failed", Some(m.as_str())),
            Err(HandlerError::Retry(m)) | Err(HandlerError::RetryAfter(_, m)) => {
                ("retry", Some(m.as_str()))
            }
            Err(_) => ("failed", None),
        };
        let ms = (took.as_secs_f64() * 10_000.0).round() / 10.0;
        if self.json {
            let mut v = json!({
                "event": "handled",
                "consumer": self.consumer,
                "entry": job.entry_id(),
                "delivery": job.delivery_count(),
                "outcome": outcome,
                "ms": ms,
            });
            if let Some(e) = error {
                v["error"] = json!(e);
            }
            println!("{v}");
        } else {
            println!(
                "{outcome:<6} entry={} delivery={} {ms}ms{}",
                job.entry_id(),
                job.delivery_count(),
                error.map(|e| format!(": {e}")).unwrap_or_default()
            );
        }
    }
}

async fn call(g: &Global, args: &CallArgs) -> CliResult {
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
    println!("{}", response.get());
    Ok(())
}

async fn stats(g: &Global, args: &StreamArg) -> CliResult {
    let stream = stream_config(g, &args.stream).await?;
    let st = nitro::stats(&stream).await.map_err(|e| g.error(&e))?;
    if g.json {
        let text = serde_json::to_string_pretty(&st)
            .map_err(|e| CliError::failure(format!("cannot encode the stats: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<16}{v}\n"));
    line(
        "stream",
        format!(
            "{} on {}",
            st.stream,
            crate::redis_local::redacted(&g.redis)
        ),
    );
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
    print!("{o}");
    Ok(())
}
