//! For operators' tools: looking inside a queue and acting on it. Its contents may change
//! between minor versions.
//!
//! - [`Admin`] (also at the crate root): stats ([`Admin::stats`]), one request's state
//!   ([`Admin::inspect`]), dead letters ([`Admin::dead_letters`], [`Admin::requeue`]),
//!   janitor, destroy; a connection to a whole deployment, one node or a cluster
//!   ([`Deployment`]).
//! - What pelican writes to Redis, for tools that read it directly (a dashboard, tests,
//!   `redis-cli` scripts): a queue's key names ([`Keys`], from
//!   [`QueueConfig::keys`](crate::QueueConfig::keys)) and a request entry's `head` field
//!   ([`HEAD_FIELD`], [`EntryHead`]), as `docs/PROTOCOL.md` describes them. They follow
//!   the wire protocol, not the API.
//! - [`redacted_url`]: a Redis URL fit for a log line (the password replaced).

mod dead;
mod deployment;
mod inspect;
mod stats;

pub use crate::conn::url::redacted_url;
pub use crate::protocol::head::{EntryHead, HEAD_FIELD};
pub use crate::protocol::keys::Keys;
pub use crate::shared::JanitorReport;
pub use dead::DeadLetter;
pub use deployment::Deployment;
pub use inspect::{RequestInfo, RequestState};
pub use stats::{ConsumerStats, InFlight, Stats};

use crate::config::QueueConfig;
use crate::error::{Error, Result};
use crate::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// Default lifetime of a requeued request: 5 minutes.
pub const DEFAULT_REQUEUE_TIMEOUT: Duration = Duration::from_secs(300);

/// An operator's handle on one queue (all its partitions). Creating it writes nothing
/// to Redis.
pub struct Admin {
    /// One per partition.
    parts: Vec<Arc<Shared>>,
}

impl Admin {
    /// Connects to the queue's Redis (validating URL and name).
    pub async fn connect(queue: QueueConfig) -> Result<Admin> {
        Ok(Admin {
            parts: Shared::connect_only(&queue).await?,
        })
    }

    /// Gathers the queue's statistics. Scans the queue's request keys: fine for an
    /// operator, not for a hot path.
    /// With several partitions, the totals, and each partition's figures in
    /// [`Stats::partitions`].
    pub async fn stats(&self) -> Result<Stats> {
        let mut parts = Vec::with_capacity(self.parts.len());
        for sh in &self.parts {
            parts.push(stats::gather(sh).await?);
        }
        Ok(stats::total(parts))
    }

    /// What Redis knows of request `rid`: whether it waits, who holds it and for how
    /// long, how often it was delivered, who waits for it; or its cached outcome.
    /// `None` when Redis knows nothing of it: never submitted, finished longer than
    /// `result_ttl` ago, expired, or submitted with dedup off (no index to look it up).
    pub async fn inspect(&self, rid: &str) -> Result<Option<RequestInfo>> {
        let p = self.parts[0].queue.partition_of(rid) as usize;
        inspect::inspect(&self.parts[p], rid).await
    }

    /// The oldest `count` dead letters. With several partitions, a letter's id is
    /// `<partition>/<stream id>` (what [`Admin::requeue`] takes).
    pub async fn dead_letters(&self, count: usize) -> Result<Vec<DeadLetter>> {
        let mut all = Vec::new();
        for sh in &self.parts {
            let mut letters = dead::dead_letters(sh, count).await?;
            if self.parts.len() > 1 {
                for d in &mut letters {
                    d.id = format!("{}/{}", sh.partition, d.id);
                }
            }
            all.extend(letters);
        }
        all.sort_by_key(|d| d.dead_at_ms);
        all.truncate(count);
        Ok(all)
    }

