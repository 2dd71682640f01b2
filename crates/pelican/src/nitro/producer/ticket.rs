//! A submission's pending answer.

use super::table::{Inner, Resolution};
use crate::error::{Error, ErrorKind, Result};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

/// The pending answer of one request: `.await` it. Dropping it unresolved gives up:
/// the producer stops polling for it and withdraws its entry from the stream.
pub struct Ticket<Resp> {
    inner: Arc<Inner>,
    token: u64,
    id: String,
    rx: oneshot::Receiver<Resolution>,
    done: bool,
    _types: PhantomData<fn() -> Resp>,
}

impl<Resp> Ticket<Resp> {
    pub(super) fn new(
        inner: Arc<Inner>,
        token: u64,
        id: String,
        rx: oneshot::Receiver<Resolution>,
    ) -> Self {
        Ticket {
            inner,
            token,
            id,
            rx,
            done: false,
            _types: PhantomData,
        }
    }

    /// The stream entry id the request got: Nitro's request id. (A request lost with
    /// the stream and submitted again gets a new one.)
    pub fn entry_id(&self) -> &str {
        &self.id
    }
}

impl<Resp: DeserializeOwned> Future for Ticket<Resp> {
    type Output = Result<Resp>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match Pin::new(&mut this.rx).poll(cx) {
            Poll::Ready(r) => {
                this.done = true;
                let r = r
                    .unwrap_or_else(|_| {
                        Err(Error::new(
                            ErrorKind::Shutdown,
                            "the producer was dropped before the request was answered",
                        ))
                    })
                    .and_then(|body| {
                        serde_json::from_slice::<Resp>(&body).map_err(|e| {
                            Error::codec(&format!("decoding the response to entry {}", this.id), e)
                        })
                    });
                Poll::Ready(r)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<Resp> Drop for Ticket<Resp> {
    fn drop(&mut self) {
        if !self.done {
            self.inner.abandon(self.token);
        }
    }
}
