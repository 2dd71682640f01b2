//! A connected queue: what its producers, consumers and admin share (the validated
//! configuration, the keys, the scripts, the metrics and the shared connection), and
//! the janitor they all run.

use crate::clock::{ms, now_ms};
use crate::config::PartitionLayout;
use crate::config::QueueConfig;
use crate::conn::{Conn, Endpoint, OwnConn};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::protocol::keys::Keys;
pub use crate::protocol::scripts::JanitorReport;
use crate::protocol::scripts::{Janitor, Scripts};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// How many undelivered entries one janitor run checks for expiry.
const JANITOR_SCAN: usize = 100;

/// Most submit script calls one producer has on the wire at once for a node with one
/// partition; a node with `n` partitions allows `max(1, 4 / n)` for all of them together
/// (see [`NodeGate`]).
pub(crate) const SUBMITS_IN_FLIGHT: usize = 4;

/// What the partitions living on one Redis node share within one producer, consumer or
/// admin: limits on the batched script calls they have on the wire at once, counted for
/// the node rather than per partition. A call carries whatever queued up while the calls
/// before it were on the wire, so with the limit per partition, `P` partitions on one node
/// made `P` times as many calls, each `1/P` as large, and Redis paid the fixed cost of a
/// call (the script's entry, a reply push per producer, the socket read and write) `P`
/// times as often. With the limit per node, `P` partitions make about as many calls as
/// one. The partitions take turns (the semaphores are fair: first come, first served).
pub(crate) struct NodeGate {
    /// The consumer's outcome writers: one call (`complete.lua` or `release.lua`) on the
    /// wire at a time for the node, as one partition's writer always had.
    pub(crate) writes: Arc<Semaphore>,
    /// The producer's submitters: [`SUBMITS_IN_FLIGHT`] calls at a time for a node with
    /// one partition, `max(1, 4 / n)` for a node with `n`. One partition's submissions
    /// come in bursts (the callers woken by one read of outcomes submit again together),
    /// and a burst goes out in one call while a call slot is free; a burst spread over
    /// `n` partitions would take `n` calls if `n` slots were free, so fewer slots make
    /// the partitions that wait carry more (measured at P = 6 on one node: submit calls
    /// per request 0.25 with 4 slots, 0.15 with 2, 0.11 with 1; BENCHMARKS.md).
    pub(crate) submits: Arc<Semaphore>,
}

impl NodeGate {
    /// The limits of a node that holds `partitions` of the queue's partitions.
    fn new(partitions: usize) -> Arc<NodeGate> {
        Arc::new(NodeGate {
            writes: Arc::new(Semaphore::new(1)),
            submits: Arc::new(Semaphore::new(
                (SUBMITS_IN_FLIGHT / partitions.max(1)).max(1),
            )),
        })
    }
}

/// One partition of a connected queue (a queue of one partition has one): its keys and
/// scripts, and what all partitions share (the connection, the metrics).
pub(crate) struct Shared {
    pub(crate) queue: QueueConfig,
    /// Which partition: 0 to `queue.partitions - 1`.
    pub(crate) partition: u32,
    pub(crate) keys: Keys,
    pub(crate) endpoint: Endpoint,
    pub(crate) conn: Conn,
    pub(crate) scripts: Scripts,
    pub(crate) metrics: Metrics,
    /// The limits shared with the other partitions on the same node (see [`NodeGate`]).
    pub(crate) node: Arc<NodeGate>,
}

