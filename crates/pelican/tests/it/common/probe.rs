//! What a test sees in Redis: a raw connection to the queue's node or cluster and the
//! probe over a queue's keys.

#![allow(dead_code)]

use pelican::admin::Keys;
use pelican::QueueConfig;
use pelican_testkit::{info_int, info_str, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::Value;

use super::Target;

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
