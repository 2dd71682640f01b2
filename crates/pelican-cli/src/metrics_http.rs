//! `pelican worker --metrics ADDR`: the library's metrics in Prometheus text format, served
//! by a tiny HTTP responder on a loopback address (any path, GET only, one response per
//! connection).

use crate::exit::{CliError, CliResult};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Histogram buckets for the `*_seconds` metrics: 1 ms to 5 minutes.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// How often histograms are compacted.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Longest request head accepted.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses anything but a loopback address (exit 2): metrics are not for the network.
pub fn check_addr(addr: SocketAddr) -> CliResult {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "refusing to serve metrics on {addr}: only loopback addresses are allowed \
             (e.g. --metrics 127.0.0.1:{} or [::1]:{}); put a reverse proxy in front to \
             expose them",
            addr.port(),
            addr.port()
        )))
    }
}

/// Installs the Prometheus recorder and serves it on `addr` in the background. Returns
/// the address actually bound (port 0 picks a free one).
pub async fn serve(addr: SocketAddr) -> CliResult<SocketAddr> {
    check_addr(addr)?;
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        CliError::failure(format!(
            "cannot serve metrics on {addr}: {e}; choose another port with --metrics"
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
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let handle = handle.clone();
                    tokio::spawn(async move {
                        if let Err(e) = respond(stream, &handle).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(bound)
}

async fn respond(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read_head = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(READ_TIMEOUT, read_head).await.is_err() {
        return Ok(());
    }
    let (status, body) = if buf.starts_with(b"GET ") || buf.starts_with(b"HEAD ") {
        ("200 OK", handle.render())
    } else {
        ("405 Method Not Allowed", "use GET\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !buf.starts_with(b"HEAD ") {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_is_allowed() {
        for ok in ["127.0.0.1:9464", "[::1]:9464", "127.1.2.3:1"] {
            assert!(super::check_addr(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for bad in ["0.0.0.0:9464", "[::]:9464", "10.0.0.1:9464"] {
            let e = super::check_addr(bad.parse().unwrap()).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE);
            assert!(e.message.contains("loopback"), "{e}");
        }
    }
}