impl Shared {
    /// Connects to the queue (one `Shared` per partition, one connection for all),
    /// checks or records its number of partitions and their layout, and creates the
    /// streams and consumer groups that are missing.
    pub(crate) async fn connect(queue: &QueueConfig) -> Result<Vec<Arc<Shared>>> {
        let (endpoint, mut conn) = Shared::open(queue).await?;
        let key = Keys::new(&queue.prefix, &queue.name).partitions;
        let value = queue
            .partition_layout
            .for_new_queue()
            .record(queue.partitions);
        // Recorded by the first process of the queue; any later one must agree.
        let (_, recorded): ((), Option<String>) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("NX")
            .cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("recording the queue's number of partitions", e))?;
        let queue = as_recorded(queue, recorded.as_deref())?;
        let parts = Shared::parts(&queue, endpoint, conn).await;
        for part in &parts {
            part.ensure_group().await?;
        }
        Ok(parts)
    }

    /// Connects without creating anything in Redis (for operators' tools); still refuses
    /// a number of partitions or a layout other than the queue's recorded one.
    pub(crate) async fn connect_only(queue: &QueueConfig) -> Result<Vec<Arc<Shared>>> {
        let (endpoint, mut conn) = Shared::open(queue).await?;
        let recorded: Option<String> = redis::cmd("GET")
            .arg(Keys::new(&queue.prefix, &queue.name).partitions)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("reading the queue's number of partitions", e))?;
        let queue = as_recorded(queue, recorded.as_deref())?;
        Ok(Shared::parts(&queue, endpoint, conn).await)
    }

    /// Validates the configuration and opens the connection every partition shares.
    async fn open(queue: &QueueConfig) -> Result<(Endpoint, Conn)> {
        queue.validate()?;
        let ca = queue.tls_root_ca_pem.as_deref();
        let endpoint = Endpoint::of(
            &queue.url,
            ca,
            queue.command_timeout,
            queue.lean_connections,
        )?;
        let conn = endpoint.connect(&queue.url, queue.command_timeout).await?;
        Ok((endpoint, conn))
    }

    /// One `Shared` per partition of `queue` (its layout resolved: `Spread` or `Legacy`).
    async fn parts(queue: &QueueConfig, endpoint: Endpoint, mut conn: Conn) -> Vec<Arc<Shared>> {
        let metrics = Metrics::new(&queue.name);
        let nodes = node_indexes(&endpoint, &mut conn, queue).await;
        let gates: Vec<Arc<NodeGate>> = (0..=nodes.iter().copied().max().unwrap_or(0))
            .map(|n| NodeGate::new(nodes.iter().filter(|&&m| m == n).count()))
            .collect();
        (0..queue.partitions)
            .map(|p| {
                let keys = queue.partition_keys(p);
                Arc::new(Shared {
                    node: gates[nodes[p as usize]].clone(),
                    scripts: Scripts::new(keys.clone()),
                    keys,
                    partition: p,
                    queue: queue.clone(),
                    endpoint: endpoint.clone(),
                    conn: conn.clone(),
                    metrics: metrics.clone(),
                })
            })
            .collect()
    }

    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Creates the stream and the consumer group if they are missing (idempotent). The
    /// group starts at `0` so that entries added before it existed are still delivered.
    pub(crate) async fn ensure_group(&self) -> Result<()> {
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.keys.stream)
            .arg(&self.keys.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(Error::redis("creating the consumer group", e)),
        }
    }

    /// A connection of its own for one blocking reader: a blocked read would hold up
    /// every other command on a shared connection, and the response timeout must
    /// outlast the block or the client gives up while the server still delivers.
    pub(crate) async fn blocking_connection(&self, block: Duration) -> Result<OwnConn> {
        self.own_connection(block + self.queue.command_timeout)
            .await
    }

    /// A connection of its own for a task that sends one command at a time.
    pub(crate) async fn own_connection(&self, timeout: Duration) -> Result<OwnConn> {
        self.endpoint
            .own_connection(&mut self.conn(), &self.keys.stream, timeout)
            .await
    }

    /// Every key matching `pattern` (SCAN: fine for operators' tools, not for a hot path).
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            // The queue's keys share one hash tag: on a cluster, scan the node of its slot.
            let v = conn
                .query_near(cmd, &self.keys.stream)
                .await
                .map_err(|e| Error::redis("SCAN", e))?;
            let (next, keys): (u64, Vec<String>) =
                redis::from_redis_value(v).map_err(|e| Error::redis("SCAN", e.into()))?;
            out.extend(keys);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Runs the janitor unless another process ran it within the interval.
    pub(crate) async fn janitor(&self, runner: &str) -> Result<JanitorReport> {
        let q = &self.queue;
        let report = Janitor {
            now_ms: now_ms(),
            interval_ms: ms(q.janitor_interval).max(1),
            runner,
            consumer_gc_after_ms: ms(q.consumer_gc_after),
            result_ttl_ms: ms(q.result_ttl),
            reply_maxlen: q.reply_maxlen,
            scan: JANITOR_SCAN,
        }
        .call(&self.scripts)
        .invoke(&mut self.conn())
        .await
        .map_err(|e| Error::redis("running the janitor", e))?;
        if report.ran && (report.trimmed + report.expired + report.consumers_removed) > 0 {
            tracing::debug!(queue = %q.name, ?report, "janitor");
        }
        Ok(report)
    }
}

