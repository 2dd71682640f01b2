//! Where a Nitro stream lives ([`StreamConfig`]) and how a Nitro-format consumer and
//! producer behave ([`ConsumerConfig`], [`ProducerConfig`]). Defaults are Nitro's where
//! the setting is part of the agreement between the processes of a stream (idletime,
//! answer TTL, request timeout), and pelican's where it is not (polling, heartbeats).

use crate::config::{positive, QueueConfig, DEFAULT_COMMAND_TIMEOUT};
use crate::conn::url::redacted_url;
use crate::error::{Error, Result};
use std::time::Duration;

/// Nitro's `idletime-to-autoclaim` default: an entry idle this long is taken over.
pub const DEFAULT_IDLETIME: Duration = Duration::from_secs(300);
/// Nitro's `response-entry-timeout` default: the TTL of result and error keys.
pub const DEFAULT_RESPONSE_TTL: Duration = Duration::from_secs(3600);
/// Nitro's `request-timeout` default: how long a producer waits for an answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3 * 3600);
/// How often a producer polls the answer keys of its outstanding requests (Nitro: 5 s).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How often a producer trims the stream (Nitro: 5 × its check interval, 25 s).
pub const DEFAULT_TRIM_INTERVAL: Duration = Duration::from_secs(25);
/// How often a producer checks that its requests older than this still exist.
pub const DEFAULT_VERIFY_INTERVAL: Duration = Duration::from_secs(30);
/// How many times a producer submits again a request lost with the stream.
pub const DEFAULT_MAX_RESUBMITS: u32 = 3;
/// Default number of entries a consumer holds at once (in work and read ahead).
pub const DEFAULT_PREFETCH: usize = 16;
/// Default block time of the consumer's reads.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(2);
/// Default time a graceful stop waits for the work in hand before handing it back.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause between two looks for idle entries of other consumers.
pub const MAX_RECLAIM_INTERVAL: Duration = Duration::from_secs(5);
/// Default idle time after which a consumer that owns nothing is removed from the group.
pub const DEFAULT_CONSUMER_GC_AFTER: Duration = Duration::from_secs(3600);
/// Default TTL of the dedup cache: a repeat of a body solved within this time is answered
/// from the cache. Five minutes, as pelican's own queues keep results (`result_ttl`): a
/// repeat typically comes from a second producer sending the same request seconds to
/// minutes later (two validators on one block); an hour (Nitro's answer TTL) would keep
/// one answer per distinct body twelve times as long for repeats that rarely come so late.
pub const DEFAULT_DEDUP_CACHE_TTL: Duration = Duration::from_secs(300);
/// Longest accepted stream name.
pub const MAX_STREAM_NAME_LEN: usize = 512;

/// A Nitro stream: the Redis it lives on and its name. The consumer group has the same
/// name as the stream, as in Nitro.
///
/// Nitro's keys carry no hash tag (`result-key:<stream>.<id>` hashes anywhere), so the
/// atomic answer (key, XACK, XDEL in one script) needs a single Redis server, not a
/// cluster. Nitro itself runs on one.
#[derive(Clone)]
#[non_exhaustive]
pub struct StreamConfig {
    /// Redis URL: `redis://[user:password@]host:port[/db]` (`rediss://` with the `tls`
    /// feature).
    pub url: String,
    /// The stream's name, e.g. `stream:0x<module root>` (Nitro's validation streams).
    /// 1 to 512 bytes, no braces, spaces or control characters.
    pub stream: String,
    /// How long one Redis command may take. Default 10 s, as pelican's queues.
    pub command_timeout: Duration,
    /// For `rediss://` URLs: the PEM certificate(s) of a private CA. Default none.
    pub tls_root_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamConfig")
            .field("url", &redacted_url(&self.url))
            .field("stream", &self.stream)
            .field("command_timeout", &self.command_timeout)
            .field(
                "tls_root_ca_pem",
                &self.tls_root_ca_pem.as_ref().map(Vec::len),
            )
            .finish()
    }
}

