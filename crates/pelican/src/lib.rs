//! # pelican
//!
//! Request/response work queues on Redis Streams. Many producers and many consumers
//! share a queue; a producer submits a typed request and awaits its typed response.
//!
//! - **Dedup**: identical requests in flight are solved once, whoever submitted them,
//!   and every submitter gets the answer; a repeat within `result_ttl` is answered
//!   from the cache.
//! - **Recovery**: work held by a consumer that dies is taken over by another after
//!   `claim_idle` (XPENDING + XCLAIM, no heartbeat keys); live consumers renew their
//!   leases, owner-checked.
//! - **Dead letters**: a request delivered `max_deliveries` times without an outcome,
//!   or one that cannot be decoded, goes to a dead-letter stream with its reason, and
//!   its callers get [`ErrorKind::Dead`].
//! - **Pushed results**: outcomes are pushed to each producer's reply stream; nobody
//!   polls.
//!
//! ```no_run
//! use pelican::{ConsumerConfig, HandlerResultExt, ProducerConfig, Queue, QueueConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Square { n: String }
//!
//! # async fn example() -> pelican::Result<()> {
//! // One typed handle: its producers and consumers agree on the types.
//! let squares = Queue::<Square, u64>::new(QueueConfig::new("redis://127.0.0.1:6379", "squares"));
//!
//! let worker = squares
//!     .serve(ConsumerConfig::default(), 8, |req: Square, _job| async move {
//!         // Not a number: fail for good. (A bare `?` would retry.)
//!         let n: u64 = req.n.parse().or_fail()?;
//!         Ok(n * n)
//!     })
//!     .await?;
//!
//! let producer = squares.producer(ProducerConfig::default()).await?;
//! assert_eq!(producer.call(&Square { n: "12".into() }).await?, 144);
//!
//! worker.stop().await?;
//! # Ok(()) }
//! ```
//!
//! A handler's `Ok` is the response; its errors say what to do with the request
//! ([`HandlerError`]): a bare `?` on any [`std::error::Error`] gives it back to be
//! tried again, [`HandlerResultExt`]'s `.or_fail()?` fails it for good. Configs are
//! built with `new`/`default` and `with_*` methods (they are `#[non_exhaustive]`).
//!
//! ## Layout
//! ARCHITECTURE.md walks one request through these, file by file.
//! - [`config`]: where a queue lives and how many partitions it has ([`QueueConfig`],
//!   `mod.rs`), how producers and consumers behave ([`ProducerConfig`],
//!   [`ConsumerConfig`], a file each).
//! - `producer/`: [`Producer`] (`mod.rs`), [`Ticket`] (`ticket.rs`), [`CallOptions`]
//!   (`options.rs`), waiting on a request by its id (`watch.rs`), its state
//!   (`state.rs`) and waiters table (`pending.rs`), batched submissions (`submit.rs`) on
//!   its lean connections (`lean.rs`), withdrawals (`cancel.rs`), the reply reader
//!   (`replies.rs`), stored answers (`answers.rs`), trimming, sweep and janitor
//!   (`maintenance.rs`).
//! - `consumer/`: the consumer core, one for both wire formats, the wire behind a trait
//!   (`wire.rs`): the reader (`reader.rs`, `fetch.rs`, `admit.rs`), waking it for
//!   released work and a stop (`wake.rs`), the outcome writer (`writer.rs`), leases
//!   (`lease.rs`), renewal and upkeep (`maintenance.rs`), the handlers' tasks
//!   (`serve.rs`), a delivery, [`LeaseLost`], [`HandlerError`] and [`HandlerResultExt`]
//!   (`delivery.rs`), what they share (`state.rs`). `consumer/pelican/`: pelican's wire
//!   (`wire.rs`: admission,
//!   dead letters, outcomes, reclaim, janitor), [`Consumer`] (`mod.rs`), [`Delivery`] and
//!   [`Job`] (`delivery.rs`).
//! - `nitro` (feature `nitro`): Nitro's wire format (Arbitrum's `pubsub` streams): a
//!   consumer (the same core on Nitro's wire), a producer, stats and the validation
//!   types.
//! - `queue.rs`: [`Queue`], the typed handle producers and consumers are made from, and
//!   [`Worker`].
//! - [`admin`]: for operators' tools (may change between minor versions): look inside a
//!   queue (stats, one request, dead letters), requeue and purge; the names of what is
//!   written to Redis ([`admin::Keys`], [`admin::EntryHead`]).
//! - `protocol/`: what is written to Redis: keys ([`admin::Keys`]), stream entries, request ids,
//!   the request index value, outcomes, values stored beside the stream (`stored/`: large
//!   bodies and answers), and one typed call per Lua script (`lua/*.lua`); described in
//!   `docs/PROTOCOL.md`.
//! - `conn/`: every connection (the shared one, on one node or a Redis Cluster; the
//!   tasks' own, to the node of their partition's slot; the lean wire), Redis URLs
//!   (`url.rs`), replies and stream entries as read (`reply.rs`), hash slots and cluster
//!   URLs (`cluster.rs`), backoff and retry. `shared.rs`: one partition of a connected
//!   queue, what its producers, consumers and admin share.
//! - `error`: [`Error`], [`ErrorKind`]; `codec`: [`Codec`], [`Json`]; `task`: owned,
//!   supervised background tasks; `trace`: trace context across processes; `metrics`,
//!   `ids`, `clock`.
//!
//! Modules depend downwards only: `conn` on nothing of pelican's but errors; `protocol` on
//! `conn`; `config` on both; `shared` on those; producer, consumer, admin and `nitro` on
//! all of them; `queue` on producer, consumer and admin.
//!
//! ## Observability
//! Counters and histograms go through the `metrics` facade (`pelican_requests_*`,
//! `pelican_deliveries_*`, `pelican_dead_lettered_total`, ... each with a `queue` label;
//! `pelican_requests_resubmitted_total{why}` counts the requests a producer submitted
//! again of its own accord: `lost`, `expired`, `answer_gone`);
//! install a recorder (e.g. a Prometheus exporter) *before* connecting: a queue's series
//! are registered when a producer, consumer or admin connects. Spans and events go
//! through `tracing`: [`Producer::call`] runs in a span `pelican.call`, and
//! [`Consumer::serve`] runs each handler in a span `pelican.handle`. With the `otel`
//! feature (and `tracing-opentelemetry`'s layer installed by the application), a request
//! is one trace: the producer writes the current span's W3C trace context into the entry
//! (field `tp`), and the handler span continues it (`trace.rs`; [`Job::trace_parent`]).

