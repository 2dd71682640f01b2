//! `pelican worker --metrics`: Prometheus text at /metrics, on any address.

use crate::support::*;
use pelican_testkit::eventually_sync;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn worker_serves_prometheus_text() {
    serves_prometheus_text("127.0.0.1:0");
}

/// A listening address that is not a loopback one by `is_loopback()` (the v4-mapped
/// IPv6 form of 127.0.0.1) is served, where only loopback addresses were before: as a
/// pod's address would be. It still takes connections from this machine only, as the
/// tests' servers must.
#[test]
fn worker_serves_metrics_on_an_address_that_is_not_loopback_by_name() {
    let addr: std::net::SocketAddr = "[::ffff:127.0.0.1]:0".parse().unwrap();
    assert!(!addr.ip().is_loopback());
    serves_prometheus_text("[::ffff:127.0.0.1]:0");
}

fn serves_prometheus_text(listen: &str) {
    let env = Env::new("metrics");
    let worker = env.spawn(&["worker", "--metrics", listen]);
    let mut addr = String::new();
    eventually_sync(
        Duration::from_secs(20),
        "the worker to announce its metrics",
        || {
            let err = worker.stderr();
            match err.split("metrics on http://").nth(1) {
                Some(rest) => {
                    addr = rest.split('/').next().unwrap().to_string();
                    true
                }
                None => false,
            }
        },
    );
    let out = env.run(&["call", r#"{"m": 1}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    let mut text = String::new();
    eventually_sync(
        Duration::from_secs(10),
        "the completion to be counted",
        || {
            text = get(&addr, "/metrics");
            text.contains("pelican_deliveries_completed_total")
        },
    );
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{text}"
    );
    assert!(text.contains(&format!("queue=\"{}\"", env.queue)), "{text}");
    assert!(
        text.contains("pelican_handler_duration_seconds_bucket"),
        "{text}"
    );
    let other = get(&addr, "/");
    assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
    assert!(other.contains("/metrics"), "{other}");
    drop(worker);
}
