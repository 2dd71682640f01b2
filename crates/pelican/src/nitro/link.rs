//! A connected Nitro stream: what its consumer, producer and stats share (the settings,
//! the keys, the scripts, the metrics and the shared connection).

use super::config::StreamConfig;
use super::keys::StreamKeys;
use super::scripts::Scripts;
use crate::conn::{Conn, Endpoint, OwnConn};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Link {
    pub(crate) config: StreamConfig,
    pub(crate) keys: StreamKeys,
    pub(crate) endpoint: Endpoint,
    conn: Conn,
    pub(crate) scripts: Scripts,
    pub(crate) metrics: Metrics,
}

impl Link {
    /// Connects; creates nothing in Redis.
    pub(crate) async fn connect(config: &StreamConfig) -> Result<Arc<Link>> {
        config.validate()?;
        let q = config.connection();
        let endpoint = Endpoint::of(
            &q.url,
            q.tls_root_ca_pem.as_deref(),
            q.command_timeout,
            q.lean_connections,
        )?;
        if matches!(endpoint, Endpoint::Cluster(_)) {
            // Nitro's answer keys carry no hash tag: the answer script spans slots.
            return Err(Error::config(
                "the Nitro wire format needs one Redis server, not a cluster: Nitro's keys \
                 carry no hash tag, so its answer cannot be written atomically on a cluster",
            ));
        }
        let conn = endpoint.connect(&q.url, q.command_timeout).await?;
        Ok(Arc::new(Link {
            keys: StreamKeys::new(&config.stream),
            config: config.clone(),
            endpoint,
            conn,
            scripts: Scripts::new(),
            metrics: Metrics::new(&config.stream),
        }))
    }

    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// `XGROUP CREATE <s> <s> <start> MKSTREAM`; an existing group is fine (BUSYGROUP).
    /// Nitro's producers start the group at `$`; after a loss, `0` delivers what was
    /// added to the new stream before its group existed.
    pub(crate) async fn create_group(&self, start: &str) -> Result<()> {
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.keys.stream)
            .arg(self.keys.group())
            .arg(start)
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(Error::redis("creating the stream's consumer group", e)),
        }
    }

    /// Registers consumer `name` in the group (`XGROUP CREATECONSUMER`): Redis 7.0
    /// creates a consumer only at its first delivery, and an operator should see an
    /// idle worker. Best effort: a missing group is created by the reader.
    pub(crate) async fn register(&self, name: &str) {
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&self.keys.stream)
            .arg(self.keys.group())
            .arg(name)
            .query_async(&mut self.conn())
            .await;
    }

    /// A connection of one task's own (a blocking reader, the outcome writer).
    pub(crate) async fn own_connection(&self, timeout: Duration) -> Result<OwnConn> {
        self.endpoint
            .own_connection(&mut self.conn(), &self.keys.stream, timeout)
            .await
    }
}
