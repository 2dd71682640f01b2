//! Handlers in any language: each request handed to a program of the operator's, either
//! long-lived child processes speaking a line protocol on stdin/stdout (`--exec`,
//! `exec.rs`, `child.rs`, `line.rs`, `read.rs`) or an HTTP endpoint (`--http`, `http.rs`).
//!
//! `pelican worker` and `pelican nitro worker` both serve through [`External`]: a request
//! is JSON or bytes in ([`Request`]), and the answer, a failure or a retry out
//! (`Result<Body, HandlerError>`); the two commands differ only in what they know of a
//! request (Nitro's wire carries no deadline and no trace context).

mod child;
mod exec;
mod http;
mod line;
mod read;

use crate::cli::ExternalArgs;
use crate::exit::{CliError, CliResult};
use pelican::Bytes;
use pelican::{HandlerError, LeaseLost};
use serde_json::value::RawValue;
use std::fmt;
use std::time::Duration;

/// Default `--handler-timeout`: long enough for heavy jobs (a block validation takes
/// minutes), short enough that a hung child or endpoint is noticed.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(300);
/// A retry an external handler asks for without a delay of its own (a refused connection,
/// a 5xx without `Retry-After`, a child that died or hung, `"retry": true`) is handed back
/// after `RETRY_BACKOFF_FIRST` x 2^(delivery - 1), at most `RETRY_BACKOFF_MAX`: a released
/// request is read again at once, so without a pause an endpoint that is down for a
/// moment would use up a request's `max_deliveries` in milliseconds. With the default 5
/// deliveries a request outlasts an outage of about 8 s (0.25 + 0.5 + 1 + 2 + 4 s).
pub const RETRY_BACKOFF_FIRST: Duration = Duration::from_millis(250);
/// The longest pause before a retry without a delay of its own (see
/// [`RETRY_BACKOFF_FIRST`]).
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The pause before delivery `delivery + 1` of a request whose handler asked for a retry
/// without a delay (see [`RETRY_BACKOFF_FIRST`]).
pub fn retry_backoff(delivery: u32) -> Duration {
    let doublings = delivery.saturating_sub(1).min(16);
    RETRY_BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_MAX)
}

/// Default `--start-timeout`: how long an `--exec` child may take to say hello.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How bodies are carried: JSON as it is, or bytes (`--codec raw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// The default codec: a JSON value.
    Json,
    /// `pelican::Raw`: bytes as they are.
    Raw,
}

/// A request or an answer.
#[derive(Debug)]
pub enum Body {
    /// A JSON value, as it arrived.
    Json(Box<RawValue>),
    /// Bytes.
    Raw(Bytes),
}

impl Body {
    /// The JSON value (a JSON handler never answers bytes).
    pub fn into_json(self) -> Box<RawValue> {
        match self {
            Body::Json(v) => v,
            Body::Raw(_) => unreachable!("a JSON handler answers JSON"),
        }
    }

    /// The bytes (a raw handler never answers JSON).
    pub fn into_raw(self) -> Bytes {
        match self {
            Body::Raw(b) => b,
            Body::Json(_) => unreachable!("a raw handler answers bytes"),
        }
    }
}

/// One request for an external handler.
#[derive(Debug)]
pub struct Request {
    /// The request id: pelican's request id, or the Nitro entry id.
    pub id: String,
    /// The request's body.
    pub body: Body,
    /// Which delivery this is (1 = the first).
    pub delivery: u32,
    /// When the request stops being worth solving, in ms since the Unix epoch.
    pub deadline_ms: Option<u64>,
    /// The submitter's W3C trace context.
    pub traceparent: Option<String>,
    /// Fires when the lease is lost: an HTTP call is then abandoned.
    pub lease: Option<LeaseLost>,
}

/// The trace context to hand an external handler (`traceparent`): with `--otlp` (feature
/// `otel`), the current span's, so the handler's own spans join the request's trace under
/// the worker's; otherwise the submitter's, as the entry carries it.
pub fn traceparent(carried: Option<&str>) -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_valid() {
            return Some(format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            ));
        }
    }
    carried.map(String::from)
}

/// What both external handlers need to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// JSON or bytes.
    pub kind: BodyKind,
    /// Requests in flight at most, over all children or HTTP connections.
    pub concurrency: usize,
    /// Longest answer accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long one request may take.
    pub handler_timeout: Duration,
    /// Prefix of the lines this process writes on stderr (`pelican worker`).
    pub log_prefix: &'static str,
}

/// A handler outside this process.
pub enum External {
    /// `--exec`: child processes.
    Exec(exec::Pool),
    /// `--http`: an HTTP endpoint.
    Http(Box<http::Caller>),
}

impl External {
    /// Starts what the arguments ask for: `None` when they name no external handler.
    /// `--exec` children are started here, and each must say hello within
    /// `--start-timeout` (a command that cannot start is a usage error, before the
    /// worker joins the queue).
    pub async fn start(args: &ExternalArgs, settings: Settings) -> CliResult<Option<External>> {
        let timeout = args
            .handler_timeout
            .map_or(DEFAULT_HANDLER_TIMEOUT, Duration::from_millis);
        let settings = Settings {
            handler_timeout: timeout,
            ..settings
        };
        if let Some(cmd) = &args.exec {
            let argv = exec::split_words(cmd)
                .map_err(|e| CliError::usage(format!("--exec {cmd:?}: {e}")))?;
            let start = args
                .start_timeout
                .map_or(DEFAULT_START_TIMEOUT, Duration::from_millis);
            let processes = args.processes.unwrap_or(1) as usize;
            let pool = exec::Pool::start(argv, processes, start, settings).await?;
            return Ok(Some(External::Exec(pool)));
        }
        if let Some(url) = &args.http {
            return Ok(Some(External::Http(Box::new(http::Caller::new(
                url, settings,
            )?))));
        }
        if args.processes.is_some() || args.start_timeout.is_some() {
            return Err(CliError::usage(
                "--processes and --start-timeout go with --exec",
            ));
        }
        if args.handler_timeout.is_some() {
            return Err(CliError::usage(
                "--handler-timeout goes with --exec or --http",
            ));
        }
        Ok(None)
    }

    /// Hands one request over and waits for its outcome (at most the handler timeout:
    /// past it, the request is handed back with a retry). A retry without a delay of its
    /// own is delayed by [`retry_backoff`].
    pub async fn handle(&self, req: Request) -> Result<Body, HandlerError> {
        let delivery = req.delivery;
        let outcome = match self {
            External::Exec(p) => p.call(req).await,
            External::Http(c) => c.call(req).await,
        };
        outcome.map_err(|e| match e {
            HandlerError::Retry(m) => HandlerError::RetryAfter(retry_backoff(delivery), m),
            other => other,
        })
    }

    /// Stops the children (`--exec`): stdin closed and SIGTERM, SIGKILL after a grace
    /// period. Call it once no request is in flight any more.
    pub async fn shutdown(&self) {
        if let External::Exec(p) = self {
            p.shutdown().await;
        }
    }
}

impl fmt::Display for External {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            External::Exec(p) => write!(f, "{p}"),
            External::Http(c) => write!(f, "{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pause before a retry doubles with each delivery from 250 ms and stops at 30 s,
    /// whatever the count (no overflow for a request delivered thousands of times).
    #[test]
    fn the_pause_before_a_retry_doubles_up_to_its_cap() {
        let ms = |d| retry_backoff(d).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(5)],
            [250, 250, 500, 1000, 4000]
        );
        assert_eq!(ms(8), 30_000);
        assert_eq!(ms(u32::MAX), 30_000);
    }
}
