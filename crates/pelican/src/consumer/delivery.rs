//! One request in a consumer's hands. A delivery knows nothing of the consumer but the
//! [`Writer`] handle its outcome goes to.

use super::writer::{Completion, Release, WriteJob, Writer};
use crate::clock::ms;
use crate::codec::{Codec, Json};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::outcome::Outcome;
use serde::Serialize;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

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

/// A handle on a delivery's lease: await [`LeaseLost::cancelled`] (e.g. in a
/// `tokio::select!` beside the work) to stop when the lease is lost.
#[derive(Debug, Clone)]
pub struct LeaseLost(pub(crate) CancellationToken);

impl LeaseLost {
    /// Completes when the lease is lost (at once if it already is).
    pub async fn cancelled(&self) {
        self.0.cancelled().await
    }

    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// A request delivered to this consumer. Answer it once with [`Delivery::respond`],
/// [`Delivery::fail`] or [`Delivery::retry`]; dropping it unanswered releases it so
/// another consumer can take it at once (the delivery still counts).
pub struct Delivery<Req, Resp, C: Codec = Json> {
    writer: Arc<Writer>,
    req: Option<Req>,
    job: Job,
    /// The prefetch slot, held until the outcome is written.
    permit: Option<OwnedSemaphorePermit>,
    answered: bool,
    received: Instant,
    _types: PhantomData<fn(Resp) -> C>,
}

impl<Req, Resp, C: Codec> Delivery<Req, Resp, C> {
    pub(crate) fn new(
        writer: Arc<Writer>,
        req: Req,
        job: Job,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        Delivery {
            writer,
            req: Some(req),
            job,
            permit: Some(permit),
            answered: false,
            received: Instant::now(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp: Serialize, C: Codec> Delivery<Req, Resp, C> {
    /// The request.
    pub fn request(&self) -> &Req {
        self.req.as_ref().expect("request taken")
    }

    /// Takes the request out (the delivery can still be answered).
    pub fn take_request(&mut self) -> Req {
        self.req.take().expect("request taken")
    }

    /// Everything else about the delivery.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Answers with a response. Returns `true` when this was the request's outcome,
    /// `false` when another outcome had been recorded first (e.g. this consumer lost its
    /// lease and another one finished): the response was dropped.
    ///
    /// The response is encoded before this returns, so the future does not borrow it.
    pub fn respond(mut self, resp: &Resp) -> impl Future<Output = Result<bool>> + Send + 'static
    where
        Req: Send + 'static,
        Resp: 'static,
    {
        let (outcome, err) = self.encode(resp);
        async move {
            let recorded = self.finish(outcome).await?;
            match err {
                Some(e) => Err(e),
                None => Ok(recorded),
            }
        }
    }

    /// Fails the request for good: the caller gets a [`ErrorKind::Remote`] error with
    /// this message. Same return value as [`Delivery::respond`].
    pub async fn fail(mut self, message: impl Into<String>) -> Result<bool> {
        self.finish(Outcome::Remote(message.into())).await
    }

    /// Gives the request back for another delivery right away (to any consumer). The
    /// delivery counts towards `max_deliveries`.
    pub async fn retry(self) -> Result<()> {
        self.retry_after(Duration::ZERO).await
    }

    /// Gives the request back to be delivered again after about `delay` (at most
    /// `claim_idle`).
    pub async fn retry_after(mut self, delay: Duration) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.release(delay, Some(tx));
        self.written(rx).await
    }

    /// [`Delivery::respond`] without waiting for the write: the prefetch slot goes with
    /// the outcome to the writer, which logs a failure to write it. `Err` if the response
    /// could not be sent as it is (not encodable, too large: the request fails with a
    /// message saying so).
    pub(crate) fn respond_in_background(mut self, resp: &Resp) -> Result<()> {
        let (outcome, err) = self.encode(resp);
        self.hand_over(outcome, None);
        err.map_or(Ok(()), Err)
    }

    /// [`Delivery::fail`] without waiting for the write (see `respond_in_background`).
    pub(crate) fn fail_in_background(mut self, message: String) {
        self.hand_over(Outcome::Remote(message), None);
    }

    /// [`Delivery::retry_after`] without waiting for the write (see
    /// `respond_in_background`).
    pub(crate) fn retry_in_background(mut self, delay: Duration) {
        self.release(delay, None);
    }

    /// The outcome a response makes, and the error to report with it when it cannot be
    /// sent as it is.
    fn encode(&self, resp: &Resp) -> (Outcome, Option<Error>) {
        let max = self.writer.max_body_bytes();
        match C::encode(resp) {
            Err(e) => {
                let err = Error::codec("encoding the response", e);
                let o = Outcome::Remote(format!(
                    "the handler's response could not be encoded: {err:#}"
                ));
                (o, Some(err))
            }
            Ok(body) if body.len() > max => {
                let msg = format!(
                    "the response body is {} bytes; max_body_bytes is {max}",
                    body.len()
                );
                (
                    Outcome::Remote(msg.clone()),
                    Some(Error::new(ErrorKind::TooLarge, msg)),
                )
            }
            Ok(body) => (Outcome::Ok(body), None),
        }
    }

    async fn finish(&mut self, outcome: Outcome) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        self.hand_over(outcome, Some(tx));
        self.written(rx).await
    }

    /// Waits for the writer's word on what this delivery handed it. The prefetch slot is
    /// held until then: it bounds the work in this consumer's hands, writes included.
    async fn written<T>(&mut self, rx: oneshot::Receiver<Result<T>>) -> Result<T> {
        let r = rx
            .await
            .map_err(|_| Error::new(ErrorKind::Shutdown, "the consumer is shut down"))?;
        self.permit.take();
        r
    }

    /// The prefetch slot, to go with what is handed to the writer when nobody waits for
    /// the write (`waited`: someone does, and frees it then).
    fn slot_unless(&mut self, waited: bool) -> Option<OwnedSemaphorePermit> {
        if waited {
            None
        } else {
            self.permit.take()
        }
    }

    /// Sends the outcome to the writer. Without `ack` the prefetch slot goes with it.
    fn hand_over(&mut self, outcome: Outcome, ack: Option<oneshot::Sender<Result<bool>>>) {
        self.answered = true;
        self.writer
            .metrics()
            .handler_duration(self.received.elapsed());
        let slot = self.slot_unless(ack.is_some());
        self.writer.send(WriteJob::Complete(Completion {
            sid: self.job.sid.clone(),
            rid: self.job.rid.clone(),
            from: self.job.from.clone(),
            deadline_ms: self.job.deadline_ms,
            indexed: self.job.indexed,
            stored_body: self.job.stored_body,
            small: self.job.small,
            outcome,
            ack,
            slot,
        }));
    }

    /// Sends the release to the writer. Without `ack` the prefetch slot goes with it.
    fn release(&mut self, delay: Duration, ack: Option<oneshot::Sender<Result<()>>>) {
        self.answered = true;
        let idle = self.writer.claim_idle().saturating_sub(delay);
        let slot = self.slot_unless(ack.is_some());
        self.writer.send(WriteJob::Release(Release {
            sid: self.job.sid.clone(),
            idle_ms: ms(idle),
            ack,
            slot,
        }));
    }
}

impl<Req, Resp, C: Codec> Drop for Delivery<Req, Resp, C> {
    fn drop(&mut self) {
        if !self.answered {
            self.writer
                .hand_back(self.job.sid.clone(), crate::metrics::HandBack::Dropped);
        }
    }
}

/// How a handler says a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerError {
    /// Fail for good: every caller waiting gets an [`ErrorKind::Remote`] error with this
    /// message (and a later identical request too, within
    /// [`crate::QueueConfig::failure_ttl`]; after it, the request runs again).
    Fail(String),
    /// Give the request back to be tried again (counts towards `max_deliveries`).
    Retry(String),
    /// Give it back to be tried again after about this long.
    RetryAfter(Duration, String),
}

impl HandlerError {
    /// A final failure.
    pub fn fail(message: impl Into<String>) -> Self {
        HandlerError::Fail(message.into())
    }

    /// A passing failure: try again.
    pub fn retry(message: impl Into<String>) -> Self {
        HandlerError::Retry(message.into())
    }

    /// A passing failure: try again after about `delay` (at most `claim_idle`).
    pub fn retry_after(delay: Duration, message: impl Into<String>) -> Self {
        HandlerError::RetryAfter(delay, message.into())
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerError::Fail(m) => write!(f, "failed: {m}"),
            HandlerError::Retry(m) => write!(f, "retry: {m}"),
            HandlerError::RetryAfter(d, m) => write!(f, "retry after {d:?}: {m}"),
        }
    }
}

impl std::error::Error for HandlerError {}
