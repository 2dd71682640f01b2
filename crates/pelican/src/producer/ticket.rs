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
/// (and withdraws the request if nobody else waits for it).
pub struct Ticket<Resp, C: Codec = Json> {
    how: Submitted,
    rx: oneshot::Receiver<Resolution>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    guard: WaiterGuard,
    started: Instant,
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
    ) -> Self {
        let timeout = inner.config.request_timeout;
        Ticket {
            guard: WaiterGuard::new(inner, rid, token),
            how,
            rx,
            sleep: Box::pin(tokio::time::sleep(
                timeout.saturating_sub(started.elapsed()),
            )),
            started,
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
                        this.guard.rid, this.guard.inner.config.request_timeout
                    ),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
