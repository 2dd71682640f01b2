//! Connections to Redis, all made here.
//!
//! - The shared connection of a producer, consumer or admin: the client library's
//!   `ConnectionManager` (multiplexed, auto-pipelined, reconnecting), for scripts and
//!   ordinary commands ([`manager`]).
//! - A connection of one task's own, for tasks that send one command at a time: the
//!   blocking reads and the consumers' outcome writes ([`own_connection`], [`OwnConn`],
//!   [`on_own`]); pelican's lean connection ([`wire`]) for plain TCP, and the commands it
//!   writes large values with in place ([`framed`]).
//! - Backoff and retry ([`retry`]); ending another connection's blocking read early
//!   ([`unblock`]).

/// The most connections one read of large values is split over (the consumer's read of
/// entries and stored bodies, the producer's of stored answers).
pub(crate) const SPLIT_CONNECTIONS: usize = 4;
/// Bytes a part of such a read is worth at least: about what Redis writes to one client
/// per turn of its event loop (its `NET_MAX_WRITES_PER_EVENT`), so a large reply to one
/// connection is spread over turns (consumer/fetch.rs says more).
const SPLIT_PART_BYTES: usize = 64 << 10;

/// How many parts, each on a connection of its own, a read of `items` values worth
/// `bytes` in all is split into: one per [`SPLIT_PART_BYTES`], at most one per item and
/// [`SPLIT_CONNECTIONS`], one at least.
pub(crate) fn split_parts(items: usize, bytes: usize) -> usize {
    (bytes / SPLIT_PART_BYTES).clamp(1, SPLIT_CONNECTIONS.min(items.max(1)))
}

pub(crate) mod cluster;
pub(crate) mod command;
pub(crate) mod framed;
pub(crate) mod reply;
pub(crate) mod retry;
pub(crate) mod unblock;
pub(crate) mod url;
pub(crate) mod wire;

use crate::error::{Error, Result};
use cluster::ClusterUrl;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisFuture, Value};
use std::time::Duration;
use url::redacted_url;
use wire::LeanConn;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a queue's Redis is: one node (`redis://`, `rediss://`, `unix://`) or a cluster
/// (`redis+cluster://`, `rediss+cluster://`).
/// Made once per producer, consumer or admin: the size of its variants does not matter.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Endpoint {
    Node { client: redis::Client, lean: bool },
    Cluster(ClusterEndpoint),
}

#[derive(Clone)]
pub(crate) struct ClusterEndpoint {
    client: ClusterClient,
    url: ClusterUrl,
    tls_root_ca_pem: Option<Vec<u8>>,
    lean: bool,
}

impl Endpoint {
    /// The endpoint of `url` (trusting `tls_root_ca_pem` for TLS; commands on the
    /// cluster's shared connection wait `command_timeout`; `lean`: a task's own
    /// connection over plain TCP is pelican's lean one, else the client library's); a
    /// [`crate::ErrorKind::Config`] error for a bad URL.
    pub(crate) fn of(
        url_text: &str,
        tls_root_ca_pem: Option<&[u8]>,
        command_timeout: Duration,
        lean: bool,
    ) -> Result<Endpoint> {
        match ClusterUrl::parse(url_text) {
            None => Ok(Endpoint::Node {
                client: url::node_client(url_text, tls_root_ca_pem)?,
                lean,
            }),
            Some(url) => {
                let url = url?;
                let seeds: Vec<String> = url.seeds.iter().map(|s| url.node_url(s)).collect();
                let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(command_timeout)
                    .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                if url.tls {
                    builder = cluster_tls(builder, url_text, tls_root_ca_pem)?;
                }
                let client = builder.build().map_err(|e| {
                    Error::config(format!("invalid cluster URL {:?}", redacted_url(url_text)))
                        .with_source(e)
                })?;
                Ok(Endpoint::Cluster(ClusterEndpoint {
                    client,
                    url,
                    tls_root_ca_pem: tls_root_ca_pem.map(<[u8]>::to_vec),
                    lean,
                }))
            }
        }
    }

    /// One node (not a cluster): every key of every partition is on it, and one command
    /// may name keys of several partitions.
    pub(crate) fn is_single_node(&self) -> bool {
        matches!(self, Endpoint::Node { .. })
    }

