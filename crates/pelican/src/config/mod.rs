//! Configuration: where the queue lives, and how producers and consumers behave.
//!
//! Every struct has a `Default` built from the named constants below; each field's doc
//! says its default and why.

use crate::error::{Error, Result};
use std::time::Duration;

mod consumer;
mod producer;

pub use crate::protocol::layout::PartitionLayout;
pub use consumer::ConsumerConfig;
pub use producer::ProducerConfig;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "pelican";
/// Default maximum body size (requests and responses): 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Default time a Redis command may take before it is reported as failed.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Default janitor interval.
pub const DEFAULT_JANITOR_INTERVAL: Duration = Duration::from_secs(5);

/// Default request timeout: 5 minutes.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Default lifetime of a cached outcome: 5 minutes.
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(300);
/// Default time a handler's failure is served to new submissions of its request: none
/// (a new submission runs the request again).
pub const DEFAULT_FAILURE_TTL: Duration = Duration::ZERO;
/// Default lifetime of a producer's reply stream without a refresh.
pub const DEFAULT_REPLY_TTL: Duration = Duration::from_secs(60);
/// Default interval of the producer's fallback sweep.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// Default block time of blocking reads.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(2);
/// Default cap on unread entries of a reply stream.
pub const DEFAULT_REPLY_MAXLEN: usize = 100_000;

/// Default idle time after which another consumer may take over an entry.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);
/// Default number of deliveries before an entry is dead-lettered.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
/// Default number of deliveries a consumer holds at once.
pub const DEFAULT_PREFETCH: usize = 16;
/// Default age after which an idle consumer that owns nothing is removed from the group.
pub const DEFAULT_CONSUMER_GC_AFTER: Duration = Duration::from_secs(3600);
/// Default cap on the dead-letter stream.
pub const DEFAULT_DEAD_MAXLEN: usize = 10_000;
/// Default time `shutdown` waits for in-flight work before releasing it.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Most partitions a queue may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// Longest accepted queue name.
pub const MAX_QUEUE_NAME_LEN: usize = 128;
/// A caller-chosen request id is checked by the protocol's rule.
pub(crate) use crate::protocol::request_id::validate_request_id;
pub use crate::protocol::request_id::MAX_REQUEST_ID_LEN;

