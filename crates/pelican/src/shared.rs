//! What producers and consumers of one queue share: the validated configuration, the
//! keys, the scripts and the multiplexed connection; plus the janitor and clocks.

use crate::config::QueueConfig;
use crate::entry;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::scripts::Scripts;
use crate::wire::LeanConn;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::AsyncConnectionConfig;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the clock passed to every script.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

pub(crate) struct Shared {
    pub(crate) queue: QueueConfig,
    pub(crate) keys: Keys,
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    pub(crate) scripts: Scripts,
    pub(crate) metrics: Metrics,
}

impl Shared {
    pub(crate) async fn connect(queue: &QueueConfig) -> Result<Arc<Shared>> {
        let shared = Shared::connect_only(queue).await?;
        shared.ensure_group().await?;
        Ok(shared)
    }

    /// Connects without creating anything in Redis (for read-only tools).
    pub(crate) async fn connect_only(queue: &QueueConfig) -> Result<Arc<Shared>> {
        queue.validate()?;
        let client = queue.client()?;
        let cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(queue.command_timeout))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_with_config(client.clone(), cfg)
            .await
            .map_err(|e| {
                Error::redis(
                    &format!(
                        "cannot connect to Redis at {} (is redis-server running and reachable?)",
                        crate::config::redacted_url(&queue.url)
                    ),
                    e,
                )
            })?;
        let shared = Arc::new(Shared {
            keys: Keys::new(&queue.prefix, &queue.name),
            queue: queue.clone(),
            client,
            conn,
            scripts: Scripts::new(),
            metrics: Metrics::new(&queue.name),
        });
        Ok(shared)
    }

    pub(crate) fn conn(&self) -> ConnectionManager {
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

    /// A connection of its own for a task that sends one command at a time (a blocking
    /// reader, the consumer's outcome writer), waiting at most `timeout` for a reply.
    pub(crate) async fn own_connection(&self, timeout: Duration) -> Result<OwnConn> {
        let connect_timeout = Duration::from_secs(5);
        let info = self.client.get_connection_info();
        if let Some(lean) = LeanConn::open(info, connect_timeout, timeout).await {
            return lean
                .map(OwnConn::Lean)
                .map_err(|e| Error::redis("opening a connection", e));
        }
        let cfg = AsyncConnectionConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(connect_timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map(OwnConn::Client)
            .map_err(|e| Error::redis("opening a connection", e))
    }

    /// Runs the janitor unless another process ran it within the interval.
    pub(crate) async fn janitor(&self, runner: &str) -> Result<JanitorReport> {
        let q = &self.queue;
        let v: redis::Value = self
            .scripts
            .janitor
            .key(&self.keys.stream)
            .key(&self.keys.req_prefix)
            .key(&self.keys.reply_prefix)
            .key(&self.keys.janitor_lock)
            .arg(&self.keys.group)
            .arg(now_ms())
            .arg(ms(q.janitor_interval).max(1))
            .arg(runner)
            .arg(ms(q.consumer_gc_after))
            .arg(ms(q.result_ttl))
            .arg(q.reply_maxlen)
            .arg(100)
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| Error::redis("running the janitor", e))?;
        let a = entry::array(&v);
        let n = |i: usize| a.get(i).and_then(entry::int).unwrap_or(0) as u64;
        let report = JanitorReport {
            ran: n(0) == 1,
            trimmed: n(1),
            expired: n(2),
            consumers_removed: n(3),
        };
        if report.ran && (report.trimmed + report.expired + report.consumers_removed) > 0 {
            tracing::debug!(queue = %q.name, ?report, "janitor");
        }
        Ok(report)
    }
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

/// What one janitor run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JanitorReport {
    /// False when another process holds the janitor lock for this interval.
    pub ran: bool,
    /// Stream entries trimmed below the oldest pending one.
    pub trimmed: u64,
    /// Undelivered entries past their deadline, deleted and answered "expired".
    pub expired: u64,
    /// Consumers that owned nothing and were idle past `consumer_gc_after`, removed.
    pub consumers_removed: u64,
}

/// Runs `op`, an idempotent command, once more if it failed on a dropped connection.
/// A `ConnectionManager` (RESP2) learns that its connection died only from the first
/// command that fails on it, and reconnects in the background; a command that is
/// safe to repeat need not fail its caller for that.
pub(crate) async fn retry_if_dropped<T, Fut>(mut op: impl FnMut() -> Fut) -> redis::RedisResult<T>
where
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    match op().await {
        Err(e) if e.is_connection_dropped() => op().await,
        r => r,
    }
}

/// Exponential backoff for reconnect loops: 50 ms doubling up to 2 s.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(50))
    }
    pub(crate) fn reset(&mut self) {
        self.0 = Duration::from_millis(50);
    }
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        d
    }
}
