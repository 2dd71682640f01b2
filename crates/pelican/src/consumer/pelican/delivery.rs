//! One request in a consumer's hands: [`Job`] (what its handler is told) and the
//! public [`Delivery`], answered once through the consumer core's writer.

use super::wire::Pelican;
use crate::codec::{Codec, Json};
use crate::consumer::delivery as base;
use crate::consumer::LeaseLost;
use crate::error::Result;
use serde::Serialize;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What is known about a delivered request besides its body.
#[derive(Debug, Clone)]
pub struct Job {
    // Shared, not copied: a job is cloned for the handler and its ids go on to the
    // outcome's write.
    pub(crate) sid: Arc<str>,
    pub(crate) rid: Arc<str>,
    pub(crate) from: Arc<str>,
    pub(crate) indexed: bool,
    pub(crate) stored_body: bool,
    /// Small enough to wait for a trim once finished ([`crate::protocol::entry::Request`]).
    pub(crate) small: bool,
    pub(crate) deliveries: u32,
    pub(crate) deadline_ms: u64,
    pub(crate) submitted_ms: u64,
    /// The entry's `tp` field: the submitter's W3C trace context.
    pub(crate) tp: Option<Arc<str>>,
    pub(crate) lease: LeaseLost,
}

impl Job {
    /// The request id (the dedup key).
    pub fn request_id(&self) -> &str {
        &self.rid
    }

    /// The submitter's W3C trace context (a `traceparent` value), if its producer was
    /// built with the `otel` feature and submitted inside an OpenTelemetry trace. With
    /// dedup, the first submitter's. [`crate::Consumer::serve`] continues it in its
    /// handler span; users of [`crate::Consumer::next`] can continue it themselves.
    pub fn trace_parent(&self) -> Option<&str> {
        self.tp.as_deref()
    }

    /// The stream entry id.
    pub fn entry_id(&self) -> &str {
        &self.sid
    }

    /// How many times this request has been delivered, this time included (1 = first).
    pub fn delivery_count(&self) -> u32 {
        self.deliveries
    }

    /// When the request stops being worth solving.
    pub fn deadline(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.deadline_ms)
    }

    /// When the request was submitted (by the submitting producer's clock).
    pub fn submitted_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.submitted_ms)
    }

    /// Fires when this consumer lost the lease (another consumer took the request over,
    /// or it was withdrawn) or is shutting down past its timeout: stop working on it, its
    /// outcome will most likely be dropped.
    pub fn lease_lost(&self) -> LeaseLost {
        self.lease.clone()
    }

    /// Whether the lease has been lost.
    pub fn is_lease_lost(&self) -> bool {
        self.lease.is_lost()
    }
}

/// A request delivered to this consumer. Answer it once with [`Delivery::respond`],
/// [`Delivery::fail`] or [`Delivery::retry`]; dropping it unanswered releases it so
/// another consumer can take it at once (the delivery still counts).
pub struct Delivery<Req, Resp, C: Codec = Json> {
    pub(crate) inner: base::Delivery<Pelican<C>, Req>,
    _types: PhantomData<fn(Resp)>,
}

impl<Req, Resp, C: Codec> Delivery<Req, Resp, C> {
    pub(crate) fn new(inner: base::Delivery<Pelican<C>, Req>) -> Self {
        Delivery {
            inner,
            _types: PhantomData,
        }
    }
}

impl<Req, Resp: Serialize, C: Codec> Delivery<Req, Resp, C> {
    /// The request.
    pub fn request(&self) -> &Req {
        self.inner.request()
    }

    /// Takes the request out (the delivery can still be answered).
    pub fn take_request(&mut self) -> Req {
        self.inner.take_request()
    }

    /// Everything else about the delivery.
    pub fn job(&self) -> &Job {
        self.inner.job()
    }

    /// Answers with a response. Returns `true` when this was the request's outcome,
    /// `false` when another outcome had been recorded first (e.g. this consumer lost its
    /// lease and another one finished): the response was dropped.
    ///
    /// The response is encoded before this returns, so the future does not borrow it.
    pub fn respond(self, resp: &Resp) -> impl Future<Output = Result<bool>> + Send + 'static
    where
        Req: Send + 'static,
        Resp: 'static,
    {
        self.inner.respond(resp)
    }

    /// Fails the request for good: the caller gets a [`ErrorKind::Remote`] error with
    /// this message. Same return value as [`Delivery::respond`].
    ///
    /// [`ErrorKind::Remote`]: crate::ErrorKind::Remote
    pub async fn fail(self, message: impl Into<String>) -> Result<bool> {
        self.inner.fail(message.into()).await
    }

    /// Gives the request back for another delivery right away (to any consumer). The
    /// delivery counts towards `max_deliveries`.
    pub async fn retry(self) -> Result<()> {
        self.retry_after(Duration::ZERO).await
    }

    /// Gives the request back to be delivered again after about `delay` (at most
    /// `claim_idle`).
    pub async fn retry_after(self, delay: Duration) -> Result<()> {
        self.inner.retry_after(delay).await
    }
}