#![warn(missing_docs)]

/// The crate README's examples (the repository README's too, which must match them:
/// `tests/it/docs.rs`), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod admin;
mod clock;
mod codec;
pub mod config;
mod conn;
mod consumer;
mod error;
mod ids;
mod metrics;
#[cfg(feature = "nitro")]
pub mod nitro;
mod producer;
mod protocol;
mod queue;
mod shared;
mod task;
mod trace;

/// A map of the hot path (a producer's waiters by request id, a consumer's leases by
/// entry id), hashed by foldhash, randomly seeded per process: a few times faster than
/// std's SipHash for short keys.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use admin::Admin;
pub use bytes::Bytes;
#[cfg(feature = "postcard")]
pub use codec::Postcard;
pub use codec::{Codec, CodecError, Json, Raw};
pub use config::{ConsumerConfig, PartitionLayout, ProducerConfig, QueueConfig};
pub use consumer::{Consumer, Stopper};
pub use consumer::{Delivery, HandlerError, HandlerResultExt, Job, LeaseLost};
pub use error::{Error, ErrorKind, Result};
pub use producer::{CallOptions, Producer, Submitted, Ticket};
/// The queue's key names, for the crate's own use; the public path is [`admin::Keys`].
pub(crate) use protocol::keys::Keys;
pub use queue::{Queue, Worker};
