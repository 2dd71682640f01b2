//! One trace per request across processes (feature `otel`): `pelican call` and `pelican
//! worker` export their spans with `--otlp` to a collector run by this test (a real
//! OTLP/HTTP receiver: it takes the protobuf POSTs and decodes them), and the worker's
//! handler span must be a child of the caller's span, in the same trace.

use crate::support::*;
use pelican_testkit::eventually_sync;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_id: String,
}

/// An OTLP/HTTP traces receiver on a loopback port: every POST body is decoded and its
/// spans kept. The thread lives as long as the test process (it only accepts).
fn collector() -> (String, Arc<Mutex<Vec<Span>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans = Arc::new(Mutex::new(Vec::new()));
    let keep = spans.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let keep = keep.clone();
            std::thread::spawn(move || serve(conn, &keep));
        }
    });
    (url, spans)
}

/// One connection: requests until it closes (the exporter keeps connections alive).
fn serve(conn: TcpStream, spans: &Mutex<Vec<Span>>) {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).unwrap();
        assert_eq!(path, "/v1/traces", "the exporter posts to the traces path");
        spans.lock().unwrap().extend(decode(&body));
        // An empty ExportTraceServiceResponse.
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        );
    }
}

/// Protobuf fields of a message: (number, wire type, value); a length-delimited value
/// as its bytes, a varint or fixed value as a number.
fn fields(mut b: &[u8]) -> Vec<(u64, u8, Vec<u8>, u64)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return v;
            }
            shift += 7;
        }
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let (num, wire) = (key >> 3, (key & 7) as u8);
        match wire {
            0 => {
                let v = varint(&mut b);
                out.push((num, wire, Vec::new(), v));
            }
            1 => {
                out.push((num, wire, b[..8].to_vec(), 0));
                b = &b[8..];
            }
            2 => {
                let n = varint(&mut b) as usize;
                out.push((num, wire, b[..n].to_vec(), 0));
                b = &b[n..];
            }
            5 => {
                out.push((num, wire, b[..4].to_vec(), 0));
                b = &b[4..];
            }
            w => panic!("unexpected protobuf wire type {w}"),
        }
    }
    out
}

fn sub(b: &[u8], num: u64) -> Vec<Vec<u8>> {
    fields(b)
        .into_iter()
        .filter(|f| f.0 == num && f.1 == 2)
        .map(|f| f.2)
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// ExportTraceServiceRequest { resource_spans = 1 } -> ResourceSpans { resource = 1
/// (attributes = 1: KeyValue { key = 1, value = 2: AnyValue { string_value = 1 } }),
/// scope_spans = 2 } -> ScopeSpans { spans = 2 } -> Span { trace_id = 1, span_id = 2,
/// parent_span_id = 4, name = 5 }.
fn decode(body: &[u8]) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in sub(body, 1) {
        let mut service = String::new();
        for res in sub(&rs, 1) {
            for kv in sub(&res, 1) {
                let key = sub(&kv, 1).first().cloned().unwrap_or_default();
                if key == b"service.name" {
                    for any in sub(&kv, 2) {
                        if let Some(s) = sub(&any, 1).first() {
                            service = String::from_utf8_lossy(s).into_owned();
                        }
                    }
                }
            }
        }
        for ss in sub(&rs, 2) {
            for sp in sub(&ss, 2) {
                let one = |n| sub(&sp, n).first().cloned().unwrap_or_default();
                out.push(Span {
                    service: service.clone(),
                    name: String::from_utf8_lossy(&one(5)).into_owned(),
                    trace_id: hex(&one(1)),
                    span_id: hex(&one(2)),
                    parent_id: hex(&one(4)),
                });
            }
        }
    }
    out
}

#[test]
fn a_request_is_one_trace_from_call_through_the_worker() {
    let (url, spans) = collector();
    let env = Env::new("trace");
    let worker = env.spawn(&["--otlp", &url, "worker", "--handler", "echo"]);
    let out = env.run(&["--otlp", &url, "call", r#"{"traced": true}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim(), r#"{"traced":true}"#);
    // SIGTERM: the worker stops gracefully and sends its last spans on the way out.
    worker.signal(libc::SIGTERM);
    let w = worker.wait(Duration::from_secs(60));
    assert_eq!(w.code, 0, "{w:?}");

    let find = |service: &str, name: &str| {
        spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.service == service && s.name == name)
            .cloned()
    };
    eventually_sync(
        Duration::from_secs(30),
        "both processes' spans at the collector",
        || {
            find("pelican-call", "call").is_some()
                && find("pelican-worker", "pelican.handle").is_some()
        },
    );
    let call = find("pelican-call", "call").unwrap();
    let handle = find("pelican-worker", "pelican.handle").unwrap();
    assert_eq!(call.trace_id.len(), 32, "{call:?}");
    assert_ne!(call.trace_id, "0".repeat(32));
    assert_eq!(
        handle.trace_id, call.trace_id,
        "the worker's span is in the caller's trace: {handle:?} {call:?}"
    );
    assert_eq!(
        handle.parent_id, call.span_id,
        "the worker's handler span is a child of the caller's span: {handle:?} {call:?}"
    );
    assert!(
        call.parent_id.is_empty(),
        "the call starts the trace: {call:?}"
    );
}
