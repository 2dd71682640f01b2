//! Looking inside a queue, and the operator's tools: stats ([`Admin::stats`]), one
//! request's state ([`Admin::inspect`]), dead letters ([`Admin::dead_letters`]), janitor, destroy.

mod dead;
mod inspect;
mod stats;

pub use dead::DeadLetter;
pub use inspect::{RequestInfo, RequestState};
pub use stats::{ConsumerStats, InFlight, Stats};

use crate::config::QueueConfig;
use crate::error::{Error, Result};
use crate::shared::{JanitorReport, Shared};
use std::sync::Arc;
use std::time::Duration;

/// Default lifetime of a requeued request: 5 minutes.
pub const DEFAULT_REQUEUE_TIMEOUT: Duration = Duration::from_secs(300);

/// An operator's handle on one queue. Creating it writes nothing to Redis.
pub struct Admin {
    shared: Arc<Shared>,
}

impl Admin {
    /// Connects to the queue's Redis (validating URL and name).
    pub async fn connect(queue: QueueConfig) -> Result<Admin> {
        Ok(Admin {
            shared: Shared::connect_only(&queue).await?,
        })
    }

    /// Gathers the queue's statistics. Scans the queue's request keys: fine for an
    /// operator, not for a hot path.
    pub async fn stats(&self) -> Result<Stats> {
        stats::gather(&self.shared).await
    }

    /// What Redis knows of request `rid`: whether it waits, who holds it and for how
    /// long, how often it was delivered, who waits for it; or its cached outcome.
    /// `None` when Redis knows nothing of it: never submitted, finished longer than
    /// `result_ttl` ago, expired, or submitted with dedup off (no index to look it up).
    pub async fn inspect(&self, rid: &str) -> Result<Option<RequestInfo>> {
        inspect::inspect(&self.shared, rid).await
    }

    /// The oldest `count` dead letters.
    pub async fn dead_letters(&self, count: usize) -> Result<Vec<DeadLetter>> {
        dead::dead_letters(&self.shared, count).await
    }

    /// Puts dead letters back on the queue as fresh requests (new deadline
    /// `now + timeout`, delivery count from zero). Returns, per id, the new stream entry
    /// id, or `None` when there was no such dead letter (or it had no body).
    pub async fn requeue(
        &self,
        ids: &[String],
        timeout: Duration,
    ) -> Result<Vec<(String, Option<String>)>> {
        dead::requeue(&self.shared, ids, timeout).await
    }

    /// Requeues every dead letter; returns how many were requeued.
    pub async fn requeue_all(&self, timeout: Duration) -> Result<usize> {
        dead::requeue_all(&self.shared, timeout).await
    }

    /// Deletes the dead-letter stream; returns how many letters it held.
    pub async fn purge_dead(&self) -> Result<u64> {
        dead::purge_dead(&self.shared).await
    }

    /// Runs the janitor now (unless another process ran it within the interval).
    pub async fn janitor(&self) -> Result<JanitorReport> {
        self.shared.janitor("admin").await
    }

    /// Deletes every key of the queue; returns how many. For tests and benchmarks:
    /// producers and consumers still attached lose their state.
    pub async fn destroy(&self) -> Result<u64> {
        let sh = &self.shared;
        let keys = sh.scan(&sh.keys.pattern()).await?;
        let mut n = 0;
        for chunk in keys.chunks(500) {
            let d: u64 = redis::cmd("DEL")
                .arg(chunk)
                .query_async(&mut sh.conn())
                .await
                .map_err(|e| Error::redis("deleting the queue's keys", e))?;
            n += d;
        }
        Ok(n)
    }
}
