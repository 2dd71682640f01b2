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
///
/// A handler can use `?` on any error type: a bare `?` gives the request back to be
/// tried again ([`HandlerError::Retry`], with the error's message and its sources), since
/// an error the handler did not judge is most often a passing one (a connection, a
/// timeout, a service restarting); a request that keeps failing is dead-lettered after
/// `max_deliveries`. Where the handler knows better, it says so per call with
/// [`HandlerResultExt`]: `.or_fail()?` ends the request (every caller gets
/// [`ErrorKind::Remote`] with the message), `.or_retry_after(delay)?` waits first.
///
/// ```no_run
/// use pelican::{HandlerError, HandlerResultExt, Job};
///
/// async fn handle(path: String, _job: Job) -> Result<u64, HandlerError> {
///     let text = std::fs::read_to_string(&path)?; // cannot read it (yet): retry
///     let n: u64 = text.trim().parse().or_fail()?; // not a number: fail for good
///     Ok(n * 2)
/// }
/// ```
///
/// It is not itself a [`std::error::Error`] (that would rule out the conversion from
/// every error); it is [`Display`](std::fmt::Display).
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

    /// The message, whichever the variant.
    pub fn message(&self) -> &str {
        match self {
            HandlerError::Fail(m) | HandlerError::Retry(m) | HandlerError::RetryAfter(_, m) => m,
        }
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

/// What a bare `?` does in a handler: any error is a passing failure,
/// [`HandlerError::Retry`], with the error's message and those of its sources.
impl<E: std::error::Error> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::Retry(chain(&e))
    }
}

/// An error's message followed by its sources' (`outer: inner: ...`), leaving out a
/// source whose message the text already holds (many errors print their source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let m = s.to_string();
        if !m.is_empty() && !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        source = s.source();
    }
    text
}

/// Says, per call, what an error means for the request: `.or_fail()?` ends it for good,
/// `.or_retry()?` gives it back (what a bare `?` does for a [`std::error::Error`]),
/// `.or_retry_after(delay)?` gives it back to be tried after about `delay`. For any
/// `Result` whose error can be displayed, also those a bare `?` does not take (a
/// `Box<dyn Error>`, `anyhow::Error`, a `String`); the message is the error's `{:#}` form
/// (the whole chain, for `anyhow`'s errors).
///
/// ```
/// use pelican::{HandlerError, HandlerResultExt};
///
/// let bad: Result<u32, _> = "x".parse::<u32>();
/// assert!(matches!(bad.clone().or_fail(), Err(HandlerError::Fail(_))));
/// assert!(matches!(bad.or_retry(), Err(HandlerError::Retry(_))));
/// ```
pub trait HandlerResultExt<T> {
    /// An error fails the request for good ([`HandlerError::Fail`]).
    fn or_fail(self) -> std::result::Result<T, HandlerError>;
    /// An error gives the request back to be tried again ([`HandlerError::Retry`]).
    fn or_retry(self) -> std::result::Result<T, HandlerError>;
    /// An error gives the request back to be tried again after about `delay`
    /// ([`HandlerError::RetryAfter`]).
    fn or_retry_after(self, delay: Duration) -> std::result::Result<T, HandlerError>;
}

impl<T, E: std::fmt::Display> HandlerResultExt<T> for std::result::Result<T, E> {
    fn or_fail(self) -> std::result::Result<T, HandlerError> {
        self.map_err(|e| HandlerError::Fail(format!("{e:#}")))
    }

    fn or_retry(self) -> std::result::Result<T, HandlerError> {
        self.map_err(|e| HandlerError::Retry(format!("{e:#}")))
    }

    fn or_retry_after(self, delay: Duration) -> std::result::Result<T, HandlerError> {
        self.map_err(|e| HandlerError::RetryAfter(delay, format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("reading the settings")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// A bare `?` retries with the error's chain; a source the message already shows is
    /// not repeated; the extension trait decides per call.
    #[test]
    fn a_bare_question_mark_retries_and_the_handler_can_say_otherwise() {
        fn handler(e: Outer) -> std::result::Result<(), HandlerError> {
            Err(e)?
        }
        let e = handler(Outer(std::io::Error::other("disk gone"))).unwrap_err();
        assert_eq!(e, HandlerError::retry("reading the settings: disk gone"));
        let shown = std::io::Error::other(Outer(std::io::Error::other("x")));
        assert_eq!(
            HandlerError::from(shown),
            HandlerError::retry("reading the settings: x")
        );

        let bad = "seven".parse::<u32>();
        let fail = bad.clone().or_fail().unwrap_err();
        assert!(matches!(fail, HandlerError::Fail(_)), "{fail:?}");
        assert_eq!(fail.message(), "invalid digit found in string");
        assert!(matches!(
            bad.clone().or_retry(),
            Err(HandlerError::Retry(_))
        ));
        let later = bad.or_retry_after(Duration::from_secs(1)).unwrap_err();
        assert!(matches!(later, HandlerError::RetryAfter(d, _) if d == Duration::from_secs(1)));
        assert_eq!(Ok::<_, String>(3).or_fail(), Ok(3));
    }
}