/// Where a queue lives: the Redis URL, the queue's name and the key prefix.
///
/// Its `Debug` output shows the URL without its password.
///
/// Built with [`QueueConfig::new`] and the `with_*` methods (new settings can be added
/// without breaking callers); the fields can be read.
#[derive(Clone)]
#[non_exhaustive]
pub struct QueueConfig {
    /// Redis URL: `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS when
    /// built with the `tls` feature, `unix:///path`), or a Redis Cluster:
    /// `redis+cluster://[user:password@]host:port[,host:port...]` (seed nodes; the rest of
    /// the cluster is discovered; `rediss+cluster://` for TLS).
    pub url: String,
    /// The queue's name: 1 to 128 characters of `A-Z a-z 0-9 . _ - :`. No braces: the
    /// name becomes the keys' hash tag.
    pub name: String,
    /// Key prefix. Default `pelican`: every key is `pelican:{name}:...`.
    pub prefix: String,
    /// Largest request or response body accepted, in bytes. Default 4 MiB: large enough
    /// for real payloads, small enough that one entry cannot stall Redis.
    pub max_body_bytes: usize,
    /// How long one Redis command may take before it fails. Default 10 s: far above any
    /// healthy round trip, short enough that a dead server is noticed.
    pub command_timeout: Duration,
    /// How often producers and consumers try to run the janitor (one of them runs it per
    /// interval). Default 5 s.
    pub janitor_interval: Duration,
    /// How long an outcome is kept: a repeat of a finished request within it is answered
    /// from the cache, and a producer that missed a pushed reply finds it there. Default
    /// 5 minutes.
    pub result_ttl: Duration,
    /// How long a handler's failure ([`crate::HandlerError::Fail`],
    /// [`crate::Delivery::fail`]) answers a NEW submission of the same request. Default
    /// 0: never; a new submission runs the request again (a failure often comes from
    /// something outside the request, gone a moment later). Whatever it is, the failure
    /// stays recorded for `result_ttl` (`pelican inspect`, [`crate::Admin`] and a
    /// producer that missed the pushed reply still find it), every caller that waited for
    /// the request while it ran gets it, and a dead-lettered request stays answered
    /// [`crate::ErrorKind::Dead`] for `result_ttl` (poison must not run again and again).
    /// At most `result_ttl`. Applied when a request is submitted: it is the producers'
    /// setting that counts, and they should use the consumers' `result_ttl` (a
    /// failure's age is read from what is left of its ttl).
    pub failure_ttl: Duration,
    /// Consumers of the group that own nothing and have been idle this long are removed
    /// by the janitor. Default 1 hour.
    pub consumer_gc_after: Duration,
    /// Cap on the dead-letter stream. Default 10,000 entries.
    pub dead_maxlen: usize,
    /// Cap on unread entries of a reply stream (older ones are trimmed; the producer's
    /// sweep still finds their outcomes). Default 100,000.
    pub reply_maxlen: usize,
    /// For `rediss://` URLs: the PEM certificate(s) of the CA to trust instead of the
    /// system's roots (a private CA). Default none. Needs the `tls` feature.
    pub tls_root_ca_pem: Option<Vec<u8>>,
    /// How many partitions (streams) the queue is split into. Default 1: one stream, the
    /// keys queues have always had. More partitions spread one queue over the nodes of a
    /// Redis Cluster (each partition lives in its own slot); a producer routes each
    /// request by its id, so dedup holds. Every process of a queue must use the same
    /// number: the queue records it, and a process configured otherwise is refused.
    pub partitions: u32,
    /// Where the partitions of a queue of several live in a Redis Cluster's slot space
    /// (their hash tags; see [`PartitionLayout`]). Default [`PartitionLayout::Auto`]:
    /// the layout the queue has recorded, and for a new queue
    /// [`PartitionLayout::Spread`], which spreads the partitions evenly over the
    /// masters. A queue of several partitions created before the layout existed has the
    /// legacy layout and keeps it. Set `Spread` or `Legacy` to insist on one: a process
    /// whose layout differs from the queue's is refused. No effect with one partition.
    pub partition_layout: PartitionLayout,
    /// Whether the connections a task keeps for itself (blocking reads, outcome writes,
    /// the producer's writes of large bodies) are pelican's lean ones over plain TCP.
    /// Default true. False sends everything through the client library's connections,
    /// as TLS and Unix sockets always do; the command sets it from
    /// `PELICAN_LEAN_CONNECTIONS` / `--lean-connections`. Per process: processes of one
    /// queue may differ.
    pub lean_connections: bool,
}

impl std::fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueConfig")
            .field("url", &redacted_url(&self.url))
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("command_timeout", &self.command_timeout)
            .field("janitor_interval", &self.janitor_interval)
            .field("result_ttl", &self.result_ttl)
            .field("failure_ttl", &self.failure_ttl)
            .field("consumer_gc_after", &self.consumer_gc_after)
            .field("dead_maxlen", &self.dead_maxlen)
            .field("reply_maxlen", &self.reply_maxlen)
            .field("partitions", &self.partitions)
            .field("partition_layout", &self.partition_layout)
            .field("lean_connections", &self.lean_connections)
            .field(
                "tls_root_ca_pem",
                &self
                    .tls_root_ca_pem
                    .as_ref()
                    .map(|p| format!("{} bytes", p.len())),
            )
            .finish()
    }
}

use crate::conn::url::redacted_url;

