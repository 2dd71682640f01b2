//! The Nitro-format consumer: serves a stream that Nitro's producers (or pelican's
//! [`Producer`](crate::nitro::Producer)) write, alongside Nitro's own consumers.
//!
//! Tasks: one reader (`reader.rs`: XREADGROUP BLOCK on a connection of its own, taking
//! over idle entries between reads, dedup), one writer (`writer.rs`: answers batched into
//! one script call, hand-backs into another), one maintenance task (`maintenance.rs`:
//! heartbeats, removal of gone consumers). `lease.rs` keeps what the consumer holds;
//! `delivery.rs` is one entry in a handler's hands.

mod delivery;
mod lease;
mod maintenance;
mod reader;
mod state;
mod writer;

pub use delivery::Job;

use super::config::{ConsumerConfig, StreamConfig};
use super::link::Link;
use crate::clock::ms;
use crate::conn::retry::retry_idempotent;
use crate::consumer::{HandlerError, Stopper};
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::task::TaskSet;
use delivery::Delivery;
use futures_util::FutureExt;
use lease::Leases;
use serde::{de::DeserializeOwned, Serialize};
use state::ConsumerState;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use writer::{Kind, WriteJob, WriterHandle, WriterTask};

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
    st: Arc<ConsumerState>,
    rx: mpsc::Receiver<Delivery<Req>>,
    tasks: TaskSet,
    reader_exited: CancellationToken,
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
    pub async fn connect(stream: StreamConfig, config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        let link = Link::connect(&stream).await?;
        let name = config.name.clone().unwrap_or_else(ids::consumer_name);
        let leases = Arc::new(Leases::default());
        let stop = CancellationToken::new();
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let writer = Arc::new(WriterHandle::new(
            writer_tx,
            leases.clone(),
            config.idletime,
        ));
        let (tx, rx) = mpsc::channel(config.prefetch);
        let st = Arc::new(ConsumerState {
            slots: Arc::new(Semaphore::new(config.prefetch)),
            link,
            config,
            name,
            leases,
            writer,
            stop,
        });
        st.link.register(&st.name).await;
        let tasks = TaskSet::new();
        // Not aborted with the others: dropped without `shutdown`, the consumer still
        // writes the answers and hand-backs it was given.
        tasks.spawn_detached(
            "nitro answer writer",
            writer::run(
                WriterTask {
                    link: st.link.clone(),
                    name: st.name.clone(),
                    idletime: st.config.idletime,
                    response_ttl: st.config.response_ttl,
                    cache_ttl: st.config.dedup_cache_ttl,
                    leases: st.leases.clone(),
                    stop: st.stop.clone(),
                },
                writer_rx,
            ),
        );
        let reader_exited = CancellationToken::new();
        tasks.spawn(
            "nitro reader",
            reader::run::<Req>(st.clone(), tx, reader_exited.clone().drop_guard()),
        );
        tasks.spawn("nitro heartbeat", maintenance::run(st.clone()));
        tracing::debug!(stream = %st.link.keys.stream, consumer = %st.name, "nitro consumer started");
        Ok(Consumer {
            st,
            rx,
            tasks,
            reader_exited,
            _types: PhantomData,
        })
    }

    /// This consumer's name in the group.
    pub fn name(&self) -> &str {
        &self.st.name
    }

    /// A handle that stops [`Consumer::serve`].
    pub fn stopper(&self) -> Stopper {
        Stopper(self.st.stop.clone())
    }

    async fn next(&mut self) -> Result<Option<Delivery<Req>>> {
        if let Some(e) = self.tasks.failure() {
            return Err(e);
        }
        tokio::select! {
            d = self.rx.recv() => match d {
                Some(d) => Ok(Some(d)),
                None if self.st.stop.is_cancelled() => Ok(None),
                None => Err(match tokio::time::timeout(Duration::from_secs(1), self.tasks.failed()).await {
                    Ok(e) => e,
                    Err(_) => Error::new(ErrorKind::Internal, "the nitro consumer's reader stopped without being asked to"),
                }),
            },
            _ = self.st.stop.cancelled() => Ok(None),
            e = self.tasks.failed() => Err(e),
        }
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
    pub async fn serve<F, Fut>(mut self, concurrency: usize, handler: F) -> Result<()>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let limit = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        let mut failure = None;
        loop {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => p.expect("never closed"),
                _ = self.st.stop.cancelled() => break,
                e = self.tasks.failed() => {
                    failure = Some(e);
                    break;
                }
            };
            let mut d = match self.next().await {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let handler = handler.clone();
            let metrics = self.st.link.metrics.clone();
            running.spawn(async move {
                let req = d.take_request();
                let job = d.job().clone();
                let result = AssertUnwindSafe(handler(req, job)).catch_unwind().await;
                drop(permit);
                metrics.handler_duration(d.age());
                let id = d.job().entry_id().to_string();
                let r = match result {
                    Ok(Ok(resp)) => match serde_json::to_vec(&resp) {
                        Ok(body) => d.answer(Kind::Result, body).await.map(|_| ()),
                        Err(e) => {
                            let text = format!("pelican: the handler's response cannot be encoded as JSON: {e}");
                            d.answer(Kind::Error, text.into_bytes()).await.map(|_| ())
                        }
                    },
                    Ok(Err(HandlerError::Fail(m))) => {
                        d.answer(Kind::Error, m.into_bytes()).await.map(|_| ())
                    }
                    Ok(Err(HandlerError::RetryAfter(delay, m))) => {
                        tracing::debug!(entry = %id, reason = %m, ?delay, "handler asked for a retry");
                        d.release(delay).await
                    }
                    Ok(Err(other)) => {
                        tracing::debug!(entry = %id, reason = %other, "handler asked for a retry");
                        d.release(Duration::ZERO).await
                    }
                    Err(panic) => {
                        let e = crate::task::panic_message(&*panic);
                        tracing::warn!(entry = %id, error = %e, "handler panicked; the entry is handed back");
                        d.release(Duration::ZERO).await
                    }
                };
                if let Err(e) = r {
                    tracing::warn!(entry = %id, error = %format_args!("{e:#}"), "could not write an answer");
                }
            });
            while running.try_join_next().is_some() {}
        }
        let deadline = tokio::time::sleep(self.st.config.shutdown_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = running.join_next() => if r.is_none() { break },
                _ = &mut deadline => {
                    tracing::warn!(n = running.len(), "shutdown timeout: cancelling the handlers still running and handing their entries back");
                    self.st.leases.cancel_all();
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

    /// Stops gracefully: reads nothing new (waiting for the read under way, at most
    /// `block`), waits up to `shutdown_timeout` for the answers in hand to be written,
    /// then hands back everything it still holds so that any consumer (Nitro's too)
    /// takes it at once (`XCLAIM ... IDLE <idletime> JUSTID`: not counted as a retry),
    /// and leaves the group if it holds nothing.
    pub async fn shutdown(mut self) -> Result<()> {
        let st = self.st.clone();
        st.stop.cancel();
        self.rx.close();
        while let Ok(d) = self.rx.try_recv() {
            drop(d);
        }
        let read_limit = st.config.block + st.link.config.command_timeout;
        if tokio::time::timeout(read_limit, self.reader_exited.cancelled())
            .await
            .is_err()
        {
            tracing::warn!("the reader did not stop in time");
        }
        while let Ok(d) = self.rx.try_recv() {
            drop(d);
        }
        let all = tokio::time::timeout(
            st.config.shutdown_timeout,
            st.slots
                .clone()
                .acquire_many_owned(st.config.prefetch as u32),
        )
        .await;
        if all.is_err() {
            tracing::warn!("shutdown timeout: handing back the entries still in hand");
            st.leases.cancel_all();
        }
        let (tx, rx) = oneshot::channel();
        st.writer.send(WriteJob::Flush(tx));
        let _ = rx.await;
        self.tasks.abort_all();
        let link = &st.link;
        let k = &link.keys;
        let mut inv = link.scripts.release.prepare_invoke();
        inv.key(&k.stream)
            .arg(k.group())
            .arg(&st.name)
            .arg(ms(st.config.idletime))
            .arg("1");
        let inv = &inv;
        let released: i64 =
            retry_idempotent(move || async move { inv.invoke_async(&mut link.conn()).await })
                .await
                .map_err(|e| Error::redis("handing entries back on shutdown", e))?;
        tracing::debug!(consumer = %st.name, released, "nitro consumer stopped");
        match self.tasks.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