impl StreamConfig {
    /// The stream `stream` on the Redis at `url`.
    pub fn new(url: impl Into<String>, stream: impl Into<String>) -> Self {
        StreamConfig {
            url: url.into(),
            stream: stream.into(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            tls_root_ca_pem: None,
        }
    }

    /// Sets the Redis URL.
    #[must_use]
    pub fn with_url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// Sets the stream's name.
    #[must_use]
    pub fn with_stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = stream.into();
        self
    }

    /// Sets the command timeout.
    #[must_use]
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` connections.
    #[must_use]
    pub fn with_tls_root_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca_pem = Some(pem.into());
        self
    }

    /// Checks the name and the URL.
    pub fn validate(&self) -> Result<()> {
        validate_stream_name(&self.stream)?;
        self.connection().validate()
    }

    /// The connection settings in the form pelican's connection code takes (the queue
    /// name is not used for anything).
    pub(crate) fn connection(&self) -> QueueConfig {
        let mut q =
            QueueConfig::new(self.url.clone(), "nitro").with_command_timeout(self.command_timeout);
        q.tls_root_ca_pem = self.tls_root_ca_pem.clone();
        q
    }
}

fn validate_stream_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_STREAM_NAME_LEN {
        return Err(Error::config(format!(
            "a stream name must be 1 to {MAX_STREAM_NAME_LEN} bytes long, got {}",
            name.len()
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || matches!(c, '{' | '}'))
    {
        return Err(Error::config(format!(
            "the stream name {name:?} contains {c:?}; braces, spaces and control characters \
             are not allowed (pelican's own keys of the stream carry it as their hash tag)"
        )));
    }
    Ok(())
}

/// How a Nitro-format [`Consumer`](super::Consumer) behaves: `default()` and the
/// `with_*` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Nitro's `idletime-to-autoclaim`: an entry whose consumer has not touched it for
    /// this long is taken over. Must be the same for every process of the stream, Nitro's
    /// included. Default 5 minutes (Nitro's).
    pub idletime: Duration,
    /// How often the entries in hand are kept non-idle (one owner-checked script call for
    /// all of them). Default a third of `idletime`: two heartbeats may fail before an
    /// entry is taken over (Nitro beats every half).
    pub heartbeat_interval: Option<Duration>,
    /// How often idle entries of other consumers are looked for while busy (an idle
    /// consumer looks after every empty read). Default half of `idletime`, at most 5 s.
    pub reclaim_interval: Option<Duration>,
    /// Nitro's `retry`: whether this consumer takes over idle entries. Default on.
    pub reclaim: bool,
    /// Nitro's `max-retry-count`: an entry taken over when it had been delivered more
    /// than this many times gets the error "too many retries" instead. Default `None`:
    /// unlimited, as Nitro's -1.
    pub max_retry_count: Option<u32>,
    /// Nitro's `response-entry-timeout`: the TTL of result and error keys. Default 1 hour
    /// (Nitro's). Zero writes keys without expiry, as Nitro does.
    pub response_ttl: Duration,
    /// Entries held at once, in work and read ahead. Default 16; for long jobs, set it
    /// to the concurrency so that an idle consumer never waits while a busy one hoards.
    pub prefetch: usize,
    /// How long a read blocks for new entries; also the longest a stop waits for the
    /// read under way. Default 2 s.
    pub block: Duration,
    /// How long a graceful stop waits for the work in hand before handing it back.
    /// Default 30 s.
    pub shutdown_timeout: Duration,
    /// The consumer's name in the group. Default `<host>-<pid>-<random>`.
    pub name: Option<String>,
    /// Dedup: entries with identical `msg` bodies in flight together are solved by one
    /// handler run, and every entry gets the answer; a repeat that comes after the answer
    /// is answered from the cache (`dedup_cache_ttl`). Default off.
    pub dedup: bool,
    /// With dedup: a repeat of a body solved within this time is answered from a cache
    /// (results only: an error is never cached, a repeat of a failed body runs again).
    /// Default 5 minutes ([`DEFAULT_DEDUP_CACHE_TTL`]); `None`: no cache, only copies in
    /// flight together are joined. Without dedup it is not used.
    pub dedup_cache_ttl: Option<Duration>,
    /// Consumers of the group that own nothing and have been idle this long are removed
    /// (Nitro's consumer names pile up otherwise). Default 1 hour.
    pub consumer_gc_after: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            idletime: DEFAULT_IDLETIME,
            heartbeat_interval: None,
            reclaim_interval: None,
            reclaim: true,
            max_retry_count: None,
            response_ttl: DEFAULT_RESPONSE_TTL,
            prefetch: DEFAULT_PREFETCH,
            block: DEFAULT_BLOCK,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            name: None,
            dedup: false,
            dedup_cache_ttl: Some(DEFAULT_DEDUP_CACHE_TTL),
            consumer_gc_after: DEFAULT_CONSUMER_GC_AFTER,
        }
    }
}

impl ConsumerConfig {
    /// Sets the idletime (the same for every process of the stream).
    #[must_use]
    pub fn with_idletime(mut self, idletime: Duration) -> Self {
        self.idletime = idletime;
        self
    }
    /// Sets the heartbeat interval.
    #[must_use]
    pub fn with_heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }
    /// Sets how often idle entries are looked for while busy.
    #[must_use]
    pub fn with_reclaim_interval(mut self, interval: Duration) -> Self {
        self.reclaim_interval = Some(interval);
        self
    }
    /// Switches taking over idle entries on or off.
    #[must_use]
    pub fn with_reclaim(mut self, reclaim: bool) -> Self {
        self.reclaim = reclaim;
        self
    }
    /// Sets the retry limit (`None`: unlimited).
    #[must_use]
    pub fn with_max_retry_count(mut self, n: Option<u32>) -> Self {
        self.max_retry_count = n;
        self
    }
    /// Sets the TTL of answer keys.
    #[must_use]
    pub fn with_response_ttl(mut self, ttl: Duration) -> Self {
        self.response_ttl = ttl;
        self
    }
    /// Sets how many entries are held at once.
    #[must_use]
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }
    /// Sets the read block time.
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
    /// Switches dedup on or off.
    #[must_use]
    pub fn with_dedup(mut self, dedup: bool) -> Self {
        self.dedup = dedup;
        self
    }
    /// Sets the dedup cache's TTL (`None`: no cache).
    #[must_use]
    pub fn with_dedup_cache_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.dedup_cache_ttl = ttl;
        self
    }
    /// Sets the idle age after which empty consumers are removed.
    #[must_use]
    pub fn with_consumer_gc_after(mut self, age: Duration) -> Self {
        self.consumer_gc_after = age;
        self
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval.unwrap_or(self.idletime / 3)
    }

    pub(crate) fn reclaim_interval(&self) -> Duration {
        self.reclaim_interval
            .unwrap_or((self.idletime / 2).min(MAX_RECLAIM_INTERVAL))
    }

    /// How long a dedup job's state outlives its last heartbeat.
    pub(crate) fn job_ttl(&self) -> Duration {
        (self.idletime * 2).max(Duration::from_secs(60))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        positive("idletime", self.idletime)?;
        positive("block", self.block)?;
        positive("heartbeat_interval", self.heartbeat_interval())?;
        positive("reclaim_interval", self.reclaim_interval())?;
        positive("consumer_gc_after", self.consumer_gc_after)?;
        if self.heartbeat_interval() >= self.idletime {
            return Err(Error::config(format!(
                "heartbeat_interval ({:?}) must be shorter than idletime ({:?}), or live \
                 consumers lose their entries",
                self.heartbeat_interval(),
                self.idletime
            )));
        }
        if self.prefetch == 0 {
            return Err(Error::config("prefetch must be at least 1"));
        }
        if let Some(ttl) = self.dedup_cache_ttl {
            positive("dedup_cache_ttl", ttl)?;
        }
        if let Some(name) = &self.name {
            if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(Error::config(format!(
                    "the consumer name {name:?} must be non-empty, without spaces or control \
                     characters"
                )));
            }
        }
        Ok(())
    }
}

/// How a Nitro-format [`Producer`](super::Producer) behaves: `default()` and the
/// `with_*` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// Nitro's `request-timeout`: a request without an answer this long after it was
    /// added (by the Redis clock: the entry id's time against Redis' `TIME`) fails with
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) and is withdrawn from the
    /// stream. Default 3 hours (Nitro's).
    pub request_timeout: Duration,
    /// How often the answer keys of all outstanding requests are polled, in one
    /// pipelined round trip. Default 10 ms (Nitro's `check-result-interval` is 5 s).
    pub poll_interval: Duration,
    /// How often the stream is trimmed below its oldest pending entry. Default 25 s.
    pub trim_interval: Duration,
    /// How often requests outstanding longer than this are checked to still exist (a
    /// stream that was deleted and created again between two polls). Default 30 s.
    pub verify_interval: Duration,
    /// How many times a request lost with the stream is submitted again (as a new entry)
    /// before its caller gets an error. Default 3.
    pub max_resubmits: u32,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            trim_interval: DEFAULT_TRIM_INTERVAL,
            verify_interval: DEFAULT_VERIFY_INTERVAL,
            max_resubmits: DEFAULT_MAX_RESUBMITS,
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
    /// Sets the poll interval.
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }
    /// Sets the trim interval.
    #[must_use]
    pub fn with_trim_interval(mut self, interval: Duration) -> Self {
        self.trim_interval = interval;
        self
    }
    /// Sets the verify interval.
    #[must_use]
    pub fn with_verify_interval(mut self, interval: Duration) -> Self {
        self.verify_interval = interval;
        self
    }
    /// Sets how many times a lost request is submitted again.
    #[must_use]
    pub fn with_max_resubmits(mut self, n: u32) -> Self {
        self.max_resubmits = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        positive("request_timeout", self.request_timeout)?;
        positive("poll_interval", self.poll_interval)?;
        positive("trim_interval", self.trim_interval)?;
        positive("verify_interval", self.verify_interval)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_are_checked() {
        for ok in [
            "stream:0x8b104a2e80ac6165dc58b9048de12f301d70b02a0ab51396c22b4b4b802a16a4",
            "validated_bids",
            "test-stream-bold:0xab",
        ] {
            assert!(
                StreamConfig::new("redis://127.0.0.1/", ok)
                    .validate()
                    .is_ok(),
                "{ok}"
            );
        }
        for bad in ["", "a{b}", "has space", "tab\there", &"x".repeat(513)] {
            let e = StreamConfig::new("redis://127.0.0.1/", bad)
                .validate()
                .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
        }
        let e = StreamConfig::new("http://x", "s").validate().unwrap_err();
        assert!(e.message().contains("redis://"), "{e}");
    }

    #[test]
    fn defaults_are_nitros_and_consistent() {
        let c = ConsumerConfig::default();
        assert_eq!(c.idletime, Duration::from_secs(300));
        assert_eq!(c.heartbeat_interval(), Duration::from_secs(100));
        assert_eq!(c.reclaim_interval(), Duration::from_secs(5));
        assert!(c.validate().is_ok());
        let bad = ConsumerConfig::default()
            .with_idletime(Duration::from_secs(1))
            .with_heartbeat_interval(Duration::from_secs(1));
        assert!(bad.validate().is_err());
        assert_eq!(c.dedup_cache_ttl, Some(DEFAULT_DEDUP_CACHE_TTL));
        assert!(ConsumerConfig::default()
            .with_dedup_cache_ttl(Some(Duration::ZERO))
            .validate()
            .is_err());
        assert!(ProducerConfig::default().validate().is_ok());
    }
}
