//! Logs on stderr and, with `--otlp URL` (feature `otel`), spans exported to an
//! OpenTelemetry collector over OTLP/HTTP (protobuf).
//!
//! The two have their own filters: stderr shows warnings unless `-v` or `RUST_LOG` say
//! otherwise; the exporter takes every span at INFO or above (the library's
//! `pelican.call` and `pelican.handle`, the command's own).
//!
//! Stderr is text (`--log-format text`, coloured only on a terminal and without
//! `NO_COLOR`) or one JSON object per line (`--log-format json`, for log shippers). The
//! command's own messages on stderr (a worker's start and stop, the final error) go
//! through [`say`], so that with `json` every line of stderr is JSON.

use crate::exit::{CliError, CliResult};
use std::io::IsTerminal;
use std::sync::OnceLock;
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines on stderr are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event; ANSI colours only when stderr is a terminal and
    /// `NO_COLOR` is unset or empty.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the event's fields,
    /// `target`, and the spans it happened in (`span`, `spans`).
    Json,
}

/// The format in use, once [`init`] installed the subscriber: [`say`] then speaks JSON
/// through it.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The target of the command's own messages in JSON logs; always shown (INFO and up),
/// whatever the filter, as they are in text.
const SAY_TARGET: &str = "pelican::say";

/// Prints one of the command's own messages on stderr: as it is in text, as a log event
/// at `level` (target `pelican::say`) with `--log-format json`.
pub fn say(level: Level, message: &str) {
    if FORMAT.get() != Some(&LogFormat::Json) {
        eprintln!("{message}");
        return;
    }
    match level {
        Level::ERROR => tracing::error!(target: SAY_TARGET, "{message}"),
        Level::WARN => tracing::warn!(target: SAY_TARGET, "{message}"),
        _ => tracing::info!(target: SAY_TARGET, "{message}"),
    }
}

/// ANSI colours on stderr: only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (no-color.org).
fn colour(no_color: Option<std::ffi::OsString>, terminal: bool) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Keeps the span exporter alive; [`Telemetry::shutdown`] sends what is left.
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans not exported yet and stops the exporter. Call it outside the
    /// runtime: the exporter's HTTP client blocks.
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("pelican: could not send the last spans to the collector: {e}");
            }
        }
    }
}

/// The stderr filter: `-v` info, `-vv` debug, `-vvv` trace; without `-v`, `RUST_LOG`,
/// else warnings only.
/// With `json`, the command's own messages ([`say`]) pass at INFO whatever the level.
fn stderr_filter(verbosity: u8, format: LogFormat) -> EnvFilter {
    let filter = match verbosity {
        0 => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        1 => EnvFilter::new("info"),
        2 => EnvFilter::new("debug"),
        _ => EnvFilter::new("trace"),
    };
    match format {
        LogFormat::Text => filter,
        LogFormat::Json => filter.add_directive(
            format!("{SAY_TARGET}=info")
                .parse()
                .expect("a valid directive"),
        ),
    }
}

/// The OTLP traces URL for `--otlp URL`: a collector's base URL gets `/v1/traces`
/// appended; a URL that ends in it is used as it is. Only `http://`.
pub fn traces_url(url: &str) -> CliResult<String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        CliError::usage(format!(
            "--otlp {url:?}: give the collector's OTLP/HTTP address as http://HOST:PORT \
             (e.g. http://127.0.0.1:4318); https is not built in, put a local collector or \
             proxy in between"
        ))
    })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(CliError::usage(format!(
            "--otlp {url:?}: the URL names no host; e.g. http://127.0.0.1:4318"
        )));
    }
    if url.ends_with("/v1/traces") {
        Ok(url.to_string())
    } else {
        Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
    }
}

/// Sets up logging, and span export when `otlp` is given. `service` names this process
/// in the traces (`pelican-worker`, `pelican-call`, ...).
pub fn init(
    verbosity: u8,
    format: LogFormat,
    otlp: Option<&str>,
    service: &str,
) -> CliResult<Telemetry> {
    let filter = stderr_filter(verbosity, format);
    let stderr = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(colour(
                std::env::var_os("NO_COLOR"),
                std::io::stderr().is_terminal(),
            ))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_filter(filter)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(stderr);
    let Some(url) = otlp else {
        registry.init();
        let _ = FORMAT.set(format);
        return Ok(Telemetry {
            #[cfg(feature = "otel")]
            provider: None,
        });
    };
    let url = traces_url(url)?;
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .build()
            .map_err(|e| CliError::usage(format!("--otlp {url}: {e}")))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service.to_string())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("pelican");
        let spans = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
        registry.with(spans).init();
        let _ = FORMAT.set(format);
        Ok(Telemetry {
            provider: Some(provider),
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (registry, service);
        Err(CliError::usage(format!(
            "--otlp {url}: this pelican was built without OpenTelemetry; build it with \
             `cargo build -p pelican-cli --features otel`"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use super::colour;
        assert!(colour(None, true));
        assert!(colour(Some("".into()), true), "an empty NO_COLOR is unset");
        assert!(!colour(Some("1".into()), true));
        assert!(!colour(None, false));
        assert!(!colour(Some("1".into()), false));
    }

    #[test]
    fn otlp_urls_get_the_traces_path() {
        let ok = |u: &str| super::traces_url(u).unwrap();
        assert_eq!(
            ok("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(ok("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(ok("http://c:4318/v1/traces"), "http://c:4318/v1/traces");
        for bad in ["https://c:4318", "c:4318", "http://", "http:///v1/traces"] {
            let e = super::traces_url(bad).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{bad}");
        }
    }
}
