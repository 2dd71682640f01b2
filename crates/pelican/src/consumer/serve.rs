//! Driving the handlers: [`Core::serve`] runs a handler on every delivery on long-lived
//! tasks, and hands each answer to the writer without waiting for the write.

use super::delivery::{Delivery, HandlerError};
use super::wire::Wire;
use super::Core;
use crate::error::Result;
use futures_util::FutureExt;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::Instrument;

impl<W, Req> Core<W, Req>
where
    W: Wire,
    Req: DeserializeOwned + Send + 'static,
{
    /// Runs `handler` on every delivery, at most `concurrency` at a time, until the
    /// consumer is stopped; then shuts down gracefully ([`Core::shutdown`]). A handler's
    /// `Ok` is the response; `Err` says whether to fail for good or retry; a handler that
    /// panics counts as a failed delivery (the request is released for redelivery) and
    /// never stops the consumer. Returns an [`ErrorKind::Internal`] error if one of the
    /// consumer's own tasks panicked (after shutting down as well as it can).
    ///
    /// [`ErrorKind::Internal`]: crate::ErrorKind::Internal
    pub(crate) async fn serve<Resp, F, Fut>(mut self, concurrency: usize, handler: F) -> Result<()>
    where
        Resp: Serialize + Send + 'static,
        F: Fn(Req, W::Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        // The handlers run on `concurrency` long-lived tasks, not on a task per delivery
        // (spawning one, an allocation tokio aligns to 128 bytes that the system
        // allocator serves slowly, and the task set's bookkeeping, was 13 % of a worker's
        // instructions per request). A task says when it is free (its number on `free`)
        // and takes its next delivery from a channel of its own: a delivery is taken only
        // for a free task, as before for a free handler slot, and the deliveries at hand
        // go to as many tasks at once, which all run before the writer takes their
        // outcomes (one call for all, not one each). A task hands its outcome to the
        // writer without waiting for the write (the delivery's prefetch slot goes with
        // it), so it is free again as soon as its handler returns. Aborting the tasks
        // (shutdown timeout) drops their handlers and deliveries: released.
        let handler = Arc::new(handler);
        let n = concurrency.max(1);
        let (free_tx, mut free) = mpsc::unbounded_channel::<usize>();
        let mut running = tokio::task::JoinSet::new();
        let mut handlers = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, mut rx) = mpsc::channel::<Delivery<W, Req>>(1);
            handlers.push(tx);
            let (handler, free_tx) = (handler.clone(), free_tx.clone());
            let _ = free_tx.send(i);
            running.spawn(async move {
                while let Some(d) = rx.recv().await {
                    // A panic past the handler's own catch (the response's Serialize,
                    // say) loses this delivery only (dropped: released), not the task.
                    let _ = AssertUnwindSafe(handle(&*handler, d)).catch_unwind().await;
                    let _ = free_tx.send(i);
                }
            });
        }
        drop(free_tx);
        let stop = self.first().stop.clone();
        let mut failure = None;
        loop {
            let i = tokio::select! {
                i = free.recv() => i.expect("the handlers outlive this loop"),
                _ = stop.cancelled() => break,
                e = self.tasks.failed() => {
                    failure = Some(e);
                    break;
                }
            };
            match self.next().await {
                Ok(Some(d)) => {
                    // Free, so its channel has room (and it runs until its channel
                    // closes).
                    let _ = handlers[i].try_send(d);
                }
                Ok(None) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        // The handlers finish what they have, then stop.
        drop(handlers);
        let deadline = tokio::time::sleep(self.first().settings.shutdown_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = running.join_next() => if r.is_none() { break },
                _ = &mut deadline => {
                    tracing::warn!(n = running.len(), "shutdown timeout: cancelling handlers still running and releasing their requests");
                    self.cancel_all();
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                    break;
                }
            }
        }
        let stopped = self.shutdown().await;
        match failure {
            Some(e) => Err(e),
            None => stopped,
        }
    }
}

/// Runs `handler` on one delivery (in the wire's span: pelican's continues the
/// submitter's trace, `otel` feature) and hands its outcome to the writer.
async fn handle<W, Req, Resp, F, Fut>(handler: &F, mut d: Delivery<W, Req>)
where
    W: Wire,
    Resp: Serialize,
    F: Fn(Req, W::Job) -> Fut,
    Fut: Future<Output = std::result::Result<Resp, HandlerError>>,
{
    let span = d.wire().span(d.job());
    async move {
        let req = d.take_request();
        let job = d.job().clone();
        // A panic is caught here and counts as a failed delivery.
        let result = AssertUnwindSafe(handler(req, job)).catch_unwind().await;
        let sid = W::entry_id(d.job()).clone();
        match result {
            Ok(Ok(resp)) => {
                if let Err(e) = d.respond_in_background(&resp) {
                    tracing::warn!(entry = %sid, error = %format_args!("{e:#}"), "could not record an outcome");
                }
            }
            Ok(Err(HandlerError::Fail(m))) => d.fail_in_background(m),
            Ok(Err(HandlerError::Retry(m))) => {
                tracing::debug!(entry = %sid, reason = %m, "handler asked for a retry");
                d.retry_in_background(Duration::ZERO);
            }
            Ok(Err(HandlerError::RetryAfter(delay, m))) => {
                tracing::debug!(entry = %sid, reason = %m, ?delay, "handler asked for a retry");
                d.retry_in_background(delay);
            }
            Err(panic) => {
                let e = crate::task::panic_message(&*panic);
                tracing::warn!(entry = %sid, error = %format_args!("{e:#}"), "handler panicked; the request is released for redelivery");
                d.retry_in_background(Duration::ZERO);
            }
        }
    }
    .instrument(span)
    .await
}
