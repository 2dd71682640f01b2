//! The producer: submits typed requests and hands back their typed outcomes.
//!
//! Submissions are batched: whatever is queued while one script call is on the wire
//! goes out in the next call, so a busy producer sends few, large calls and an idle
//! one adds no delay. Outcomes are pushed to the producer's own reply stream and read
//! by one blocking reader on a dedicated connection; a slow sweep looks outcomes up
//! directly in case a reply was missed.

mod answers;
mod cancel;
mod lean;
mod maintenance;
mod options;
mod pending;
mod replies;
mod state;
mod submit;
mod ticket;
mod watch;

pub use options::CallOptions;
pub use pending::Submitted;
pub use ticket::Ticket;

use crate::clock::{ms, now_ms};
use crate::codec::{Codec, Json, Raw};
use crate::config::{ProducerConfig, QueueConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::shared::Shared;
use crate::task::TaskSet;
use bytes::Bytes;
use pending::{CancelJob, Pending, State, SubmitJob};
use serde::{de::DeserializeOwned, Serialize};
use state::Inner;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ticket::WaiterGuard;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// Submits requests of type `Req` to a queue and awaits responses of type `Resp`.
///
/// Cheap to share: clone it, or put it in an `Arc`; every clone is the same producer
/// (one reply stream per partition, one set of background tasks per partition). The tasks
/// stop when the last clone is dropped or [`Producer::shutdown`] is called.
pub struct Producer<Req, Resp, C: Codec = Json> {
    /// One per partition of the queue; a request goes to `parts[partition_of(rid)]`.
    parts: Arc<Vec<Owner>>,
    _types: PhantomData<fn(Req) -> (Resp, C)>,
}

/// The producer's part for one partition, held by every clone of the producer; when the
/// last one goes, the background tasks stop and every request still waiting resolves with
/// [`ErrorKind::Shutdown`] at once rather than at its timeout.
struct Owner {
    inner: Arc<Inner>,
    tasks: TaskSet,
    /// The id its reply stream is read from, until the reply reader starts.
    start_id: String,
}

impl Owner {
    /// Starts the producer's part for one partition: its reply stream and its tasks
    /// (submitter, canceller, maintenance; the reply reader, which may serve several
    /// partitions, is started by [`Owner::read_replies`]).
    async fn start(shared: Arc<Shared>, config: ProducerConfig, id: String) -> Result<Owner> {
        let reply_key = shared.keys.reply(&id);
        // Create the reply stream (empty) and read from the id it got: no reply is missed.
        let start_id = replies::create_reply_stream(&shared, &reply_key, config.reply_ttl).await?;
        let (submit_tx, submit_rx) = mpsc::unbounded_channel();
        let (cancel_tx, cancel_rx) = mpsc::unbounded_channel();
        let (answer_tx, answer_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            shared,
            config,
            id,
            reply_key,
            state: Mutex::new(State::default()),
            submit_tx,
            cancel_tx,
            answer_tx,
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            next_token: AtomicU64::new(1),
            sweep_now: AtomicBool::new(false),
            last_reply_id: Mutex::new(start_id.clone()),
            body_conns: Mutex::new(Vec::new()),
            no_lean_bodies: AtomicBool::new(false),
        });
        let tasks = TaskSet::new();
        // A panicking task fails every waiting request, and every later call, at once.
        let weak = Arc::downgrade(&inner);
        tasks.on_failure(Box::new(move |e| {
            if let Some(inner) = weak.upgrade() {
                *inner.failure.lock().unwrap() = Some(e.clone());
                inner.fail_all(e.clone());
            }
        }));
        tasks.spawn("submitter", submit::submitter(inner.clone(), submit_rx));
        tasks.spawn("canceller", cancel::canceller(inner.clone(), cancel_rx));
        tasks.spawn("answer fetcher", answers::fetcher(inner.clone(), answer_rx));
        tasks.spawn(
            "maintenance",
            maintenance::maintenance(Arc::downgrade(&inner)),
        );
        Ok(Owner {
            inner,
            tasks,
            start_id,
        })
    }

    /// Starts one reply reader for the reply streams of `group` (partitions on one node;
    /// the first owns the task). A panic in it fails every partition of the group.
    fn read_replies(group: &[&Owner]) {
        let inners: Vec<Arc<Inner>> = group.iter().map(|o| o.inner.clone()).collect();
        let weaks: Vec<_> = inners.iter().map(Arc::downgrade).collect();
        group[0].tasks.on_failure(Box::new(move |e| {
            for w in &weaks {
                if let Some(inner) = w.upgrade() {
                    *inner.failure.lock().unwrap() = Some(e.clone());
                    inner.fail_all(e.clone());
                }
            }
        }));
        let parts = group
            .iter()
            .map(|o| (Arc::downgrade(&o.inner), o.start_id.clone()))
            .collect();
        group[0]
            .tasks
            .spawn("reply reader", replies::reply_reader(parts));
    }

    /// Fails this part's waiting requests with "cancelled", withdraws them and deletes
    /// the reply stream.
    async fn shutdown(&self) -> Result<()> {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        let drained: Vec<(Arc<str>, Pending)> = {
            let mut st = inner.state.lock().unwrap();
            st.pending.drain().collect()
        };
        let mut jobs = Vec::new();
        for (rid, p) in drained {
            for (_, w) in p.waiters {
                let _ = w.send(Err(Error::new(
                    ErrorKind::Cancelled,
                    format!("request {rid}: the producer was shut down"),
                )));
            }
            let sid = if p.indexed { None } else { p.sid };
            jobs.push(CancelJob { rid, sid });
        }
        if !jobs.is_empty() {
            cancel::cancel_batch(inner, &jobs).await?;
        }
        let _: redis::RedisResult<()> = redis::cmd("DEL")
            .arg(&inner.reply_key)
            .query_async(&mut inner.shared.conn())
            .await;
        match self.tasks.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.tasks.abort_all();
        self.inner.fail_all(Error::new(
            ErrorKind::Shutdown,
            "the producer was dropped before the request was solved",
        ));
    }
}

