//! Helpers shared by the integration tests.

#![allow(dead_code)]

mod counters;
mod probe;
pub use counters::*;
pub use probe::*;

use pelican::{
    Bytes, Consumer, ConsumerConfig, HandlerError, Job, ProducerConfig, QueueConfig, Raw, Stopper,
};
use pelican_testkit::{unique_name, RedisCluster, RedisServer};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// With `RUST_LOG` set (e.g. `RUST_LOG=pelican=debug`), the library's logs go to the
/// test's captured output, shown when it fails; without it, nothing is logged. For the
/// fault tests, whose failures depend on timing and are hard to reproduce.
pub fn logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// The request type of most tests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Req {
    pub i: u64,
    #[serde(default)]
    pub tag: String,
}

impl Req {
    pub fn new(i: u64, tag: &str) -> Req {
        Req {
            i,
            tag: tag.to_string(),
        }
    }
}

/// The response type of most tests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Resp {
    pub i: u64,
    pub by: String,
}

/// The wall clock in ms since the epoch, as entries carry times.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A deadline a minute from now, in digits, as an entry carries it.
pub fn in_a_minute() -> String {
    (now_ms() + 60_000).to_string()
}

/// A queue config with short timings for tests.
pub fn queue(server: &RedisServer, name: &str) -> QueueConfig {
    QueueConfig::new(server.url(), unique_name(name))
        .with_janitor_interval(Duration::from_millis(200))
}

/// Short claim idle (600 ms: leases renewed every 200 ms), short blocks.
pub fn fast_consumer() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_claim_idle(Duration::from_millis(600))
        .with_block(Duration::from_millis(200))
        .with_shutdown_timeout(Duration::from_secs(5))
}

pub fn fast_producer() -> ProducerConfig {
    ProducerConfig::default()
        .with_request_timeout(Duration::from_secs(20))
        .with_block(Duration::from_millis(500))
}

/// Keys of a queue still present (SCAN over the queue's hash tag).
pub fn keys_of(server: &RedisServer, q: &QueueConfig) -> Vec<String> {
    let mut c = server.sync_connection();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(q.keys().pattern())
        .query(&mut c)
        .unwrap();
    keys.sort();
    keys
}

/// The queue's stored request bodies still in Redis (docs/PROTOCOL.md, "Stored bodies").
pub fn stored_bodies(server: &RedisServer, q: &QueueConfig) -> Vec<String> {
    keys_of(server, q)
        .into_iter()
        .filter(|k| k.contains(":body:") && !k.contains(":body:a"))
        .collect()
}

/// The queue's stored answers still in Redis (docs/PROTOCOL.md, "Stored answers"), each
/// with its ttl in ms (-1: none).
pub fn stored_answers(server: &RedisServer, q: &QueueConfig) -> Vec<(String, i64)> {
    let mut c = server.sync_connection();
    keys_of(server, q)
        .into_iter()
        .filter(|k| k.contains(":body:a"))
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut c).unwrap();
            (k, ttl)
        })
        .collect()
}

/// Where a test's queue lives: one redis-server, or a Redis Cluster.
pub enum Target {
    Node(RedisServer),
    Cluster(RedisCluster),
}

impl Target {
    /// The URL producers and consumers connect to.
    pub fn url(&self) -> String {
        match self {
            Target::Node(s) => s.url(),
            Target::Cluster(c) => c.cluster_url(),
        }
    }

    /// A queue config with short timings for tests, `partitions` partitions.
    pub fn queue(&self, name: &str, partitions: u32) -> QueueConfig {
        QueueConfig::new(self.url(), unique_name(name))
            .with_janitor_interval(Duration::from_millis(200))
            .with_partitions(partitions)
    }

    /// The URL of every node that runs.
    pub fn node_urls(&self) -> Vec<String> {
        match self {
            Target::Node(s) => vec![s.url()],
            Target::Cluster(c) => c
                .nodes()
                .iter()
                .filter(|n| n.is_running())
                .map(|n| n.url())
                .collect(),
        }
    }

    async fn conn(&self) -> RawConn {
        match self {
            Target::Node(s) => RawConn::Node(
                s.client()
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connection"),
            ),
            Target::Cluster(c) => {
                let urls: Vec<String> = c.nodes().iter().map(|n| n.url()).collect();
                let client = redis::cluster::ClusterClient::new(urls).expect("cluster client");
                RawConn::Cluster(Box::new(
                    client
                        .get_async_connection()
                        .await
                        .expect("raw cluster connection"),
                ))
            }
        }
    }
}

