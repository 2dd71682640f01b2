//! How a producer behaves.

use super::{
    positive, DEFAULT_BLOCK, DEFAULT_REPLY_TTL, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SWEEP_INTERVAL,
};
use crate::error::Result;
use std::time::Duration;

/// How a [`crate::Producer`] behaves: [`ProducerConfig::default`] and the `with_*`
/// methods (new settings can be added without breaking callers).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// How long a request may take, from submission to outcome, before the caller gets
    /// [`crate::ErrorKind::Timeout`]; it is also the request's deadline in the queue, after
    /// which no consumer starts it. Default 5 minutes: the work this library is for takes
    /// seconds to minutes.
    pub request_timeout: Duration,
    /// Identical requests in flight are solved once (the request id is a hash of the body).
    /// Default on. Off: every submission is its own request and costs fewer Redis commands.
    pub dedup: bool,
    /// How long the producer's reply stream lives without a refresh; it is refreshed every
    /// third of it. A producer that died leaves nothing behind after this. Default 60 s.
    pub reply_ttl: Duration,
    /// How long a blocking read of the reply stream waits. Default 2 s.
    pub block: Duration,
    /// How often outcomes of requests waiting longer than this are looked up directly, in
    /// case a reply was missed (Redis restart, reply stream lost). Default 10 s.
    pub sweep_interval: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            dedup: true,
            reply_ttl: DEFAULT_REPLY_TTL,
            block: DEFAULT_BLOCK,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }
}

impl ProducerConfig {
    /// Sets the request timeout.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }
    /// Switches dedup on or off.
    #[must_use]
    pub fn with_dedup(mut self, dedup: bool) -> Self {
        self.dedup = dedup;
        self
    }
    /// Sets the reply stream's lifetime without refresh.
    #[must_use]
    pub fn with_reply_ttl(mut self, ttl: Duration) -> Self {
        self.reply_ttl = ttl;
        self
    }
    /// Sets the blocking read time.
    #[must_use]
    pub fn with_block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }
    /// Sets the sweep interval.
    #[must_use]
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        positive("request_timeout", self.request_timeout)?;
        positive("reply_ttl", self.reply_ttl)?;
        positive("block", self.block)?;
        positive("sweep_interval", self.sweep_interval)?;
        Ok(())
    }
}
