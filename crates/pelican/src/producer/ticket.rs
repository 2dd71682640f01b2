//! A submission's pending response.

use super::pending::{Resolution, Submitted};
use super::state::Inner;
use crate::codec::{Codec, Json};
use crate::error::{Error, ErrorKind, Result};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Removes a waiter when its ticket (or the submit future) is dropped unresolved.
pub(super) struct WaiterGuard {
    inner: Arc<Inner>,
    rid: Arc<str>,
    token: u64,
    armed: bool,
}

impl WaiterGuard {
    pub(super) fn new(inner: Arc<Inner>, rid: Arc<str>, token: u64) -> Self {
        WaiterGuard {
            inner,
            rid,
            token,
            armed: true,
        }
    }

    /// The waiter is accounted for elsewhere: dropping the guard does nothing.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        if self.armed {
            self.inner.drop_waiter(&self.rid, self.token);
        }
    }
}

/// The pending response of one submission: `.await` it. Dropping it gives up waiting
/// (and withdraws the request if nobody else waits for it); [`Ticket::detach`] stops
/// waiting and leaves the request to run.
pub struct Ticket<Resp, C: Codec = Json> {
    how: Submitted,
    rx: oneshot::Receiver<Resolution>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    guard: WaiterGuard,
    started: Instant,
    /// How long the caller waits, from `started`.
    timeout: Duration,
    _types: PhantomData<fn() -> (Resp, C)>,
}

impl<Resp, C: Codec> Ticket<Resp, C> {
    pub(super) fn new(
        inner: Arc<Inner>,
        rid: Arc<str>,
        token: u64,
        how: Submitted,
        rx: oneshot::Receiver<Resolution>,
        started: Instant,
        timeout: Duration,
    ) -> Self {
        Ticket {
            guard: WaiterGuard::new(inner, rid, token),
            how,
            rx,
            sleep: Box::pin(tokio::time::sleep(
                timeout.saturating_sub(started.elapsed()),
            )),
            started,
            timeout,
            _types: PhantomData,
        }
    }

    /// The request id (the dedup key).
    pub fn request_id(&self) -> &str {
        &self.guard.rid
    }

    /// How the submission was taken: queued, joined or answered from the cache.
    pub fn submitted(&self) -> Submitted {
        self.how
    }

    /// Time since submission.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops waiting without withdrawing the request: it stays queued or in work until
    /// it is solved or its deadline (the call's timeout) passes, and this producer never
    /// withdraws it, even when it shuts down. With dedup on its outcome is recorded for
    /// `result_ttl`, where [`crate::Producer::watch`] (of this producer or another, in
    /// this process or the next) finds it by its request id. Returns the request id.
    pub fn detach(mut self) -> String {
        self.guard.armed = false;
        self.guard
            .inner
            .detach_waiter(&self.guard.rid, self.guard.token);
        self.guard.rid.to_string()
    }
}

impl<Resp: DeserializeOwned, C: Codec> Future for Ticket<Resp, C> {
    type Output = Result<Resp>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match Pin::new(&mut this.rx).poll(cx) {
            Poll::Ready(Ok(res)) => {
                this.guard.armed = false;
                let out = res
                    .and_then(|o| o.into_result(&this.guard.rid))
                    .and_then(|b| {
                        C::decode_owned::<Resp>(b)
                            .map_err(|e| Error::codec("decoding the response", e))
                    });
                return Poll::Ready(out);
            }
            Poll::Ready(Err(_)) => {
                this.guard.armed = false;
                return Poll::Ready(Err(Error::new(
                    ErrorKind::Shutdown,
                    "the producer was dropped before the request was solved",
                )));
            }
            Poll::Pending => {}
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                // guard stays armed and is dropped with the ticket; do it now so the
                // request is withdrawn even if the ticket is kept around.
                this.guard.armed = false;
                this.guard
                    .inner
                    .drop_waiter(&this.guard.rid, this.guard.token);
                Poll::Ready(Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "request {} got no outcome within {:?}",
                        this.guard.rid, this.timeout
                    ),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