    /// The shared connection of a queue's producer, consumer or admin (`url`: the
    /// endpoint's, for messages).
    pub(crate) async fn connect(&self, url: &str, command_timeout: Duration) -> Result<Conn> {
        let unreachable = |e| {
            Error::redis(
                &format!(
                    "cannot connect to Redis at {} (is redis-server running and reachable?)",
                    redacted_url(url)
                ),
                e,
            )
        };
        match self {
            Endpoint::Node { client, .. } => {
                let cfg = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(command_timeout))
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                ConnectionManager::new_with_config(client.clone(), cfg)
                    .await
                    .map(Conn::Node)
                    .map_err(unreachable)
            }
            Endpoint::Cluster(c) => c
                .client
                .get_async_connection()
                .await
                .map(|c| Conn::Cluster(Box::new(c)))
                .map_err(|e| Error::redis(&c.url.unreachable(), e)),
        }
    }

    /// A connection of its own for a task that sends one command at a time (a blocking
    /// reader, the consumer's outcome writer) on `key`, waiting at most `timeout` for a
    /// reply. On a cluster it goes to the master that owns `key`'s slot now (asked of
    /// the cluster through `shared`): a task reconnects after a failover or a MOVED and
    /// so follows the slot.
    pub(crate) async fn own_connection(
        &self,
        shared: &mut Conn,
        key: &str,
        timeout: Duration,
    ) -> Result<OwnConn> {
        Ok(self.own_connection_at(shared, key, timeout).await?.0)
    }

    /// [`Endpoint::own_connection`], and on a cluster the node it goes to (`host:port`, as
    /// `CLUSTER SLOTS` names it): what is sent about that connection on the shared one
    /// (`CLIENT UNBLOCK`) goes to the same node ([`Conn::query_on`]).
    pub(crate) async fn own_connection_at(
        &self,
        shared: &mut Conn,
        key: &str,
        timeout: Duration,
    ) -> Result<(OwnConn, Option<String>)> {
        match self {
            Endpoint::Node { client, lean } => {
                Ok((own_connection(client, timeout, *lean).await?, None))
            }
            Endpoint::Cluster(c) => {
                let (url, tls_root_ca_pem) = (&c.url, &c.tls_root_ca_pem);
                let slots: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(shared)
                    .await
                    .map_err(|e| Error::redis("asking the cluster which node owns a slot", e))?;
                let slot = cluster::slot(key.as_bytes());
                let node = cluster::master_of(&slots, slot).ok_or_else(|| {
                    Error::new(
                        crate::ErrorKind::Redis,
                        format!("no cluster node serves slot {slot} (of {key}) right now"),
                    )
                })?;
                let client = url::node_client(&url.node_url(&node), tls_root_ca_pem.as_deref())?;
                let conn = own_connection(&client, timeout, c.lean).await?;
                Ok((conn, Some(node)))
            }
        }
    }
}

#[cfg(feature = "tls")]
fn cluster_tls(
    builder: redis::cluster::ClusterClientBuilder,
    _url: &str,
    ca: Option<&[u8]>,
) -> Result<redis::cluster::ClusterClientBuilder> {
    Ok(builder.certs(redis::TlsCertificates {
        client_tls: None,
        root_cert: ca.map(<[u8]>::to_vec),
    }))
}

#[cfg(not(feature = "tls"))]
fn cluster_tls(
    _: redis::cluster::ClusterClientBuilder,
    url: &str,
    _: Option<&[u8]>,
) -> Result<redis::cluster::ClusterClientBuilder> {
    Err(Error::config(format!(
        "{:?} asks for TLS, but pelican was built without it: enable the `tls` feature",
        redacted_url(url)
    )))
}

/// The shared connection: multiplexed and auto-pipelined, reconnecting; on a cluster,
/// routed by key and following MOVED/ASK and failovers.
#[derive(Clone)]
pub(crate) enum Conn {
    Node(ConnectionManager),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    /// Runs a command that names no key (SCAN) on the node that holds `key`: on a
    /// cluster, the master of its slot; on one node, that node.
    pub(crate) async fn query_near(
        &mut self,
        cmd: redis::Cmd,
        key: &str,
    ) -> redis::RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Node(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::new(cluster::slot(key.as_bytes()), SlotAddr::Master);
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }
}

