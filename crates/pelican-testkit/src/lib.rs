//! Test support for pelican: real `redis-server` processes (plain, or TLS-only with a
//! throwaway CA: [`TestCa`]), Redis Clusters (plain or TLS-only), a fault-injecting TCP
//! proxy and a client of Nitro's wire format ([`nitro`]), plus small polling helpers.
//!
//! Everything here uses real processes and real sockets; nothing is mocked.
//! `redis-server` and `redis-cli` must be on `PATH` (or the server binary named by
//! `PELICAN_TEST_REDIS_SERVER`, e.g. Valkey's; the helpers panic with a clear
//! message otherwise, tests are never skipped silently).
//!
//! All handles clean up on `Drop` (also while unwinding from a panic): servers are
//! SIGKILLed and reaped and their data directories removed, proxies close every
//! connection and stop their threads. On Linux every spawned `redis-server` also
//! gets `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the test process even when
//! the test binary itself is killed.
//!
//! The API is synchronous (except [`eventually`]) so it can be used from plain
//! `#[test]`s as well as from any tokio runtime flavour.

#![warn(missing_docs)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod cluster;
pub mod nitro;
mod proxy;
mod resp;
mod server;
mod sys;
mod tls;

pub use cluster::{RedisCluster, SlotMove};
pub use proxy::Proxy;
pub use server::{server_binary, RedisServer, RedisServerBuilder, SERVER_ENV};
pub use tls::{TestCa, TlsFiles};

/// Interval between two evaluations of the condition in [`eventually`] and
/// [`eventually_sync`].
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `cond` every 10 ms until it returns true or `timeout` passes; panics with
/// `what` and the elapsed time on timeout.
///
/// The condition is evaluated at least once. A single evaluation that does not
/// complete before the deadline also counts as a timeout, so a hanging condition
/// cannot hang the test. Needs a tokio runtime with the time driver enabled
/// (`#[tokio::test]` has it).
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        let remaining = timeout.saturating_sub(start.elapsed()).max(POLL_INTERVAL);
        match tokio::time::timeout(remaining, cond()).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => panic!(
                "timed out after {:?} (limit {:?}) waiting for {what}: the condition itself did not complete",
                start.elapsed(),
                timeout
            ),
        }
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {:?} (limit {:?}) waiting for {what}",
                start.elapsed(),
                timeout
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Blocking variant of [`eventually`] for sync code: polls `cond` every 10 ms until it
/// returns true or `timeout` passes; panics with `what` and the elapsed time on timeout.
///
/// The condition is evaluated at least once.
pub fn eventually_sync(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        if cond() {
            return;
        }
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {:?} (limit {:?}) waiting for {what}",
                start.elapsed(),
                timeout
            );
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A TCP port that is free on 127.0.0.1, for a listener a test sets up itself (a
/// server's `--tls-port`, a fixed [`RedisServerBuilder::port`], or an address where
/// nothing must answer).
///
/// The one port picker of the tests; [`RedisServer`] uses it too. The port is outside
/// the kernel's ephemeral range (so no outgoing connection takes it before the test
/// binds it), `port + 10000` is free as well (a cluster node's bus), and it is never
/// handed out again by this process, so concurrent tests cannot get the same one.
pub fn free_port() -> u16 {
    sys::pick_server_port()
}

/// Returns a unique name for a test (queue, stream, key prefix...):
/// `"t-<prefix>-<pid>-<counter>"`.
///
/// Unique within the process (a process-wide counter) and across concurrently
/// running test binaries (the process id).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("t-{prefix}-{}-{n}", std::process::id())
}

/// A field of an XINFO reply (RESP2 flat array or RESP3 map).
pub fn info_field<'a>(v: &'a redis::Value, name: &str) -> Option<&'a redis::Value> {
    match v {
        redis::Value::Array(a) => a
            .chunks(2)
            .find(|kv| matches!(&kv[0], redis::Value::BulkString(b) if b == name.as_bytes()))
            .and_then(|kv| kv.get(1)),
        redis::Value::Map(m) => m
            .iter()
            .find(|(k, _)| matches!(k, redis::Value::BulkString(b) if b == name.as_bytes()))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// An integer field of an XINFO reply.
pub fn info_int(v: &redis::Value, name: &str) -> Option<i64> {
    match info_field(v, name)? {
        redis::Value::Int(i) => Some(*i),
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A string field of an XINFO reply.
pub fn info_str(v: &redis::Value, name: &str) -> Option<String> {
    match info_field(v, name)? {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
