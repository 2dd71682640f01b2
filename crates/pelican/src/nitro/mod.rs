//! Nitro's wire format: pelican as a drop-in for the Redis-streams `pubsub` package of
//! Arbitrum Nitro (its block validator sends validation requests to validation workers
//! through it).
//!
//! - [`Consumer`] serves a stream that Nitro's Go producers write, alone or in one group
//!   with Nitro's own consumers during a migration; [`Producer`] drives Nitro's Go
//!   validation workers (or pelican's consumers).
//! - The wire: the consumer group is named like the stream; one entry field, `msg`, holds
//!   the JSON request; the request id is the entry id; the answer is
//!   `result-key:<stream>.<id>` (JSON, `SET NX EX`) or `error-key:<stream>.<id>.error`
//!   (plain text), then XACK and XDEL. Keys: [`StreamKeys`].
//! - What pelican does better on the same wire (answers in one script, owner-checked
//!   heartbeats, no poison loops, polls pipelined, lost streams recovered, and dedup of
//!   identical bodies from the consumer side): see `docs/PROTOCOL.md`, "Nitro".
//! - [`validation`]: Nitro's validation request and response as Go writes them.
//!
//! Needs one Redis server (Nitro's keys carry no hash tag, so the atomic answer cannot
//! span a cluster's slots), 7.0 or newer, as the rest of pelican.
//!
//! Layout: `config.rs`, `keys.rs`, `scripts.rs` (`lua/nitro_*.lua`), `link.rs` (the
//! connection a consumer, producer or stats share), `consumer/`, `producer/`,
//! `stats.rs`, `validation.rs` (with `base64.rs`).

mod base64;
mod config;
mod consumer;
mod keys;
mod link;
mod producer;
mod scripts;
mod stats;
pub mod validation;

pub use config::{
    ConsumerConfig, ProducerConfig, StreamConfig, DEFAULT_DEDUP_CACHE_TTL, DEFAULT_IDLETIME,
    DEFAULT_POLL_INTERVAL, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RESPONSE_TTL,
};
pub use consumer::{Consumer, Job};
pub use keys::StreamKeys;
pub use producer::{Producer, Ticket};
pub use stats::{stats, ConsumerStats, GroupStats, StreamStats};

/// Nitro's error text for an entry delivered more than `max-retry-count` times.
pub const TOO_MANY_RETRIES: &str = "too many retries";

/// Nitro's timeout text, which Nitro's validator matches as a substring; a pelican
/// producer's timeout message contains it.
pub const TIMEOUT_TEXT: &str = producer::TIMEOUT_TEXT;
