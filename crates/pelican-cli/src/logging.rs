//! Logs on stderr and, with `--otlp URL` (feature `otel`), spans exported to an
//! OpenTelemetry collector over OTLP/HTTP (protobuf).
//!
//! The two have their own filters: stderr shows warnings unless `-v` or `RUST_LOG` say
//! otherwise; the exporter takes every span at INFO or above (the library's
//! `pelican.call` and `pelican.handle`, the command's own).

use crate::exit::{CliError, CliResult};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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
fn stderr_filter(verbosity: u8) -> EnvFilter {
    match verbosity {
        0 => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        1 => EnvFilter::new("info"),
        2 => EnvFilter::new("debug"),
        _ => EnvFilter::new("trace"),
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
pub fn init(verbosity: u8, otlp: Option<&str>, service: &str) -> CliResult<Telemetry> {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(stderr_filter(verbosity));
    let registry = tracing_subscriber::registry().with(stderr);
    let Some(url) = otlp else {
        registry.init();
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
