//! Helpers shared by the integration tests.

#![allow(dead_code)]

use pelican::{
    Consumer, ConsumerConfig, HandlerError, Job, Keys, ProducerConfig, QueueConfig, Stopper,
};
use pelican_testkit::{info_int, info_str, unique_name, RedisCluster, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::Value;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
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

    fn node_urls(&self) -> Vec<String> {
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

/// A raw connection to one node or to a cluster (routed by key).
#[derive(Clone)]
pub enum RawConn {
    Node(MultiplexedConnection),
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

impl redis::aio::ConnectionLike for RawConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            RawConn::Node(c) => c.req_packed_command(cmd),
            RawConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            RawConn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            RawConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RawConn::Node(c) => c.get_db(),
            RawConn::Cluster(c) => c.get_db(),
        }
    }
}

/// A raw client on a queue's keys: what a test sees in Redis, and what a foreign or
/// broken client can write. Key names follow the protocol (`docs/PROTOCOL.md`). The
/// single-key helpers (`stream`, `req`, ...) name partition 0's keys; the counts
/// (`xlen`, `entries_added`, `pending`, `keys`, `leftovers`) cover every partition.
#[derive(Clone)]
pub struct Probe {
    conn: RawConn,
    names: Keys,
    /// Every partition's keys.
    parts: Vec<Keys>,
    /// Where to look for keys (every node of a cluster).
    node_urls: Vec<String>,
}

/// The consumer group every queue uses.
pub const GROUP: &str = "pelican";

impl Probe {
    pub async fn new(server: &RedisServer, q: &QueueConfig) -> Probe {
        let conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        Probe {
            conn: RawConn::Node(conn),
            names: q.keys(),
            parts: (0..q.partitions).map(|p| q.partition_keys(p)).collect(),
            node_urls: vec![server.url()],
        }
    }

    /// A probe of `q` wherever it lives.
    pub async fn on(target: &Target, q: &QueueConfig) -> Probe {
        Probe {
            conn: target.conn().await,
            names: q.keys(),
            parts: (0..q.partitions).map(|p| q.partition_keys(p)).collect(),
            node_urls: target.node_urls(),
        }
    }

    pub fn conn(&self) -> RawConn {
        self.conn.clone()
    }

    pub fn stream(&self) -> String {
        self.names.stream().to_string()
    }

    pub fn dead(&self) -> String {
        self.names.dead().to_string()
    }

    pub fn req(&self, rid: &str) -> String {
        self.names.req(rid)
    }

    pub fn reply(&self, producer: &str) -> String {
        self.names.reply(producer)
    }

    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query_async(&mut self.conn())
            .await
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
    }

    /// Live entries of the request streams.
    pub async fn xlen(&self) -> u64 {
        let mut n = 0;
        for k in &self.parts {
            n += self.query::<u64>(redis::cmd("XLEN").arg(k.stream())).await;
        }
        n
    }

    /// Entries ever added to the request streams (XINFO STREAM entries-added).
    pub async fn entries_added(&self) -> u64 {
        let mut n = 0;
        for k in &self.parts {
            n += self.entries_added_to(k.stream()).await;
        }
        n
    }

    /// Entries ever added to any stream.
    pub async fn entries_added_to(&self, key: &str) -> u64 {
        let v: Value = self.query(redis::cmd("XINFO").arg("STREAM").arg(key)).await;
        info_int(&v, "entries-added").expect("entries-added") as u64
    }

    /// Entries in the groups' pending lists.
    pub async fn pending(&self) -> u64 {
        let mut n = 0;
        for k in &self.parts {
            let v: Value = self
                .query(redis::cmd("XPENDING").arg(k.stream()).arg(GROUP))
                .await;
            n += match v {
                Value::Array(a) => match a.first() {
                    Some(Value::Int(n)) => *n as u64,
                    other => panic!("XPENDING summary: {other:?}"),
                },
                other => panic!("XPENDING summary: {other:?}"),
            };
        }
        n
    }

    /// Names and pending counts of the group's consumers.
    pub async fn consumers(&self) -> Vec<(String, u64)> {
        let v: Value = self
            .query(
                redis::cmd("XINFO")
                    .arg("CONSUMERS")
                    .arg(self.stream())
                    .arg(GROUP),
            )
            .await;
        let Value::Array(cs) = v else {
            panic!("XINFO CONSUMERS: {v:?}")
        };
        cs.iter()
            .map(|c| {
                (
                    info_str(c, "name").expect("name"),
                    info_int(c, "pending").expect("pending") as u64,
                )
            })
            .collect()
    }

    pub async fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.query(redis::cmd("GET").arg(key)).await
    }

    pub async fn exists(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)).await == 1
    }

    /// Every key of the queue (every partition's, on every node), sorted.
    pub async fn keys(&self) -> Vec<String> {
        let mut keys = std::collections::BTreeSet::new();
        for url in &self.node_urls {
            let mut c = redis::Client::open(url.as_str())
                .expect("node URL")
                .get_multiplexed_async_connection()
                .await
                .expect("node connection");
            for k in &self.parts {
                let found: Vec<String> = redis::cmd("KEYS")
                    .arg(k.pattern())
                    .query_async(&mut c)
                    .await
                    .expect("KEYS");
                // A replica's copy of a master's key: the same name.
                keys.extend(found);
            }
            // The queue-level record (partitions) is matched by partition 0's pattern
            // only when the queue has one partition.
            let extra: Vec<String> = redis::cmd("KEYS")
                .arg(self.names.partitions())
                .query_async(&mut c)
                .await
                .expect("KEYS");
            keys.extend(extra);
        }
        keys.into_iter().collect()
    }

    /// Request keys holding a pending index ("P<sid>;<deadline>;<producers>;").
    pub async fn pending_index_keys(&self) -> Vec<String> {
        let mut out = Vec::new();
        for k in self.keys().await {
            if !k.starts_with(&self.names.req("")) {
                continue;
            }
            if let Some(v) = self.get(&k).await {
                if v.first() == Some(&b'P') {
                    out.push(format!("{k} = {}", String::from_utf8_lossy(&v)));
                }
            }
        }
        out
    }

    /// Keys that must not outlive the work: pending indexes and anything that is
    /// neither the stream, the dead-letter stream, the janitor lock, the record of the
    /// number of partitions, a cached outcome nor one of the `live_producers`' reply
    /// streams.
    pub async fn leftovers(&self, live_producers: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        for k in self.keys().await {
            let fixed = self
                .parts
                .iter()
                .flat_map(|p| [p.stream(), p.dead(), p.janitor_lock(), p.partitions()])
                .any(|f| f == k);
            let reply = self
                .parts
                .iter()
                .any(|p| live_producers.iter().any(|id| k == p.reply(id)));
            if fixed || reply {
                continue;
            }
            if self.parts.iter().any(|p| k.starts_with(&p.req(""))) {
                match self.get(&k).await {
                    // a cached outcome: a tag byte O/E/D/X then the payload
                    Some(v) if matches!(v.first(), Some(b'O' | b'E' | b'D' | b'X')) => continue,
                    None => continue, // expired meanwhile
                    Some(v) => out.push(format!("{k} = {}", String::from_utf8_lossy(&v))),
                }
            } else {
                out.push(k);
            }
        }
        out
    }

    /// Adds a raw entry to the request stream, as a foreign or broken client would.
    pub async fn xadd(&self, fields: &[(&str, &[u8])]) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.stream()).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        self.query(&cmd).await
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