impl QueueConfig {
    /// A queue named `name` on the Redis at `url`, with default settings.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        QueueConfig {
            url: url.into(),
            name: name.into(),
            prefix: DEFAULT_PREFIX.to_string(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            janitor_interval: DEFAULT_JANITOR_INTERVAL,
            result_ttl: DEFAULT_RESULT_TTL,
            failure_ttl: DEFAULT_FAILURE_TTL,
            consumer_gc_after: DEFAULT_CONSUMER_GC_AFTER,
            dead_maxlen: DEFAULT_DEAD_MAXLEN,
            reply_maxlen: DEFAULT_REPLY_MAXLEN,
            tls_root_ca_pem: None,
            partitions: 1,
            partition_layout: PartitionLayout::Auto,
            lean_connections: true,
        }
    }

    /// Sets the Redis URL (see [`QueueConfig::url`]).
    #[must_use]
    pub fn with_url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// Sets the queue's name (see [`QueueConfig::name`]).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets whether a task's own connections over plain TCP are pelican's lean ones
    /// (see [`QueueConfig::lean_connections`]).
    #[must_use]
    pub fn with_lean_connections(mut self, lean: bool) -> Self {
        self.lean_connections = lean;
        self
    }

    /// Sets the number of partitions (see [`QueueConfig::partitions`]).
    #[must_use]
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Sets the partition layout (see [`QueueConfig::partition_layout`]).
    #[must_use]
    pub fn with_partition_layout(mut self, layout: PartitionLayout) -> Self {
        self.partition_layout = layout;
        self
    }

    /// The partition request `rid` goes to: FNV-1a (64 bit) of its bytes, modulo the
    /// number of partitions. Stable: every producer routes a request id alike.
    pub fn partition_of(&self, rid: &str) -> u32 {
        if self.partitions <= 1 {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in rid.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % u64::from(self.partitions)) as u32
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the largest accepted body.
    #[must_use]
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Sets the command timeout.
    #[must_use]
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Sets the janitor interval.
    #[must_use]
    pub fn with_janitor_interval(mut self, interval: Duration) -> Self {
        self.janitor_interval = interval;
        self
    }

    /// Sets how long outcomes are cached.
    #[must_use]
    pub fn with_result_ttl(mut self, ttl: Duration) -> Self {
        self.result_ttl = ttl;
        self
    }

    /// Sets how long a handler's failure answers new submissions of its request (see
    /// [`QueueConfig::failure_ttl`]).
    #[must_use]
    pub fn with_failure_ttl(mut self, ttl: Duration) -> Self {
        self.failure_ttl = ttl;
        self
    }

    /// Sets the age after which idle consumers that own nothing are removed.
    #[must_use]
    pub fn with_consumer_gc_after(mut self, age: Duration) -> Self {
        self.consumer_gc_after = age;
        self
    }

    /// Sets the dead-letter stream cap.
    #[must_use]
    pub fn with_dead_maxlen(mut self, n: usize) -> Self {
        self.dead_maxlen = n;
        self
    }

    /// Sets the cap on unread entries of a reply stream.
    #[must_use]
    pub fn with_reply_maxlen(mut self, n: usize) -> Self {
        self.reply_maxlen = n;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` connections instead of the system's roots.
    #[must_use]
    pub fn with_tls_root_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca_pem = Some(pem.into());
        self
    }

    /// Checks the name, prefix and URL; the error says what is wrong and what is accepted.
    pub fn validate(&self) -> Result<()> {
        validate_name("queue name", &self.name)?;
        validate_name("key prefix", &self.prefix)?;
        if self.max_body_bytes == 0 {
            return Err(Error::config("max_body_bytes must be at least 1"));
        }
        positive("result_ttl", self.result_ttl)?;
        if self.failure_ttl > self.result_ttl {
            return Err(Error::config(format!(
                "failure_ttl ({:?}) must not be longer than result_ttl ({:?}): a failure is recorded for result_ttl",
                self.failure_ttl, self.result_ttl
            )));
        }
        positive("janitor_interval", self.janitor_interval)?;
        positive("command_timeout", self.command_timeout)?;
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(Error::config(format!(
                "partitions must be 1 to {MAX_PARTITIONS}, got {}",
                self.partitions
            )));
        }
        if self.reply_maxlen == 0 || self.dead_maxlen == 0 {
            return Err(Error::config(
                "reply_maxlen and dead_maxlen must be at least 1",
            ));
        }
        crate::conn::Endpoint::of(
            &self.url,
            self.tls_root_ca_pem.as_deref(),
            self.command_timeout,
            self.lean_connections,
        )?;
        Ok(())
    }
}

pub(crate) fn validate_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::config(format!("the {what} is empty")));
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return Err(Error::config(format!(
            "the {what} is {} bytes long; at most {MAX_QUEUE_NAME_LEN} are allowed",
            name.len()
        )));
    }
    if name.contains('{') || name.contains('}') {
        return Err(Error::config(format!(
            "the {what} {name:?} contains a brace; braces are not allowed because pelican \
             puts the queue name in the keys' hash tag {{...}} itself"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        return Err(Error::config(format!(
            "the {what} {name:?} contains {c:?}; use only letters, digits and . _ - :"
        )));
    }
    Ok(())
}

impl QueueConfig {
    /// The Redis keys of this queue, for operators' tools that look at Redis directly
    /// (see [`crate::admin`]: they follow the wire protocol and may change between minor
    /// versions); with several partitions, those of partition 0 (see
    /// [`QueueConfig::partition_keys`]).
    pub fn keys(&self) -> crate::Keys {
        self.partition_keys(0)
    }

    /// The Redis keys of partition `partition` in the configured layout
    /// ([`PartitionLayout::Auto`]: the spread layout a new queue gets; the connected
    /// producers, consumers and [`crate::Admin`] use the layout the queue has recorded).
    pub fn partition_keys(&self, partition: u32) -> crate::Keys {
        crate::Keys::partition_in(
            self.partition_layout,
            &self.prefix,
            &self.name,
            partition,
            self.partitions,
        )
    }
}

pub(crate) fn positive(what: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::config(format!("{what} must be positive")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed_stably_and_spread() {
        let q = QueueConfig::new("redis://h:1", "q").with_partitions(6);
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(q.partition_of("a"), (0xaf63_dc4c_8601_ec8c_u64 % 6) as u32);
        let mut counts = [0u32; 6];
        for i in 0..6000 {
            counts[q.partition_of(&format!("{i:032x}")) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
        assert_eq!(QueueConfig::new("redis://h:1", "q").partition_of("a"), 0);
        assert!(q.clone().with_partitions(0).validate().is_err());
        assert!(q.with_partitions(MAX_PARTITIONS + 1).validate().is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redacted_url("redis://user:secret@host:1/0"),
            "redis://user:***@host:1/0"
        );
        assert_eq!(
            redacted_url("redis://:secret@host:1"),
            "redis://:***@host:1"
        );
        assert_eq!(redacted_url("redis://secret@host:1"), "redis://***@host:1");
        assert_eq!(redacted_url("redis://host:1"), "redis://host:1");
    }

    #[test]
    fn debug_output_hides_the_password() {
        let q = QueueConfig::new("redis://pelican:hunter2@127.0.0.1:6379", "jobs")
            .with_tls_root_ca_pem(b"-----BEGIN CERTIFICATE-----".to_vec());
        let shown = format!("{q:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("redis://pelican:***@127.0.0.1:6379"),
            "{shown}"
        );
        let err = QueueConfig::new("http://u:hunter2@host", "jobs")
            .validate()
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn queue_names_are_checked() {
        assert!(QueueConfig::new("redis://127.0.0.1/", "ok-name_1.x:y")
            .validate()
            .is_ok());
        for bad in ["", "a{b", "a}b", "has space", &"x".repeat(129)] {
            let err = QueueConfig::new("redis://127.0.0.1/", bad)
                .validate()
                .unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Config, "{bad}");
        }
        let err = QueueConfig::new("redis://127.0.0.1/", "a{b}")
            .validate()
            .unwrap_err();
        assert!(err.message().contains("brace"), "{err}");
    }

    #[test]
    fn urls_are_checked() {
        for bad in ["", "http://x", "127.0.0.1:6379", "redis://:notaport"] {
            let err = QueueConfig::new(bad, "q").validate().unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Config, "{bad}");
            assert!(err.message().contains("redis://"), "{err}");
        }
    }
}
