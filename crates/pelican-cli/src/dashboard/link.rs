//! The dashboard's connection: one node (the client library's reconnecting connection,
//! made lazily: the dashboard starts while Redis is down and says so), or a Redis Cluster
//! (the library's [`Deployment`]: routed by slot, every master scanned for queues).

use pelican::admin::Deployment;
use redis::aio::ConnectionManager;
use redis::{RedisFuture, RedisResult, Value};

/// Keys looked at per SCAN call on one node.
const SCAN_COUNT: u64 = 1000;

/// One node or a cluster.
#[derive(Clone)]
pub enum Link {
    Node(ConnectionManager),
    Cluster(Deployment),
}

impl Link {
    /// Every stream whose key matches `pattern`: on the node, or on every master of the
    /// cluster.
    pub async fn scan_streams(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        match self {
            Link::Cluster(d) => d.scan(pattern, Some("stream")).await,
            Link::Node(conn) => {
                let mut out = Vec::new();
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(SCAN_COUNT)
                        .arg("TYPE")
                        .arg("stream")
                        .query_async(conn)
                        .await?;
                    out.extend(keys);
                    if next == 0 {
                        return Ok(out);
                    }
                    cursor = next;
                }
            }
        }
    }
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}
