//! How a consumer behaves.

use super::{
    positive, validate_name, DEFAULT_BLOCK, DEFAULT_CLAIM_IDLE, DEFAULT_MAX_DELIVERIES,
    DEFAULT_PREFETCH, DEFAULT_SHUTDOWN_TIMEOUT,
};
use crate::error::{Error, Result};
use std::time::Duration;

/// How a [`crate::Consumer`] behaves: [`ConsumerConfig::default`] and the `with_*`
/// methods (new settings can be added without breaking callers).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// An entry whose consumer has not renewed its lease for this long is taken over by
    /// another consumer. Default 30 s: a crashed worker's work restarts within half a
    /// minute, while a live one renews every `lease_interval`.
    pub claim_idle: Duration,
    /// How often the leases of the entries in hand are renewed (one command for all).
    /// Default: a third of `claim_idle`, so two renewals may fail before a lease is lost.
    pub lease_interval: Option<Duration>,
    /// How often idle entries of other consumers are looked for. Default: half of
    /// `claim_idle`.
    pub reclaim_interval: Option<Duration>,
    /// Deliveries after which an entry is dead-lettered instead of delivered again.
    /// Default 5: a request that kills five consumers in a row is poison.
    pub max_deliveries: u32,
    /// How many deliveries the consumer holds at once (read ahead and in work). Default 16.
    /// With P partitions, P - 1 more: each partition's reader holds one while it waits
    /// on an empty stream, so a partition with work still gets `prefetch`.
    pub prefetch: usize,
    /// How long a blocking read waits for new entries. Default 2 s. It delays neither a
    /// retry nor a stop: the read is ended early when entries this consumer released (a
    /// retry, a panic, a dropped delivery) become reclaimable, and when it stops (with
    /// the Redis rights the README lists: `client|id`, `client|unblock`). Each read costs
    /// a round trip, so a longer block only saves commands while the queue is idle.
    pub block: Duration,
    /// How long [`crate::Consumer::shutdown`] waits for work in hand before releasing it.
    /// Default 30 s.
    pub shutdown_timeout: Duration,
    /// The consumer's name in the group. Default: `<host>-<pid>-<random>`.
    pub name: Option<String>,
    /// Whether this consumer takes over idle entries of others, and entries released
    /// (retries, its own included). Default on. Off, what it releases for at once is
    /// taken by the others at once (it wakes them); a `retry_after` of its, at their next
    /// reclaim scan (within their `block`).
    pub reclaim: bool,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            claim_idle: DEFAULT_CLAIM_IDLE,
            lease_interval: None,
            reclaim_interval: None,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            prefetch: DEFAULT_PREFETCH,
            block: DEFAULT_BLOCK,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            name: None,
            reclaim: true,
        }
    }
}

impl ConsumerConfig {
    /// Sets the claim idle time.
    #[must_use]
    pub fn with_claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }
    /// Sets the lease renewal interval.
    #[must_use]
    pub fn with_lease_interval(mut self, interval: Duration) -> Self {
        self.lease_interval = Some(interval);
        self
    }
    /// Sets how often idle entries are looked for.
    #[must_use]
    pub fn with_reclaim_interval(mut self, interval: Duration) -> Self {
        self.reclaim_interval = Some(interval);
        self
    }
    /// Sets the maximum number of deliveries.
    #[must_use]
    pub fn with_max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }
    /// Sets how many deliveries are held at once.
    #[must_use]
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }
    /// Sets the blocking read time.
    #[must_use]
    pub fn with_block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }
    /// Sets the shutdown timeout.
    #[must_use]
    pub fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
    /// Sets the consumer's name.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Switches reclaiming of other consumers' idle entries on or off.
    #[must_use]
    pub fn with_reclaim(mut self, reclaim: bool) -> Self {
        self.reclaim = reclaim;
        self
    }

    pub(crate) fn lease_interval(&self) -> Duration {
        self.lease_interval.unwrap_or(self.claim_idle / 3)
    }

    pub(crate) fn reclaim_interval(&self) -> Duration {
        self.reclaim_interval.unwrap_or(self.claim_idle / 2)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        positive("claim_idle", self.claim_idle)?;
        positive("block", self.block)?;
        positive("lease_interval", self.lease_interval())?;
        positive("reclaim_interval", self.reclaim_interval())?;
        if self.lease_interval() >= self.claim_idle {
            return Err(Error::config(format!(
                "lease_interval ({:?}) must be shorter than claim_idle ({:?}), or live consumers lose their leases",
                self.lease_interval(),
                self.claim_idle
            )));
        }
        if self.max_deliveries == 0 {
            return Err(Error::config("max_deliveries must be at least 1"));
        }
        if self.prefetch == 0 {
            return Err(Error::config("prefetch must be at least 1"));
        }
        if let Some(name) = &self.name {
            validate_name("consumer name", name)?;
        }
        Ok(())
    }
}
