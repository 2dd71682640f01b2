//! `pelican worker --metrics ADDR`: the library's metrics in Prometheus text format at
//! `GET /metrics`, served with axum (the HTTP stack the dashboard uses) on any address:
//! loopback for a local Prometheus, the pod's address (or 0.0.0.0) where Prometheus
//! scrapes pods. The page holds counters and histograms labelled with the queue's name,
//! no request bodies or ids, and asks for no credentials: bind it where only the scraper
//! can reach it.

use crate::exit::{CliError, CliResult};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

/// Histogram buckets for the `*_seconds` metrics: 1 ms to 5 minutes.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// How often histograms are compacted.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Prometheus' text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Installs the Prometheus recorder and serves it on `addr` in the background. Returns
/// the address actually bound (port 0 picks a free one).
pub async fn serve(addr: SocketAddr) -> CliResult<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        CliError::failure(format!(
            "cannot serve metrics on {addr}: {e}; choose another address or port with \
             --metrics"
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("cannot serve metrics on {addr}: {e}")))?;
    let handle = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .and_then(|b| b.install_recorder())
        .map_err(|e| CliError::failure(format!("cannot install the metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let app = Router::new()
        .route(
            "/metrics",
            get(move || async move { ([(CONTENT_TYPE, TEXT_FORMAT)], handle.render()) }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "the metrics are at /metrics\n") });
    // Ends with the runtime, when the worker exits.
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(bound)
}