/// Handler runs per request id.
#[derive(Clone, Default)]
pub struct Runs(Arc<Mutex<HashMap<String, u32>>>);

impl Runs {
    /// Counts one run of `rid`; returns how many there were, this one included.
    pub fn hit(&self, rid: &str) -> u32 {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(rid.to_string()).or_default();
        *n += 1;
        *n
    }

    pub fn get(&self, rid: &str) -> u32 {
        self.0.lock().unwrap().get(rid).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }

    pub fn snapshot(&self) -> HashMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

/// A gate handlers wait on until the test opens it.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(watch::channel(false).0))
    }
}

impl Gate {
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        rx.wait_for(|open| *open).await.expect("gate dropped");
    }
}

/// A consumer running [`Consumer::serve`] in a task.
pub struct Worker {
    pub name: String,
    stopper: Stopper,
    handle: JoinHandle<pelican::Result<()>>,
}

impl Worker {
    pub async fn spawn<F, Fut>(
        q: &QueueConfig,
        cfg: ConsumerConfig,
        concurrency: usize,
        handler: F,
    ) -> Worker
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, HandlerError>> + Send + 'static,
    {
        let c = Consumer::<Req, Resp>::connect(q.clone(), cfg)
            .await
            .expect("consumer connects");
        let name = c.name().to_string();
        let stopper = c.stopper();
        let handle = tokio::spawn(c.serve(concurrency, handler));
        Worker {
            name,
            stopper,
            handle,
        }
    }

    /// A worker that answers `echo(req, by)` and counts its runs per request id.
    pub async fn counting(
        q: &QueueConfig,
        cfg: ConsumerConfig,
        by: &'static str,
    ) -> (Worker, Runs) {
        let runs = Runs::default();
        let r2 = runs.clone();
        let w = Worker::spawn(q, cfg, 4, move |r: Req, job| {
            let runs = r2.clone();
            async move {
                runs.hit(job.request_id());
                Ok(echo(&r, by))
            }
        })
        .await;
        (w, runs)
    }

    /// A worker that counts its runs per request id, holds every request until `gate`
    /// opens, then answers `echo(req, by)`.
    pub async fn gated(q: &QueueConfig, cfg: ConsumerConfig, by: String) -> (Worker, Runs, Gate) {
        let runs = Runs::default();
        let gate = Gate::default();
        let (r2, g2) = (runs.clone(), gate.clone());
        let w = Worker::spawn(q, cfg, 4, move |r: Req, job| {
            let (runs, gate, by) = (r2.clone(), g2.clone(), by.clone());
            async move {
                runs.hit(job.request_id());
                gate.wait().await;
                Ok(echo(&r, &by))
            }
        })
        .await;
        (w, runs, gate)
    }

    /// Stops it gracefully and waits until it has left.
    pub async fn stop(self) {
        self.stopper.stop();
        self.handle
            .await
            .expect("serve task")
            .expect("serve returns Ok");
    }

    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// A consumer dies: the delivery stays in its pending list, unanswered and
/// unreleased, until another consumer reclaims it after claim_idle.
pub fn die<D>(consumer: Consumer<Req, Resp>, delivery: D) {
    std::mem::forget(delivery);
    drop(consumer);
}

/// An echo response.
pub fn echo(r: &Req, by: &str) -> Resp {
    Resp {
        i: r.i,
        by: by.to_string(),
    }
}

/// Awaits `fut` for at most `limit`; panics naming `what` when it takes longer.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not happen within {limit:?}"),
    }
}

/// A raw consumer (`pelican::Raw` bodies) on `q` answering `concurrency` requests at a time with `answer`, and
/// the count of its handler's runs, its stopper and its task.
pub async fn counting_raw_worker(
    q: &QueueConfig,
    concurrency: usize,
    answer: fn(Bytes) -> Bytes,
) -> (Arc<AtomicU64>, Stopper, JoinHandle<pelican::Result<()>>) {
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let consumer = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let stop = consumer.stopper();
    let w = tokio::spawn(consumer.serve(concurrency, move |b: Bytes, _| {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move { Ok(answer(b)) }
    }));
    (runs, stop, w)
}
