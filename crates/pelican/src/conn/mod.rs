//! Connections to Redis, all made here.
//!
//! - The shared connection of a producer, consumer or admin: the client library's
//!   `ConnectionManager` (multiplexed, auto-pipelined, reconnecting), for scripts and
//!   ordinary commands ([`manager`]).
//! - A connection of one task's own, for tasks that send one command at a time: the
//!   blocking reads and the consumer's outcome writes ([`own_connection`], [`OwnConn`]);
//!   pelican's lean connection ([`wire`]) for plain TCP.
//! - Backoff and retry ([`retry`]).

pub(crate) mod retry;
pub(crate) mod wire;

use crate::config::{redacted_url, QueueConfig};
use crate::error::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::AsyncConnectionConfig;
use std::time::Duration;
use wire::LeanConn;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared connection of a queue's producer, consumer or admin.
pub(crate) async fn manager(
    queue: &QueueConfig,
    client: &redis::Client,
) -> Result<ConnectionManager> {
    let cfg = ConnectionManagerConfig::new()
        .set_response_timeout(Some(queue.command_timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client.clone(), cfg)
        .await
        .map_err(|e| {
            Error::redis(
                &format!(
                    "cannot connect to Redis at {} (is redis-server running and reachable?)",
                    redacted_url(&queue.url)
                ),
                e,
            )
        })
}

/// A connection of its own for a task that sends one command at a time (a blocking
/// reader, the consumer's outcome writer), waiting at most `timeout` for a reply.
pub(crate) async fn own_connection(client: &redis::Client, timeout: Duration) -> Result<OwnConn> {
    let info = client.get_connection_info();
    if let Some(lean) = LeanConn::open(info, CONNECT_TIMEOUT, timeout).await {
        return lean
            .map(OwnConn::Lean)
            .map_err(|e| Error::redis("opening a connection", e));
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
/// for plain TCP, the client library's for TLS and Unix sockets.
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

    /// Runs `cmd`, made by [`evalsha`] for `script`, loading the script through `loader`
    /// first when Redis does not know it (a restart, a SCRIPT FLUSH).
    pub(crate) async fn eval(
        &mut self,
        loader: &mut ConnectionManager,
        script: &redis::Script,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<redis::Value> {
        match self.query(cmd).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                script.prepare_invoke().load_async(loader).await?;
                self.query(cmd).await
            }
            r => r,
        }
    }
}

/// `EVALSHA <hash of script> <number of keys> <keys...>`: add the arguments, then run it
/// with [`OwnConn::eval`].
pub(crate) fn evalsha(script: &redis::Script, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}
