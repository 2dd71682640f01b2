//! Nitro's wire format (`pelican::nitro`) against a client of the format written from
//! the spec's traces (`pelican_testkit::nitro`: raw commands, as Nitro's Go producer and
//! consumer send them), each test on its own redis-server.
//!
//! - `wire`: echo both ways, error keys, undecodable entries, the retry limit.
//! - `mixed`: a Nitro-style consumer and a pelican consumer in one group; an answer
//!   racing a takeover.
//! - `recovery`: the stream deleted, and Redis restarted without persistence, under
//!   running processes; graceful hand-back; gone consumers removed.
//! - `dedup`: identical requests from several producers solved once; the cache.
//! - `wake`: a request given back read again at once, an idle consumer stopped at once.

mod dedup;
mod mixed;
mod recovery;
mod wake;
mod wire;

use pelican::nitro::{Consumer, ConsumerConfig, Job, ProducerConfig, StreamConfig};
use pelican::{HandlerError, Stopper};
use pelican_testkit::{unique_name, RedisServer};
use redis::Value;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The request of most tests (what Nitro's `selftest` traces carry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Req {
    pub i: u64,
    pub data: String,
}

pub fn req(i: u64) -> Req {
    Req {
        i,
        data: "xxxx".into(),
    }
}

/// The pattern of a stream's dedup jobs (`pelican-nitro:{<stream>}:job:<hash>`).
pub fn dedup_jobs(stream: &str) -> String {
    format!("pelican-nitro:{{{stream}}}:job:*")
}

/// A test's own server and stream.
pub struct Env {
    pub server: RedisServer,
    pub stream: String,
}

impl Env {
    pub fn new(prefix: &str) -> Env {
        Env {
            server: RedisServer::start(),
            stream: unique_name(prefix),
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn config(&self) -> StreamConfig {
        StreamConfig::new(self.url(), self.stream.clone())
    }

    pub fn conn(&self) -> redis::Connection {
        self.server.sync_connection()
    }

    pub fn xlen(&self) -> u64 {
        redis::cmd("XLEN")
            .arg(&self.stream)
            .query(&mut self.conn())
            .unwrap()
    }

    /// The group's pending entries: (id, owner, idle ms, deliveries).
    pub fn pending(&self) -> Vec<(String, String, u64, u64)> {
        let v: Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg("-")
            .arg("+")
            .arg(10_000)
            .query(&mut self.conn())
            .unwrap();
        let Value::Array(rows) = v else { return vec![] };
        rows.iter()
            .map(|r| {
                let Value::Array(f) = r else { panic!("{r:?}") };
                let s = |i: usize| match &f[i] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::Int(n) => n.to_string(),
                    other => panic!("{other:?}"),
                };
                (s(0), s(1), s(2).parse().unwrap(), s(3).parse().unwrap())
            })
            .collect()
    }

    /// Keys matching a pattern.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut k: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.conn())
            .unwrap();
        k.sort();
        k
    }

    /// Every answer key and dedup key of the stream.
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = self.keys(&format!("result-key:{}.*", self.stream));
        out.extend(self.keys(&format!("error-key:{}.*", self.stream)));
        out.extend(self.keys(&dedup_jobs(&self.stream)));
        out
    }

    pub fn consumers(&self) -> Vec<(String, u64)> {
        let v: Value = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&self.stream)
            .arg(&self.stream)
            .query(&mut self.conn())
            .unwrap();
        let Value::Array(cs) = v else { return vec![] };
        cs.iter()
            .map(|c| {
                (
                    pelican_testkit::info_str(c, "name").unwrap(),
                    pelican_testkit::info_int(c, "pending").unwrap() as u64,
                )
            })
            .collect()
    }
}

/// Short timings for a consumer: reads block 200 ms, a stop waits 5 s.
pub fn consumer_config(idletime: Duration) -> ConsumerConfig {
    ConsumerConfig::default()
        .with_idletime(idletime)
        .with_block(Duration::from_millis(200))
        .with_shutdown_timeout(Duration::from_secs(5))
}

pub fn producer_config() -> ProducerConfig {
    ProducerConfig::default()
        .with_request_timeout(Duration::from_secs(30))
        .with_poll_interval(Duration::from_millis(5))
}

/// Handler runs per request `i`.
#[derive(Clone, Default)]
pub struct Runs(Arc<Mutex<HashMap<u64, u32>>>);

impl Runs {
    pub fn hit(&self, i: u64) {
        *self.0.lock().unwrap().entry(i).or_default() += 1;
    }
    pub fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
    pub fn get(&self, i: u64) -> u32 {
        self.0.lock().unwrap().get(&i).copied().unwrap_or(0)
    }
}

/// A pelican Nitro-format consumer serving in a task.
pub struct Worker {
    pub name: String,
    stopper: Stopper,
    handle: JoinHandle<pelican::Result<()>>,
}

impl Worker {
    pub async fn spawn<F, Fut>(
        stream: StreamConfig,
        cfg: ConsumerConfig,
        concurrency: usize,
        handler: F,
    ) -> Worker
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Req, HandlerError>> + Send + 'static,
    {
        let c = Consumer::<Req, Req>::connect(stream, cfg)
            .await
            .expect("nitro consumer connects");
        let name = c.name().to_string();
        let stopper = c.stopper();
        let handle = tokio::spawn(c.serve(concurrency, handler));
        Worker {
            name,
            stopper,
            handle,
        }
    }

    /// An echo worker counting its runs.
    pub async fn echo(stream: StreamConfig, cfg: ConsumerConfig, runs: Runs) -> Worker {
        Worker::spawn(stream, cfg, 4, move |r: Req, _job| {
            let runs = runs.clone();
            async move {
                runs.hit(r.i);
                Ok(r)
            }
        })
        .await
    }

    /// Stops it gracefully and waits until it is done.
    pub async fn stop(self) {
        self.stopper.stop();
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("the worker stops in time")
            .expect("serve task")
            .expect("serve returns Ok");
    }
}

/// Runs blocking raw-client code off the runtime's threads.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// The JSON of a request, as Go's `encoding/json` writes this struct.
pub fn json_of(r: &Req) -> String {
    serde_json::to_string(r).unwrap()
}