impl<Req, Resp, C: Codec> Clone for Producer<Req, Resp, C> {
    fn clone(&self) -> Self {
        Producer {
            parts: self.parts.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp, C> Producer<Req, Resp, C>
where
    Req: Serialize,
    Resp: DeserializeOwned,
    C: Codec,
{
    /// Connects to the queue and starts the producer's background tasks (reply reader,
    /// submitter, maintenance). Fails with a [`ErrorKind::Config`] error for a bad URL or
    /// name and a [`ErrorKind::Redis`] error when Redis cannot be reached.
    pub async fn connect(queue: QueueConfig, config: ProducerConfig) -> Result<Self> {
        config.validate()?;
        let id = ids::random_id();
        let mut parts = Vec::new();
        for shared in Shared::connect(&queue).await? {
            parts.push(Owner::start(shared, config.clone(), id.clone()).await?);
        }
        // One reply reader for all partitions on one node (one XREAD names every reply
        // stream); on a cluster one per partition, as XREAD's streams must share a slot.
        if parts[0].inner.shared.endpoint.is_single_node() {
            Owner::read_replies(&parts.iter().collect::<Vec<_>>());
        } else {
            for part in &parts {
                Owner::read_replies(&[part]);
            }
        }
        tracing::debug!(queue = %queue.name, producer = %id, partitions = parts.len(), "producer started");
        Ok(Producer {
            parts: Arc::new(parts),
            _types: PhantomData,
        })
    }

    /// The part of the producer that serves request `rid`'s partition.
    fn part(&self, rid: &str) -> &Arc<Inner> {
        let p = self.parts[0].inner.shared.queue.partition_of(rid) as usize;
        &self.parts[p].inner
    }

    /// This producer's id (its reply stream is `<prefix>:{queue}:reply:<id>`).
    pub fn id(&self) -> &str {
        &self.parts[0].inner.id
    }

    /// Submits a request and returns a [`Ticket`] that resolves to its response. The
    /// request id is a hash of the encoded body when dedup is on (identical requests in
    /// flight are solved once), a fresh random id otherwise.
    pub async fn submit(&self, req: &Req) -> Result<Ticket<Resp, C>> {
        let body = self.encode(req)?;
        self.submit_encoded(body).await
    }

    async fn submit_encoded(&self, body: Vec<u8>) -> Result<Ticket<Resp, C>> {
        self.submit_encoded_with(body, CallOptions::new()).await
    }

    /// Submits `body` with these options: under their request id, else the body's hash
    /// (dedup on) or a random id; with their timeout, else the producer's.
    async fn submit_encoded_with(
        &self,
        body: Vec<u8>,
        options: CallOptions,
    ) -> Result<Ticket<Resp, C>> {
        let inner = &self.parts[0].inner;
        let timeout = options.timeout.unwrap_or(inner.config.request_timeout);
        let rid = match options.request_id {
            Some(id) => id,
            None if inner.config.dedup => ids::request_id(&body),
            None => ids::random_id(),
        };
        self.submit_body(rid, body, timeout).await
    }

    /// Submits a request under a request id of the caller's choosing (1 to 256 bytes, no
    /// control characters). With dedup on, the id is the dedup key: submissions with the
    /// same id share one solution, whatever their bodies.
    pub async fn submit_with_id(&self, id: &str, req: &Req) -> Result<Ticket<Resp, C>> {
        self.submit_with(req, CallOptions::new().with_request_id(id))
            .await
    }

    /// [`Producer::submit`] with options of this call: its timeout, its request id
    /// (see [`CallOptions`]).
    pub async fn submit_with(&self, req: &Req, options: CallOptions) -> Result<Ticket<Resp, C>> {
        options.validate()?;
        let body = self.encode(req)?;
        self.submit_encoded_with(body, options).await
    }

    /// [`Producer::call`] with options of this call (see [`CallOptions`]).
    pub async fn call_with(&self, req: &Req, options: CallOptions) -> Result<Resp> {
        self.in_call_span(async { self.submit_with(req, options).await?.await })
            .await
    }

    /// Submits a request and waits for its response, in a span `pelican.call` (whose
    /// trace the worker's handler span continues, with the `otel` feature).
    pub async fn call(&self, req: &Req) -> Result<Resp> {
        self.in_call_span(async { self.submit(req).await?.await })
            .await
    }

    /// Runs a call in its span `pelican.call`.
    async fn in_call_span(
        &self,
        call: impl std::future::Future<Output = Result<Resp>>,
    ) -> Result<Resp> {
        let span =
            tracing::info_span!("pelican.call", queue = %self.parts[0].inner.shared.queue.name);
        call.instrument(span).await
    }

    /// Stops the producer: every request still waiting resolves with
    /// [`ErrorKind::Cancelled`] and is withdrawn from the queue unless another producer
    /// waits for it too; the reply stream is deleted. Returns an
    /// [`ErrorKind::Internal`] error if one of the producer's tasks had panicked.
    pub async fn shutdown(self) -> Result<()> {
        let mut result = Ok(());
        for part in self.parts.iter() {
            let r = part.shutdown().await;
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    fn encode(&self, req: &Req) -> Result<Vec<u8>> {
        let body = C::encode(req).map_err(|e| Error::codec("encoding the request", e))?;
        self.within_limit(body)
    }

    /// `body`, unless it is larger than the queue's `max_body_bytes`.
    fn within_limit(&self, body: Vec<u8>) -> Result<Vec<u8>> {
        let max = self.parts[0].inner.shared.queue.max_body_bytes;
        if body.len() > max {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "the request body is {} bytes; max_body_bytes is {max} (raise it in QueueConfig on every producer and consumer, or send a reference to the data instead)",
                    body.len()
                ),
            ));
        }
        Ok(body)
    }

    async fn submit_body(
        &self,
        rid: String,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Ticket<Resp, C>> {
        // Shared from here on (the waiters' table, the submitter, the ticket): not copied.
        let rid: Arc<str> = rid.into();
        let inner = self.part(&rid);
        if inner.closed.load(Ordering::SeqCst) {
            return Err(inner.closed_error());
        }
        let started = Instant::now();
        let deadline_ms = now_ms() + ms(timeout);
        let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut guard = WaiterGuard::new(inner.clone(), rid.clone(), token);
        let body = Arc::new(body);
        let tp = crate::trace::current();
        let joined_locally = {
            let mut st = inner.state.lock().unwrap();
            match st.pending.get_mut(&rid) {
                Some(p) => {
                    p.waiters.push((token, tx));
                    // The request lives as long as its longest-waiting submitter.
                    p.deadline_ms = p.deadline_ms.max(deadline_ms);
                    if p.body.is_some() {
                        true
                    } else {
                        // Only watchers wait (they have no body, and may have found it
                        // unknown): this submission goes to Redis, which joins it to
                        // the request if it is in flight.
                        p.body = Some(body.clone());
                        false
                    }
                }
                None => {
                    st.pending.insert(
                        rid.clone(),
                        Pending {
                            waiters: vec![(token, tx)],
                            started,
                            deadline_ms,
                            indexed: inner.config.dedup,
                            sid: None,
                            body: Some(body.clone()),
                            keep: false,
                            queued: false,
                            expiry_resubmits: 0,
                            tp: tp.clone(),
                            lost_answers: 0,
                            answer_fetching: false,
                        },
                    );
                    false
                }
            }
        };
        let how = if joined_locally {
            inner.shared.metrics.joined(1);
            Submitted::Joined
        } else {
            let (ack_tx, ack_rx) = oneshot::channel();
            inner
                .submit_tx
                .send(SubmitJob {
                    rid: rid.clone(),
                    body,
                    deadline_ms,
                    indexed: inner.config.dedup,
                    tp,
                    ack: Some(ack_tx),
                })
                .map_err(|_| inner.closed_error())?;
            let how = ack_rx.await.map_err(|_| inner.closed_error())??;
            match how {
                Submitted::Queued => inner.shared.metrics.submitted(1),
                Submitted::Joined => inner.shared.metrics.joined(1),
                Submitted::Cached => inner.shared.metrics.cached(1),
            }
            how
        };
        tracing::trace!(rid = %rid, ?how, "submitted");
        let ticket = Ticket::new(inner.clone(), rid, token, how, rx, started, timeout);
        guard.disarm();
        Ok(ticket)
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Producer<u8, u8>>();
    is_send::<Ticket<u8>>();
}

impl<Resp: DeserializeOwned> Producer<Bytes, Resp, Raw> {
    /// [`Producer::submit`] for a body that is bytes already, taken over rather than
    /// encoded: a `Bytes` made from a `Vec<u8>` and not shared (cloned) since becomes the
    /// request body without a copy (a shared one is copied once). For large bodies.
    pub async fn submit_bytes(&self, body: Bytes) -> Result<Ticket<Resp, Raw>> {
        let body = self.within_limit(Vec::from(body))?;
        self.submit_encoded(body).await
    }

    /// [`Producer::call`] for a body that is bytes already (see
    /// [`Producer::submit_bytes`]).
    pub async fn call_bytes(&self, body: Bytes) -> Result<Resp> {
        self.in_call_span(async { self.submit_bytes(body).await?.await })
            .await
    }

    /// [`Producer::submit_bytes`] with options of this call (see [`CallOptions`]).
    pub async fn submit_bytes_with(
        &self,
        body: Bytes,
        options: CallOptions,
    ) -> Result<Ticket<Resp, Raw>> {
        options.validate()?;
        let body = self.within_limit(Vec::from(body))?;
        self.submit_encoded_with(body, options).await
    }

    /// [`Producer::call_bytes`] with options of this call (see [`CallOptions`]).
    pub async fn call_bytes_with(&self, body: Bytes, options: CallOptions) -> Result<Resp> {
        self.in_call_span(async { self.submit_bytes_with(body, options).await?.await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use pelican_testkit::RedisServer;
    use std::time::Duration;

    /// A task of the producer that panics fails the calls waiting on it at once (they
    /// used to wait for their timeout, or forever for a submission), and every call after.
    #[tokio::test]
    async fn a_panicking_task_fails_waiting_and_later_calls() {
        let server = RedisServer::start();
        let q = QueueConfig::new(server.url(), "supervised");
        let p = Producer::<u64, u64>::connect(
            q,
            ProducerConfig::default().with_request_timeout(Duration::from_secs(60)),
        )
        .await
        .unwrap();
        // Nobody serves the queue: this call waits.
        let waiting = p.submit(&1).await.unwrap();
        p.parts[0]
            .tasks
            .spawn("reply reader", async { panic!("a bug in the reader") });
        let err = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting call fails at once")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
        assert!(err.message().contains("a bug in the reader"), "{err}");
        let later = p.call(&2).await.unwrap_err();
        assert_eq!(later.kind(), ErrorKind::Internal, "{later}");
        assert_eq!(p.shutdown().await.unwrap_err().kind(), ErrorKind::Internal);
    }
}