    /// Puts dead letters back on the queue as fresh requests (new deadline
    /// `now + timeout`, delivery count from zero). Returns, per id, the new stream entry
    /// id, or `None` when there was no such dead letter (or it had no body).
    pub async fn requeue(
        &self,
        ids: &[String],
        timeout: Duration,
    ) -> Result<Vec<(String, Option<String>)>> {
        // Per partition: (position in `ids`, stream id).
        let mut by_part: Vec<Vec<(usize, String)>> = vec![Vec::new(); self.parts.len()];
        for (i, id) in ids.iter().enumerate() {
            let (p, sid) = self.split_dead_id(id)?;
            by_part[p].push((i, sid.to_string()));
        }
        let mut out: Vec<(String, Option<String>)> =
            ids.iter().map(|id| (id.clone(), None)).collect();
        for (p, wanted) in by_part.into_iter().enumerate() {
            if wanted.is_empty() {
                continue;
            }
            let sids: Vec<String> = wanted.iter().map(|(_, s)| s.clone()).collect();
            let done = dead::requeue(&self.parts[p], &sids, timeout).await?;
            for ((i, _), (_, new)) in wanted.into_iter().zip(done) {
                out[i].1 = new;
            }
        }
        Ok(out)
    }

    /// A dead-letter id as [`Admin::dead_letters`] gives it: the partition and the id
    /// in that partition's dead-letter stream.
    fn split_dead_id<'a>(&self, id: &'a str) -> Result<(usize, &'a str)> {
        let n = self.parts.len();
        let (p, sid) = match id.split_once('/') {
            Some((p, sid)) => (p.parse::<usize>().ok().filter(|&p| p < n), sid),
            None if n == 1 => (Some(0), id),
            None => (None, id),
        };
        match p {
            Some(p) if dead::is_stream_id(sid) => Ok((p, sid)),
            _ if n > 1 => Err(Error::config(format!(
                "{id:?} is not a dead-letter id of this queue; with {n} partitions ids look like 3/1700000000000-0 (see `pelican dead list`)"
            ))),
            _ => Err(Error::config(format!(
                "{id:?} is not a dead-letter id; ids look like 1700000000000-0 (see `pelican dead list`)"
            ))),
        }
    }

    /// Requeues every dead letter; returns how many were requeued.
    pub async fn requeue_all(&self, timeout: Duration) -> Result<usize> {
        let mut n = 0;
        for sh in &self.parts {
            n += dead::requeue_all(sh, timeout).await?;
        }
        Ok(n)
    }

    /// Deletes the dead-letter stream; returns how many letters it held.
    pub async fn purge_dead(&self) -> Result<u64> {
        let mut n = 0;
        for sh in &self.parts {
            n += dead::purge_dead(sh).await?;
        }
        Ok(n)
    }

    /// Runs the janitor now on every partition (unless another process ran it within the
    /// interval); the report adds up the partitions'.
    pub async fn janitor(&self) -> Result<JanitorReport> {
        let mut total = JanitorReport::default();
        for sh in &self.parts {
            let r = sh.janitor("admin").await?;
            total.ran |= r.ran;
            total.trimmed += r.trimmed;
            total.expired += r.expired;
            total.consumers_removed += r.consumers_removed;
        }
        Ok(total)
    }

    /// Deletes every key of the queue; returns how many. For tests and benchmarks:
    /// producers and consumers still attached lose their state.
    pub async fn destroy(&self) -> Result<u64> {
        let mut n = 0;
        for sh in &self.parts {
            let keys = sh.scan(&sh.keys.pattern()).await?;
            // Keys of one partition share a slot: one DEL per chunk works on a cluster.
            for chunk in keys.chunks(500) {
                let d: u64 = redis::cmd("DEL")
                    .arg(chunk)
                    .query_async(&mut sh.conn())
                    .await
                    .map_err(|e| Error::redis("deleting the queue's keys", e))?;
                n += d;
            }
        }
        let sh = &self.parts[0];
        let d: u64 = redis::cmd("DEL")
            .arg(&sh.keys.partitions)
            .query_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("deleting the queue's keys", e))?;
        Ok(n + d)
    }
}
