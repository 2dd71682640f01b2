//! The Nitro-format consumer: serves a stream that Nitro's producers (or pelican's
//! [`Producer`](crate::nitro::Producer)) write, alongside Nitro's own consumers. It is
//! the consumer core (`crate::consumer`: slots, read-ahead, leases, the batching writer,
//! serve, shutdown, wake-ups) on Nitro's wire (`wire.rs`).

mod wire;

use super::config::{ConsumerConfig, StreamConfig};
use super::link::Link;
use crate::consumer::{Core, HandlerError, LeaseLost, Stopper};
use crate::error::Result;
use crate::ids;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use wire::Nitro;

/// What a handler is told about the entry it works on besides its request.
#[derive(Debug, Clone)]
pub struct Job {
    pub(crate) id: Arc<str>,
    /// The body hash, with dedup.
    pub(crate) hash: Option<Arc<str>>,
    pub(crate) deliveries: u32,
    pub(crate) lease: LeaseLost,
}

impl Job {
    /// The stream entry id: Nitro's request id (`result-key:<stream>.<id>`).
    pub fn entry_id(&self) -> &str {
        &self.id
    }

    /// How many times the entry has been delivered, this time included (1 = first).
    pub fn delivery_count(&self) -> u32 {
        self.deliveries
    }

    /// Fires when this consumer lost the entry (another consumer took it over, it was
    /// answered elsewhere or withdrawn by its producer) or is shutting down past its
    /// timeout: its answer will most likely be dropped.
    pub fn lease_lost(&self) -> LeaseLost {
        self.lease.clone()
    }

    /// Whether the entry has been lost.
    pub fn is_lease_lost(&self) -> bool {
        self.lease.is_lost()
    }
}

/// Serves requests of type `Req` from a Nitro stream and answers them with `Resp`, in
/// Nitro's wire format: the group is named like the stream, the request is the JSON in
/// the entry's `msg` field, the request id is the entry id, the answer is the key
/// `result-key:<stream>.<id>` (JSON) or `error-key:<stream>.<id>.error` (text).
///
/// Unlike Nitro's consumer it answers atomically (key, XACK, XDEL in one script, and
/// still acknowledges when the key exists), keeps its entries non-idle without ever
/// taking back one another consumer has reclaimed, answers undecodable entries with an
/// error at once, hands its work back on a graceful stop without counting a retry,
/// re-creates a lost group, and leaves the group when it stops with nothing in hand.
pub struct Consumer<Req, Resp> {
    core: Core<Nitro, Req>,
    _types: PhantomData<fn(Resp)>,
}

impl<Req, Resp> Consumer<Req, Resp>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    /// Connects and starts reading. The stream and the group are not created (that is
    /// the producers' job, as in Nitro): until a producer has created them, the consumer
    /// creates the group itself at its first read (`NOGROUP`). Fails with
    /// [`ErrorKind::Config`] for bad settings and [`ErrorKind::Redis`] when Redis cannot
    /// be reached.
    ///
    /// [`ErrorKind::Config`]: crate::ErrorKind::Config
    /// [`ErrorKind::Redis`]: crate::ErrorKind::Redis
    pub async fn connect(stream: StreamConfig, config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        let link = Link::connect(&stream).await?;
        let name = config.name.clone().unwrap_or_else(ids::consumer_name);
        let wire = Nitro::new(link, config);
        let settings = wire.settings();
        let core = Core::start(vec![wire], settings, name).await;
        tracing::debug!(stream = %stream.stream, consumer = %core.name(), "nitro consumer started");
        Ok(Consumer {
            core,
            _types: PhantomData,
        })
    }

    /// This consumer's name in the group.
    pub fn name(&self) -> &str {
        self.core.name()
    }

    /// A handle that stops [`Consumer::serve`].
    pub fn stopper(&self) -> Stopper {
        self.core.stopper()
    }

    /// Runs `handler` on every entry, at most `concurrency` at a time, until
    /// [`Stopper::stop`] is called; then stops gracefully ([`Consumer::shutdown`]).
    ///
    /// The handler's `Ok` is written as the result key (JSON); [`HandlerError::Fail`]'s
    /// message as the error key; a retry ([`HandlerError::Retry`], `RetryAfter`) hands the
    /// entry back to be taken over at once (or after the delay); a panic counts as a
    /// retry and never stops the consumer. With dedup, one run answers every entry of
    /// the same body in flight. Returns an [`ErrorKind::Internal`] error if one of the
    /// consumer's own tasks panicked.
    ///
    /// [`ErrorKind::Internal`]: crate::ErrorKind::Internal
    pub async fn serve<F, Fut>(self, concurrency: usize, handler: F) -> Result<()>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        self.core.serve(concurrency, handler).await
    }

    /// Stops gracefully: reads nothing new (the read under way is cut short), waits up to `shutdown_timeout` for the answers in hand to be written,
    /// then hands back everything it still holds so that any consumer (Nitro's too)
    /// takes it at once (`XCLAIM ... IDLE <idletime> JUSTID`: not counted as a retry),
    /// and leaves the group if it holds nothing.
    pub async fn shutdown(self) -> Result<()> {
        self.core.shutdown().await
    }
}
