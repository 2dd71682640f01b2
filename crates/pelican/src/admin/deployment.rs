//! The Redis of a whole deployment, for tools that look at every queue under a key
//! prefix (the dashboard): one node or a cluster, behind one connection.

use crate::conn::{cluster, Conn, Endpoint};
use crate::error::Result;
use redis::{RedisFuture, Value};
use std::time::Duration;

/// A connection to a deployment's Redis, not tied to one queue: a single node
/// (`redis://`, `rediss://`, `unix://`) or a Redis Cluster (`redis+cluster://`,
/// `rediss+cluster://`). Commands that name keys go to the node that holds them (on a
/// cluster: routed by slot, following `MOVED`, `ASK` and failovers); a pipeline must
/// name keys of one slot only (a queue partition's keys share one). [`Deployment::scan`]
/// covers every master. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Deployment {
    conn: Conn,
    cluster: bool,
}

impl Deployment {
    /// Connects to `url` (trusting `tls_root_ca_pem` for TLS), each command waiting at
    /// most `command_timeout`. A [`crate::ErrorKind::Config`] error for a bad URL, a
    /// [`crate::ErrorKind::Redis`] one when no node answers.
    pub async fn connect(
        url: &str,
        tls_root_ca_pem: Option<&[u8]>,
        command_timeout: Duration,
    ) -> Result<Deployment> {
        // Only the shared connection is used (no task's own): the lean switch is moot.
        let endpoint = Endpoint::of(url, tls_root_ca_pem, command_timeout, true)?;
        let conn = endpoint.connect(url, command_timeout).await?;
        Ok(Deployment {
            conn,
            cluster: !endpoint.is_single_node(),
        })
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The `host:port` of every master (one node: none; it is the only one).
    pub async fn masters(&self) -> redis::RedisResult<Vec<String>> {
        if !self.cluster {
            return Ok(Vec::new());
        }
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn.clone())
            .await?;
        let masters = cluster::masters(&slots);
        if masters.is_empty() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the cluster names no master",
                "CLUSTER SLOTS answered no slot range".to_string(),
            )));
        }
        Ok(masters)
    }

    /// The master (`host:port`) that serves each of `keys` now, as the cluster names it
    /// (one `CLUSTER SLOTS` for all); `None` for each on one node.
    pub async fn masters_of(&self, keys: &[&str]) -> redis::RedisResult<Vec<Option<String>>> {
        if !self.cluster {
            return Ok(vec![None; keys.len()]);
        }
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(keys
            .iter()
            .map(|k| cluster::master_of(&slots, cluster::slot(k.as_bytes())))
            .collect())
    }

    /// Every key matching `pattern` (and of type `kind`, e.g. `stream`, when given), on
    /// every master of a cluster or on the one node: `SCAN` in steps of about 1000 keys.
    /// For operators' tools, not for a hot path. A key may be listed twice when a slot
    /// moves between masters while they are scanned.
    pub async fn scan(&self, pattern: &str, kind: Option<&str>) -> redis::RedisResult<Vec<String>> {
        let mut out = Vec::new();
        if !self.cluster {
            self.scan_node(None, pattern, kind, &mut out).await?;
            return Ok(out);
        }
        for node in self.masters().await? {
            self.scan_node(Some(&node), pattern, kind, &mut out).await?;
        }
        Ok(out)
    }

    async fn scan_node(
        &self,
        node: Option<&str>,
        pattern: &str,
        kind: Option<&str>,
        out: &mut Vec<String>,
    ) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            if let Some(kind) = kind {
                cmd.arg("TYPE").arg(kind);
            }
            let v = match node {
                Some(node) => conn.query_on(cmd, "", Some(node)).await?,
                None => cmd.query_async(&mut conn).await?,
            };
            let (next, keys): (u64, Vec<String>) = redis::from_redis_value(v)?;
            out.extend(keys);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

impl redis::aio::ConnectionLike for Deployment {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}
