//! One entry in a consumer's hands, whatever its wire: answered once through the
//! [`Writer`] handle (its prefetch slot held until the answer is written), released when
//! dropped unanswered; and what a handler is told of its lease and says of a failure
//! ([`LeaseLost`], [`HandlerError`]).

use super::wire::Wire;
use super::writer::{Completion, Release, WriteJob, Writer};
use crate::clock::ms;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::HandBack;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// An entry delivered to this consumer, to be answered once.
pub(crate) struct Delivery<W: Wire, Req> {
    writer: Arc<Writer<W>>,
    req: Option<Req>,
    job: W::Job,
    /// The prefetch slot, held until the outcome is written.
    permit: Option<OwnedSemaphorePermit>,
    answered: bool,
    received: Instant,
}

impl<W: Wire, Req> Delivery<W, Req> {
    pub(crate) fn new(
        writer: Arc<Writer<W>>,
        req: Req,
        job: W::Job,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        Delivery {
            writer,
            req: Some(req),
            job,
            permit: Some(permit),
            answered: false,
            received: Instant::now(),
        }
    }

    /// The request.
    pub(crate) fn request(&self) -> &Req {
        self.req.as_ref().expect("request taken")
    }

    /// Takes the request out (the delivery can still be answered).
    pub(crate) fn take_request(&mut self) -> Req {
        self.req.take().expect("request taken")
    }

    /// Everything else about the delivery.
    pub(crate) fn job(&self) -> &W::Job {
        &self.job
    }

    /// The wire it came by.
    pub(crate) fn wire(&self) -> &W {
        &self.writer.wire
    }

    /// Answers with a response: `true` when this was the entry's answer, `false` when
    /// another had been recorded first. The response is encoded before this returns.
    pub(crate) fn respond<Resp: Serialize>(
        mut self,
        resp: &Resp,
    ) -> impl Future<Output = Result<bool>> + Send + 'static
    where
        Req: Send + 'static,
    {
        let (finish, err) = self.writer.wire.respond(&self.job, resp);
        async move {
            let recorded = self.finish(finish).await?;
            match err {
                Some(e) => Err(e),
                None => Ok(recorded),
            }
        }
    }

    /// Fails the request for good with `message`.
    pub(crate) async fn fail(mut self, message: String) -> Result<bool> {
        let finish = self.writer.wire.fail(&self.job, message);
        self.finish(finish).await
    }

    /// Gives the entry back to be delivered again after about `delay` (at most
    /// `claim_idle`).
    pub(crate) async fn retry_after(mut self, delay: Duration) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.release(delay, Some(tx));
        self.written(rx).await
    }

    /// [`Delivery::respond`] without waiting for the write: the prefetch slot goes with
    /// the outcome to the writer, which logs a failure to write it. `Err` if the response
    /// could not be sent as it is (the request fails with a message saying so).
    pub(crate) fn respond_in_background<Resp: Serialize>(mut self, resp: &Resp) -> Result<()> {
        let (finish, err) = self.writer.wire.respond(&self.job, resp);
        self.hand_over(finish, None);
        err.map_or(Ok(()), Err)
    }

    /// [`Delivery::fail`] without waiting for the write.
    pub(crate) fn fail_in_background(mut self, message: String) {
        let finish = self.writer.wire.fail(&self.job, message);
        self.hand_over(finish, None);
    }

    /// [`Delivery::retry_after`] without waiting for the write.
    pub(crate) fn retry_in_background(mut self, delay: Duration) {
        self.release(delay, None);
    }

    async fn finish(&mut self, finish: W::Finish) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        self.hand_over(finish, Some(tx));
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

    /// Sends the answer to the writer. Without `ack` the prefetch slot goes with it.
    fn hand_over(&mut self, finish: W::Finish, ack: Option<oneshot::Sender<Result<bool>>>) {
        self.answered = true;
        self.writer
            .wire
            .place()
            .metrics
            .handler_duration(self.received.elapsed());
        let slot = self.slot_unless(ack.is_some());
        self.writer.send(WriteJob::Complete(Completion {
            sid: W::entry_id(&self.job).clone(),
            finish,
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
            sid: W::entry_id(&self.job).clone(),
            idle_ms: ms(idle),
            ack,
            slot,
        }));
    }
}

impl<W: Wire, Req> Drop for Delivery<W, Req> {
    fn drop(&mut self) {
        if !self.answered {
            self.writer
                .hand_back(W::entry_id(&self.job).clone(), HandBack::Dropped);
        }
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