/// For each partition, the index of the node it lives on: all 0 on a single node; on a
/// cluster, by the master that owns the partition's slot now (one `CLUSTER SLOTS`). When
/// the cluster cannot tell, each partition counts as a node of its own (the limits are
/// then per partition, as they were before they were per node). Only an optimisation:
/// after a failover or a resharding two groups may share a node, or one group span two,
/// which costs batching, never correctness.
async fn node_indexes(endpoint: &Endpoint, conn: &mut Conn, queue: &QueueConfig) -> Vec<usize> {
    let n = queue.partitions as usize;
    if endpoint.is_single_node() {
        return vec![0; n];
    }
    let own = (0..n).collect();
    if n == 1 {
        return own;
    }
    let Ok(slots) = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<redis::Value>(conn)
        .await
    else {
        return own;
    };
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(n);
    for p in 0..queue.partitions {
        let stream = queue.partition_keys(p).stream;
        let Some(master) =
            crate::conn::cluster::master_of(&slots, crate::conn::cluster::slot(stream.as_bytes()))
        else {
            return own;
        };
        let next = index.len();
        out.push(*index.entry(master).or_insert(next));
    }
    out
}

/// `queue` with the layout the queue has recorded (`recorded`: the value of its record,
/// `None` before one is written: the layout a new queue gets). Refuses a process whose
/// number of partitions or layout differs from the queue's.
fn as_recorded(queue: &QueueConfig, recorded: Option<&str>) -> Result<QueueConfig> {
    let configured = queue.partition_layout;
    let Some(value) = recorded else {
        return Ok(queue
            .clone()
            .with_partition_layout(configured.for_new_queue()));
    };
    let Some((n, layout)) = PartitionLayout::parse_record(value) else {
        return Err(Error::config(format!(
            "queue {:?} records its partitions as {value:?} (key {}), which this build of \
             pelican cannot read: a later build wrote it, or something other than pelican; \
             use a build that reads it",
            queue.name,
            Keys::new(&queue.prefix, &queue.name).partitions
        )));
    };
    if n != queue.partitions {
        return Err(Error::config(format!(
            "queue {:?} has {n} partition(s), but this process is configured with {}: every \
             process of a queue must use the queue's number (--partitions / \
             PELICAN_PARTITIONS, QueueConfig::with_partitions); to change it, drain the \
             queue first (docs/PROTOCOL.md, \"Partitions\")",
            queue.name, queue.partitions
        )));
    }
    if n > 1 && configured != PartitionLayout::Auto && configured != layout {
        return Err(Error::config(format!(
            "queue {:?} has its {n} partitions in the {layout} layout, but this process is \
             configured with the {configured} layout: every process of a queue must use the \
             queue's layout; configure {layout} or auto (the queue's own) \
             (--partition-layout / PELICAN_PARTITION_LAYOUT, \
             QueueConfig::with_partition_layout); to change the layout, drain the queue \
             first (docs/PROTOCOL.md, \"Partitions\")",
            queue.name
        )));
    }
    Ok(queue.clone().with_partition_layout(layout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_testkit::{RedisCluster, RedisServer};

    /// On one node every partition of a producer or consumer shares one set of limits on
    /// calls in flight (so `P` partitions make as few calls as one).
    #[tokio::test]
    async fn partitions_on_one_node_share_one_gate() {
        let server = RedisServer::start();
        let q = QueueConfig::new(server.url(), "gates").with_partitions(4);
        let parts = Shared::connect(&q).await.unwrap();
        assert_eq!(parts.len(), 4);
        for p in &parts[1..] {
            assert!(Arc::ptr_eq(&parts[0].node, &p.node));
        }
        // One outcome write at a time for the node; one submit call for 4 partitions
        // (4 for a node with one).
        assert_eq!(parts[0].node.writes.available_permits(), 1);
        assert_eq!(parts[0].node.submits.available_permits(), 1);
        let one = QueueConfig::new(server.url(), "gates-1");
        let one = Shared::connect(&one).await.unwrap();
        assert_eq!(one[0].node.submits.available_permits(), SUBMITS_IN_FLIGHT);
        // Each connect has its own: two consumers do not wait for each other.
        let other = Shared::connect(&q).await.unwrap();
        assert!(!Arc::ptr_eq(&parts[0].node, &other[0].node));
    }

    /// On a cluster the partitions share limits with the partitions on the same master
    /// and only with those.
    #[tokio::test]
    async fn partitions_on_a_cluster_share_a_gate_per_master() {
        let cluster = RedisCluster::start(3);
        let seeds: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let url = format!("redis+cluster://{}", seeds.join(","));
        let q = QueueConfig::new(url, "gates").with_partitions(6);
        let parts = Shared::connect(&q).await.unwrap();
        let master: Vec<usize> = parts
            .iter()
            .map(|p| cluster.master_of(&p.keys.stream))
            .collect();
        for i in 0..parts.len() {
            for j in 0..parts.len() {
                assert_eq!(
                    Arc::ptr_eq(&parts[i].node, &parts[j].node),
                    master[i] == master[j],
                    "partitions {i} and {j} (masters {} and {})",
                    master[i],
                    master[j]
                );
            }
        }
    }
}