impl Conn {
    /// Runs a command that names no key on `node` (`host:port`, as the cluster names it:
    /// [`Endpoint::own_connection_at`]), or without one on the master of `key`'s slot; on
    /// one node, on that node.
    pub(crate) async fn query_on(
        &mut self,
        cmd: redis::Cmd,
        key: &str,
        node: Option<&str>,
    ) -> redis::RedisResult<Value> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let (Conn::Cluster(c), Some(node)) = (&mut *self, node) else {
            return self.query_near(cmd, key).await;
        };
        let (host, port) = node
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
            .ok_or_else(|| {
                redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "not a cluster node's address",
                    node.to_string(),
                ))
            })?;
        c.route_command(
            cmd,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
        )
        .await
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A connection of its own for a task that sends one command at a time (a blocking
/// reader, the consumer's outcome writer), waiting at most `timeout` for a reply: a lean
/// one over plain TCP when `lean` (`QueueConfig::lean_connections`), the client
/// library's otherwise.
pub(crate) async fn own_connection(
    client: &redis::Client,
    timeout: Duration,
    lean: bool,
) -> Result<OwnConn> {
    if lean {
        let info = client.get_connection_info();
        if let Some(lean) = LeanConn::open(info, CONNECT_TIMEOUT, timeout).await {
            return lean
                .map(OwnConn::Lean)
                .map_err(|e| Error::redis("opening a connection", e));
        }
    }
    let cfg = AsyncConnectionConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map(OwnConn::Client)
        .map_err(|e| Error::redis("opening a connection", e))
}

/// A connection of one task's own (blocking reads, outcome writes): pelican's lean one
/// for plain TCP, the client library's for TLS and Unix sockets (and for plain TCP too
/// when `QueueConfig::lean_connections` is off).
pub(crate) enum OwnConn {
    Lean(LeanConn),
    Client(MultiplexedConnection),
}

impl OwnConn {
    /// Runs one command. After an error other than a server error reply the connection
    /// must be dropped.
    pub(crate) async fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            OwnConn::Lean(c) => c.query(cmd).await,
            OwnConn::Client(c) => cmd.query_async(c).await,
        }
    }

    /// Runs a stream read (`XREADGROUP`, `XREAD`): each stream's name with its entries
    /// (on a lean connection, field names among `F`'s static). Errors as for
    /// [`OwnConn::query`].
    pub(crate) async fn query_streams<F: wire::FieldNames>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<wire::Streams> {
        match self {
            OwnConn::Lean(c) => c.query_streams::<F>(cmd).await,
            OwnConn::Client(c) => Ok(reply::read_into_streams(cmd.query_async(c).await?)
                .into_iter()
                .map(|(name, entries)| (name.into(), entries))
                .collect()),
        }
    }
}

/// Runs `run` on `conn`, a task's own connection kept from one call to the next (the
/// writers'), opening it with `open` when there is none. An error opening it comes back as
/// the client library's error it was: an ACL denial stays one (not retryable), a refused
/// connection stays an I/O error. A connection that failed (other than with an error
/// reply), or whose slot is served elsewhere now, is dropped, and the next call opens a
/// new one.
pub(crate) async fn on_own<R>(
    conn: &mut Option<OwnConn>,
    open: impl AsyncFnOnce() -> Result<OwnConn>,
    run: impl AsyncFnOnce(&mut OwnConn) -> redis::RedisResult<R>,
) -> redis::RedisResult<R> {
    if conn.is_none() {
        match open().await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                return Err(e
                    .redis_source()
                    .cloned()
                    .unwrap_or_else(|| std::io::Error::other(format!("{e:#}")).into()));
            }
        }
    }
    let r = run(conn.as_mut().expect("just opened")).await;
    if let Err(e) = &r {
        if cluster::worth_sending_again(e) {
            *conn = None;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_testkit::RedisServer;

    /// A task's own connection over plain TCP is the lean one unless the endpoint was
    /// made with `lean` off (`QueueConfig::lean_connections`): then the client library's,
    /// as for TLS and Unix sockets. On one node and on a cluster.
    #[tokio::test]
    async fn own_connections_follow_the_lean_switch() {
        let server = RedisServer::start();
        let t = Duration::from_secs(5);
        for lean in [true, false] {
            let endpoint = Endpoint::of(&server.url(), None, t, lean).unwrap();
            let mut shared = endpoint.connect(&server.url(), t).await.unwrap();
            let (own, node) = endpoint
                .own_connection_at(&mut shared, "k", t)
                .await
                .unwrap();
            assert_eq!(node, None);
            assert_eq!(matches!(own, OwnConn::Lean(_)), lean, "lean {lean}");
            let mut own = own;
            let pong = own.query(&redis::cmd("PING")).await.unwrap();
            assert_eq!(pong, Value::SimpleString("PONG".into()), "lean {lean}");
        }
        let cluster = pelican_testkit::RedisCluster::start(3);
        for lean in [true, false] {
            let url = cluster.cluster_url();
            let endpoint = Endpoint::of(&url, None, t, lean).unwrap();
            let mut shared = endpoint.connect(&url, t).await.unwrap();
            let (own, node) = endpoint
                .own_connection_at(&mut shared, "{q}:stream", t)
                .await
                .unwrap();
            assert!(node.is_some(), "a cluster names the node");
            assert_eq!(
                matches!(own, OwnConn::Lean(_)),
                lean,
                "cluster, lean {lean}"
            );
        }
    }
}
