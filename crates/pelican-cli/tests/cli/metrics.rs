//! `pelican worker --metrics`.

use crate::support::*;
use pelican_testkit::eventually_sync;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn get(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn worker_serves_prometheus_text() {
    let env = Env::new("metrics");
    let worker = env.spawn(&["worker", "--metrics", "127.0.0.1:0"]);
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
            text = get(&addr);
            text.contains("pelican_deliveries_completed_total")
        },
    );
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4"),
        "{text}"
    );
    assert!(text.contains(&format!("queue=\"{}\"", env.queue)), "{text}");
    assert!(
        text.contains("pelican_handler_duration_seconds_bucket"),
        "{text}"
    );
    drop(worker);
}
