//! What every fault scenario shares: the binary under test, the long-variant switch, the
//! scenario lock, a seeded random generator and the one-line JSON summary. The rest lives
//! in `fleet` (worker processes), `load` (this process as the producer, accounting for
//! every caller), `spy` (the producer's reply stream seen from the wire) and `checks`
//! (what must be left in Redis); all of it is re-exported here.

#![allow(dead_code)]

pub use crate::checks::*;
pub use crate::fleet::*;
pub use crate::load::*;
pub use crate::spy::*;

use pelican_testkit::RedisServer;
use serde_json::{json, Value as Json};
use std::io::Write;
use std::time::Duration;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_pelican");

/// Where every scenario's summary line is appended (besides stdout).
pub const SUMMARY_FILE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/reliability.jsonl");

/// The key prefix (the CLI's default).
pub const PREFIX: &str = "pelican";

/// The Redis keys of queue `queue` (under [`PREFIX`]), for the checks that look at Redis
/// directly.
pub fn keys(queue: &str) -> pelican::admin::Keys {
    pelican::admin::Keys::new(PREFIX, queue)
}

/// Slack on top of a request's timeout before a caller counts as hung: one sweep
/// interval of the producer plus scheduling noise on a loaded two-core machine.
pub const HANG_SLACK: Duration = Duration::from_secs(15);

/// The long variants run only with `PELICAN_SOAK=1`; otherwise the short one runs.
pub fn soak() -> bool {
    std::env::var("PELICAN_SOAK").is_ok_and(|v| v == "1")
}

/// The scenarios run one at a time: each loads both cores, and two at once would turn
/// scheduling noise into lease losses that the scenario did not inject.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the scenario lock for the rest of the test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A small xorshift generator: the tests need "random moments", not cryptography. The
/// seed is printed so a failing run can be repeated with `PELICAN_SEED=<seed>`.
pub struct Rng(u64);

impl Rng {
    pub fn new(what: &str) -> Rng {
        let seed = std::env::var("PELICAN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{what}: PELICAN_SEED={seed}");
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

/// One scenario's figures: printed as one JSON line (`RELIABILITY {...}`) and appended
/// to `SUMMARY_FILE`; RELIABILITY.md's table is made from these lines.
pub struct Summary {
    pub fault: String,
    pub load: String,
    pub duration: Duration,
    pub requests: u64,
    pub lost: u64,
    pub hung: u64,
    pub duplicates: u64,
    pub reruns: u64,
    pub extra: serde_json::Map<String, Json>,
}

impl Summary {
    /// Fills in the run's accounting from the load's report: `requests` submitted, lost,
    /// hung, and duplicates (wrong or twice-resolved answers, plus outcomes the reply spy
    /// saw pushed twice).
    pub fn account(
        &mut self,
        duration: Duration,
        requests: u64,
        report: &LoadReport,
        spied_duplicates: u64,
    ) -> &mut Self {
        self.duration = duration;
        self.requests = requests;
        self.lost = report.lost();
        self.hung = report.hung;
        self.duplicates = report.wrong + report.resolved_twice + spied_duplicates;
        self
    }

    pub fn new(fault: &str, load: &str) -> Summary {
        Summary {
            fault: fault.to_string(),
            load: load.to_string(),
            duration: Duration::ZERO,
            requests: 0,
            lost: 0,
            hung: 0,
            duplicates: 0,
            reruns: 0,
            extra: serde_json::Map::new(),
        }
    }

    pub fn set(&mut self, k: &str, v: impl Into<Json>) -> &mut Self {
        self.extra.insert(k.to_string(), v.into());
        self
    }

    pub fn emit(&self) {
        let mut v = json!({
            "fault": self.fault,
            "load": self.load,
            "variant": if soak() { "long" } else { "short" },
            "duration_s": (self.duration.as_secs_f64() * 10.0).round() / 10.0,
            "requests": self.requests,
            "lost": self.lost,
            "hung": self.hung,
            "duplicates": self.duplicates,
            "reruns": self.reruns,
        });
        for (k, x) in &self.extra {
            v[k] = x.clone();
        }
        println!("RELIABILITY {v}");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(SUMMARY_FILE)
        {
            let _ = writeln!(f, "{v}");
        }
    }
}

/// A server of the test's own, with a fresh queue name.
pub fn server() -> RedisServer {
    RedisServer::start()
}
