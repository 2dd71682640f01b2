//! A connected queue: what its producers, consumers and admin share (the validated
//! configuration, the keys, the scripts, the metrics and the shared connection), and
//! the janitor they all run.

use crate::clock::{ms, now_ms};
use crate::config::QueueConfig;
use crate::conn::{self, OwnConn};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::protocol::keys::Keys;
use crate::protocol::scripts::{Janitor, Scripts};
use redis::aio::ConnectionManager;
use std::sync::Arc;
use std::time::Duration;

/// How many undelivered entries one janitor run checks for expiry.
const JANITOR_SCAN: usize = 100;

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
        let conn = conn::manager(queue, &client).await?;
        let keys = Keys::new(&queue.prefix, &queue.name);
        let shared = Arc::new(Shared {
            scripts: Scripts::new(keys.clone()),
            keys,
            queue: queue.clone(),
            client,
            conn,
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

    /// A connection of its own for a task that sends one command at a time.
    pub(crate) async fn own_connection(&self, timeout: Duration) -> Result<OwnConn> {
        conn::own_connection(&self.client, timeout).await
    }

    /// Every key matching `pattern` (SCAN: fine for operators' tools, not for a hot path).
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("SCAN", e))?;
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

/// What one janitor run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
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
