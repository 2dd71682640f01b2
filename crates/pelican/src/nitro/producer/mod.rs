//! The Nitro-format producer: writes requests the way Nitro's producers do, so that
//! Nitro's validation workers (or pelican's [`Consumer`](crate::nitro::Consumer)) serve
//! them, and awaits their answer keys.
//!
//! `table.rs` holds the outstanding requests, `ticket.rs` a caller's pending answer,
//! `poll.rs` the one task that polls, withdraws, trims and checks.

mod poll;
mod table;
mod ticket;

pub use ticket::Ticket;

pub(crate) use poll::TIMEOUT_TEXT;

use super::config::{ProducerConfig, StreamConfig};
use super::link::Link;
use crate::clock::ms;
use crate::error::{Error, ErrorKind, Result};
use crate::task::TaskSet;
use serde::{de::DeserializeOwned, Serialize};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use table::{Inner, Table, Waiting};
use tokio::sync::{mpsc, oneshot, Notify};

/// Submits requests of type `Req` to a Nitro stream and awaits responses of type `Resp`,
/// in Nitro's wire format: `XADD <stream> * msg <json>`, the entry id is the request id,
/// the answer is the key `result-key:<stream>.<id>` (JSON) or
/// `error-key:<stream>.<id>.error` (text; it wins when both exist).
///
/// Unlike Nitro's producer it polls every outstanding request in one pipelined round
/// trip every `poll_interval` (10 ms, not 5 s) without blocking submissions, times
/// requests out by the Redis clock, writes with `NOMKSTREAM` and re-creates a lost
/// stream with its group, submits again requests lost with the stream, and withdraws
/// only its own timed-out requests (Nitro's producers reap the stream's oldest). Cheap
/// to clone; the background task stops when the last clone is dropped.
pub struct Producer<Req, Resp> {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
    _types: PhantomData<fn(Req) -> Resp>,
}

struct Owner {
    inner: Arc<Inner>,
    tasks: TaskSet,
}

impl Drop for Owner {
    /// Dropped without `shutdown`: the waiting calls fail at once; their entries stay in
    /// the stream (withdrawing needs Redis, and Drop does not wait), are answered by the
    /// consumers, and the answers expire unread.
    fn drop(&mut self) {
        self.tasks.abort_all();
        self.inner.fail_all(|| {
            Error::new(
                ErrorKind::Shutdown,
                "the producer was dropped before the request was answered",
            )
        });
    }
}

impl<Req, Resp> Clone for Producer<Req, Resp> {
    fn clone(&self) -> Self {
        Producer {
            inner: self.inner.clone(),
            _owner: self._owner.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp> Producer<Req, Resp>
where
    Req: Serialize,
    Resp: DeserializeOwned,
{
    /// Connects and creates the stream and its group as Nitro's producers do
    /// (`XGROUP CREATE <s> <s> $ MKSTREAM`; an existing group is fine).
    pub async fn connect(stream: StreamConfig, config: ProducerConfig) -> Result<Self> {
        config.validate()?;
        let link = Link::connect(&stream).await?;
        link.create_group("$").await?;
        let (withdraw_tx, withdraw_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            link,
            config,
            table: Mutex::new(Table::default()),
            wake: Notify::new(),
            withdraw_tx,
            closed: AtomicBool::new(false),
            next_token: AtomicU64::new(1),
        });
        let tasks = TaskSet::new();
        let weak = Arc::downgrade(&inner);
        tasks.on_failure(Box::new(move |e| {
            if let Some(inner) = weak.upgrade() {
                inner.fail_all(|| e.clone());
            }
        }));
        tasks.spawn("nitro poller", poll::run(inner.clone(), withdraw_rx));
        Ok(Producer {
            _owner: Arc::new(Owner {
                inner: inner.clone(),
                tasks,
            }),
            inner,
            _types: PhantomData,
        })
    }

    /// Submits a request; the [`Ticket`] resolves to its response, a
    /// [`ErrorKind::Remote`] error with the error key's text, or a
    /// [`ErrorKind::Timeout`] error after `request_timeout`.
    pub async fn submit(&self, req: &Req) -> Result<Ticket<Resp>> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Shutdown, "the producer is shut down"));
        }
        if let Some(e) = self._owner.tasks.failure() {
            return Err(e);
        }
        let body = serde_json::to_vec(req).map_err(|e| Error::codec("encoding the request", e))?;
        let started = Instant::now();
        let id = xadd(inner, &body).await?;
        let deadline_ms = poll_id_ms(&id) + ms(inner.config.request_timeout);
        let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inner.table.lock().unwrap().waiting.insert(
            token,
            Waiting {
                id: id.clone(),
                deadline_ms,
                body: Arc::new(body),
                tx,
                started,
                resubmits: 0,
            },
        );
        inner.wake.notify_one();
        inner.metrics().submitted(1);
        Ok(Ticket::new(inner.clone(), token, id, rx))
    }

    /// Submits a request and waits for its response.
    pub async fn call(&self, req: &Req) -> Result<Resp> {
        self.submit(req).await?.await
    }

    /// Requests still waiting for an answer.
    pub fn outstanding(&self) -> usize {
        self.inner.table.lock().unwrap().waiting.len()
    }

    /// Stops: every request still waiting fails with [`ErrorKind::Cancelled`] and is
    /// withdrawn from the stream.
    pub async fn shutdown(self) -> Result<()> {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        let ids = inner.fail_all(|| {
            Error::new(
                ErrorKind::Cancelled,
                "the producer was shut down before the request was answered",
            )
        });
        self._owner.tasks.abort_all();
        if !ids.is_empty() {
            poll::withdraw(inner, &ids).await?;
        }
        match self._owner.tasks.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn poll_id_ms(id: &str) -> u64 {
    poll::id_ms(id).unwrap_or_else(crate::clock::now_ms)
}

/// `XADD <s> NOMKSTREAM * msg <body>`. A missing stream (deleted, flushed, lost in a
/// restart) is made again with its group, and every outstanding request is checked at
/// the next poll: the old entries went with the stream.
async fn xadd(inner: &Inner, body: &[u8]) -> Result<String> {
    let link = &inner.link;
    for _ in 0..2 {
        let id: Option<String> = redis::cmd("XADD")
            .arg(&link.keys.stream)
            .arg("NOMKSTREAM")
            .arg("*")
            .arg("msg")
            .arg(body)
            .query_async(&mut link.conn())
            .await
            .map_err(|e| Error::redis("adding a request to the stream", e))?;
        if let Some(id) = id {
            return Ok(id);
        }
        tracing::warn!(stream = %link.keys.stream, "the stream is gone; creating it and its group again");
        inner.table.lock().unwrap().loss_suspected = true;
        link.create_group("0").await?;
    }
    Err(Error::new(
        ErrorKind::Redis,
        "the stream disappeared again right after it was created",
    ))
}
