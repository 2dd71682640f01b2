//! The producer: submits typed requests and hands back their typed outcomes.
//!
//! Submissions are batched: whatever is queued while one script call is on the wire
//! goes out in the next call, so a busy producer sends few, large calls and an idle
//! one adds no delay. Outcomes are pushed to the producer's own reply stream and read
//! by one blocking reader on a dedicated connection; a slow sweep looks outcomes up
//! directly in case a reply was missed.

use crate::codec::{Codec, Json};
use crate::config::{validate_request_id, ProducerConfig, QueueConfig};
use crate::entry;
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::outcome::Outcome;
use crate::shared::{ms, now_ms, retry_if_dropped, Backoff, Shared};
use crate::task::TaskSet;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Most requests sent in one script call.
const MAX_BATCH: usize = 256;
/// Most script calls of one producer on the wire at once.
const MAX_BATCHES_IN_FLIGHT: usize = 4;
/// Most times a request that expired before a local waiter's deadline is submitted again.
const MAX_EXPIRY_RESUBMITS: u8 = 3;
/// Time a local waiter must have left for an expired request to be submitted again.
const MIN_TIME_LEFT_MS: u64 = 50;

type Resolution = std::result::Result<Outcome, Error>;

/// Submits requests of type `Req` to a queue and awaits responses of type `Resp`.
///
/// Cheap to share: clone it, or put it in an `Arc`; every clone is the same producer
/// (one reply stream, one set of background tasks). The tasks stop when the last clone
/// is dropped or [`Producer::shutdown`] is called.
pub struct Producer<Req, Resp, C: Codec = Json> {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
    _types: PhantomData<fn(Req) -> (Resp, C)>,
}

/// Held by every clone of a producer; when the last one goes, the background tasks stop
/// and every request still waiting resolves with [`ErrorKind::Shutdown`] at once rather
/// than at its timeout.
struct Owner {
    inner: Arc<Inner>,
    tasks: TaskSet,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.tasks.abort_all();
        self.inner.closed.store(true, Ordering::SeqCst);
        let drained: Vec<Pending> = {
            let mut st = self.inner.state.lock().unwrap();
            st.pending.drain().map(|(_, p)| p).collect()
        };
        for p in drained {
            for (_, w) in p.waiters {
                let _ = w.send(Err(Error::new(
                    ErrorKind::Shutdown,
                    "the producer was dropped before the request was solved",
                )));
            }
        }
    }
}

impl<Req, Resp, C: Codec> Clone for Producer<Req, Resp, C> {
    fn clone(&self) -> Self {
        Producer {
            inner: self.inner.clone(),
            _owner: self._owner.clone(),
            _types: PhantomData,
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    config: ProducerConfig,
    id: String,
    reply_key: String,
    state: Mutex<State>,
    submit_tx: mpsc::UnboundedSender<SubmitJob>,
    cancel_tx: mpsc::UnboundedSender<CancelJob>,
    closed: AtomicBool,
    next_token: AtomicU64,
    sweep_now: AtomicBool,
    last_reply_id: Mutex<String>,
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Pending>,
}

struct Pending {
    waiters: Vec<(u64, oneshot::Sender<Resolution>)>,
    started: Instant,
    deadline_ms: u64,
    indexed: bool,
    /// The stream id, once known (needed to withdraw a request without an index).
    sid: Option<String>,
    /// Kept to submit again if Redis lost the request (restart without persistence).
    body: Arc<Vec<u8>>,
    /// The submission has been acknowledged by Redis.
    queued: bool,
    /// Times this request was submitted again because it expired before a local waiter's
    /// deadline (see `Inner::resubmit_expired`).
    expiry_resubmits: u8,
}

struct SubmitJob {
    rid: String,
    body: Arc<Vec<u8>>,
    deadline_ms: u64,
    indexed: bool,
    ack: Option<oneshot::Sender<Result<Submitted>>>,
}

struct CancelJob {
    rid: String,
    sid: Option<String>,
}

/// How a submission was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Submitted {
    /// A new stream entry was added.
    Queued,
    /// An identical request was already in flight (here or in another producer); this
    /// submission waits for its outcome.
    Joined,
    /// The outcome of an identical request was still cached; no work was queued.
    Cached,
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
        let shared = Shared::connect(&queue).await?;
        let id = ids::random_id();
        let reply_key = shared.keys.reply(&id);
        // Create the reply stream (empty) and read from the id it got: no reply is missed.
        let start_id = create_reply_stream(&shared, &reply_key, config.reply_ttl).await?;
        let (submit_tx, submit_rx) = mpsc::unbounded_channel();
        let (cancel_tx, cancel_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            shared,
            config,
            id,
            reply_key,
            state: Mutex::new(State::default()),
            submit_tx,
            cancel_tx,
            closed: AtomicBool::new(false),
            next_token: AtomicU64::new(1),
            sweep_now: AtomicBool::new(false),
            last_reply_id: Mutex::new(start_id.clone()),
        });
        let tasks = TaskSet::new();
        tasks.spawn(submitter(inner.clone(), submit_rx));
        tasks.spawn(canceller(inner.clone(), cancel_rx));
        tasks.spawn(reply_reader(Arc::downgrade(&inner), start_id));
        tasks.spawn(maintenance(Arc::downgrade(&inner)));
        tracing::debug!(queue = %inner.shared.queue.name, producer = %inner.id, "producer started");
        Ok(Producer {
            _owner: Arc::new(Owner {
                inner: inner.clone(),
                tasks,
            }),
            inner,
            _types: PhantomData,
        })
    }

    /// This producer's id (its reply stream is `<prefix>:{queue}:reply:<id>`).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Submits a request and returns a [`Ticket`] that resolves to its response. The
    /// request id is a hash of the encoded body when dedup is on (identical requests in
    /// flight are solved once), a fresh random id otherwise.
    pub async fn submit(&self, req: &Req) -> Result<Ticket<Resp, C>> {
        let body = self.encode(req)?;
        let rid = if self.inner.config.dedup {
            ids::request_id(&body)
        } else {
            ids::random_id()
        };
        self.submit_body(rid, body).await
    }

    /// Submits a request under a request id of the caller's choosing (1 to 256 bytes, no
    /// control characters). With dedup on, the id is the dedup key: submissions with the
    /// same id share one solution, whatever their bodies.
    pub async fn submit_with_id(&self, id: &str, req: &Req) -> Result<Ticket<Resp, C>> {
        validate_request_id(id)?;
        let body = self.encode(req)?;
        self.submit_body(id.to_string(), body).await
    }

    /// Submits a request and waits for its response.
    pub async fn call(&self, req: &Req) -> Result<Resp> {
        self.submit(req).await?.await
    }

    /// Stops the producer: every request still waiting resolves with
    /// [`ErrorKind::Cancelled`] and is withdrawn from the queue unless another producer
    /// waits for it too; the reply stream is deleted.
    pub async fn shutdown(self) -> Result<()> {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        let drained: Vec<(String, Pending)> = {
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
            cancel_batch(inner, &jobs).await?;
        }
        let _: redis::RedisResult<()> = redis::cmd("DEL")
            .arg(&inner.reply_key)
            .query_async(&mut inner.shared.conn())
            .await;
        Ok(())
    }

    fn encode(&self, req: &Req) -> Result<Vec<u8>> {
        let body = C::encode(req).map_err(|e| Error::codec("encoding the request", e))?;
        let max = self.inner.shared.queue.max_body_bytes;
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

    async fn submit_body(&self, rid: String, body: Vec<u8>) -> Result<Ticket<Resp, C>> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Shutdown, "the producer is shut down"));
        }
        let timeout = inner.config.request_timeout;
        let started = Instant::now();
        let deadline_ms = now_ms() + ms(timeout);
        let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut guard = WaiterGuard {
            inner: inner.clone(),
            rid: rid.clone(),
            token,
            armed: true,
        };
        let body = Arc::new(body);
        let joined_locally = {
            let mut st = inner.state.lock().unwrap();
            match st.pending.get_mut(&rid) {
                Some(p) => {
                    p.waiters.push((token, tx));
                    // The request lives as long as its longest-waiting submitter.
                    p.deadline_ms = p.deadline_ms.max(deadline_ms);
                    true
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
                            body: body.clone(),
                            queued: false,
                            expiry_resubmits: 0,
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
                    ack: Some(ack_tx),
                })
                .map_err(|_| Error::new(ErrorKind::Shutdown, "the producer is shut down"))?;
            let how = ack_rx
                .await
                .map_err(|_| Error::new(ErrorKind::Shutdown, "the producer is shut down"))??;
            match how {
                Submitted::Queued => inner.shared.metrics.submitted(1),
                Submitted::Joined => inner.shared.metrics.joined(1),
                Submitted::Cached => inner.shared.metrics.cached(1),
            }
            how
        };
        tracing::trace!(rid = %rid, ?how, "submitted");
        let ticket = Ticket {
            rid: rid.clone(),
            how,
            rx,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            guard: WaiterGuard {
                inner: inner.clone(),
                rid,
                token,
                armed: true,
            },
            started,
            _types: PhantomData,
        };
        guard.armed = false;
        Ok(ticket)
    }
}

impl Inner {
    /// Hands an outcome to every local waiter of `rid`.
    fn resolve(&self, rid: &str, resolution: Resolution) {
        if matches!(resolution, Ok(Outcome::Expired(_))) && self.resubmit_expired(rid) {
            return;
        }
        let pending = self.state.lock().unwrap().pending.remove(rid);
        let Some(p) = pending else { return };
        let label = match &resolution {
            Ok(o) => o.label(),
            Err(_) => "failed",
        };
        self.shared.metrics.resolved(label, p.started.elapsed());
        let mut waiters = p.waiters;
        let last = waiters.pop();
        for (_, w) in waiters {
            let _ = w.send(resolution.clone());
        }
        if let Some((_, w)) = last {
            let _ = w.send(resolution);
        }
    }

    /// An identical request in flight carries the deadline of whoever submitted it first;
    /// a later submitter with more time (here, or joined from another producer) would get
    /// "expired" although its own deadline has not passed. Such a request is submitted
    /// again with this producer's deadline instead (expiries are not cached, so it starts
    /// afresh, and the other producers' waiters join it). At most a few times, and only
    /// with time left to run it. Returns whether it was submitted again.
    fn resubmit_expired(&self, rid: &str) -> bool {
        let job = {
            let mut st = self.state.lock().unwrap();
            let Some(p) = st.pending.get_mut(rid) else {
                return false;
            };
            if !p.indexed
                || p.expiry_resubmits >= MAX_EXPIRY_RESUBMITS
                || p.deadline_ms < now_ms() + MIN_TIME_LEFT_MS
            {
                return false;
            }
            p.expiry_resubmits += 1;
            p.queued = false;
            SubmitJob {
                rid: rid.to_string(),
                body: p.body.clone(),
                deadline_ms: p.deadline_ms,
                indexed: true,
                ack: None,
            }
        };
        tracing::debug!(
            rid,
            "request expired before this producer's deadline; submitting it again"
        );
        self.submit_tx.send(job).is_ok()
    }

    /// Resolves from a reply-stream pair, if this producer waits on that request.
    fn resolve_raw(&self, rid: &[u8], out: &[u8]) {
        let Ok(rid) = std::str::from_utf8(rid) else {
            return;
        };
        if !self.state.lock().unwrap().pending.contains_key(rid) {
            return;
        }
        match Outcome::decode(out) {
            Some(o) => self.resolve(rid, Ok(o)),
            None => tracing::warn!(rid, "ignoring a malformed reply"),
        }
    }

    /// A waiter gave up (timed out or dropped its ticket). The last one to leave
    /// withdraws the request.
    fn drop_waiter(&self, rid: &str, token: u64) {
        let job = {
            let mut st = self.state.lock().unwrap();
            let Some(p) = st.pending.get_mut(rid) else {
                return;
            };
            p.waiters.retain(|(t, _)| *t != token);
            if !p.waiters.is_empty() {
                return;
            }
            let p = st.pending.remove(rid).expect("present");
            CancelJob {
                rid: rid.to_string(),
                sid: if p.indexed { None } else { p.sid },
            }
        };
        let _ = self.cancel_tx.send(job);
    }
}

/// Removes a waiter when its ticket (or the submit future) is dropped unresolved.
struct WaiterGuard {
    inner: Arc<Inner>,
    rid: String,
    token: u64,
    armed: bool,
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
    rid: String,
    how: Submitted,
    rx: oneshot::Receiver<Resolution>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    guard: WaiterGuard,
    started: Instant,
    _types: PhantomData<fn() -> (Resp, C)>,
}

impl<Resp, C: Codec> Ticket<Resp, C> {
    /// The request id (the dedup key).
    pub fn request_id(&self) -> &str {
        &self.rid
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
                let out = res.and_then(|o| o.into_result(&this.rid)).and_then(|b| {
                    C::decode::<Resp>(&b).map_err(|e| Error::codec("decoding the response", e))
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
                this.guard.inner.drop_waiter(&this.rid, this.guard.token);
                Poll::Ready(Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "request {} got no outcome within {:?}",
                        this.rid, this.guard.inner.config.request_timeout
                    ),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

async fn create_reply_stream(shared: &Shared, key: &str, ttl: Duration) -> Result<String> {
    let (id, _): (String, ()) = redis::pipe()
        .cmd("XADD")
        .arg(key)
        .arg("MAXLEN")
        .arg(0)
        .arg("*")
        .arg("pelican")
        .arg("reply stream created")
        .cmd("PEXPIRE")
        .arg(key)
        .arg(ms(ttl))
        .ignore()
        .cmd("PING")
        .query_async(&mut shared.conn())
        .await
        .map_err(|e| Error::redis("creating the reply stream", e))?;
    Ok(id)
}

async fn submitter(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<SubmitJob>) {
    let limit = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let permit = limit.clone().acquire_owned().await.expect("never closed");
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            submit_batch(&inner, batch).await;
            drop(permit);
        });
    }
}

async fn submit_batch(inner: &Arc<Inner>, batch: Vec<SubmitJob>) {
    let (indexed, plain): (Vec<_>, Vec<_>) = batch.into_iter().partition(|j| j.indexed);
    if !indexed.is_empty() {
        let r = submit_indexed(inner, &indexed).await;
        finish_submits(inner, indexed, r);
    }
    if !plain.is_empty() {
        let r = submit_plain(inner, &plain).await;
        finish_submits(inner, plain, r);
    }
}

/// The per-job answers of a submit call: a stream id, "=" (joined) or an outcome.
type Answers = Result<Vec<Vec<u8>>>;

async fn submit_indexed(inner: &Inner, jobs: &[SubmitJob]) -> Answers {
    let sh = &inner.shared;
    let now = now_ms();
    // The index outlives the deadline by the result ttl (see submit.lua).
    let grace = ms(sh.queue.result_ttl);
    let mut inv = sh.scripts.submit.prepare_invoke();
    inv.key(&sh.keys.stream)
        .key(&sh.keys.req_prefix)
        .key(&sh.keys.reply_prefix)
        .arg(now)
        .arg(&inner.id)
        .arg(grace)
        .arg(&sh.keys.group)
        .arg(grace)
        .arg(sh.queue.reply_maxlen);
    for j in jobs {
        let index_ttl = j.deadline_ms.saturating_sub(now).max(1) + grace;
        inv.arg(&j.rid)
            .arg(j.deadline_ms)
            .arg(index_ttl)
            .arg(j.body.as_slice());
    }
    // Idempotent per rid (a repeat joins the first attempt's request or reads its
    // outcome), so it may be sent again after a dropped connection.
    let inv = &inv;
    let v: Vec<Vec<u8>> =
        retry_if_dropped(move || async move { inv.invoke_async(&mut sh.conn()).await })
            .await
            .map_err(|e| Error::redis("submitting requests", e))?;
    Ok(v)
}

async fn submit_plain(inner: &Inner, jobs: &[SubmitJob]) -> Answers {
    let sh = &inner.shared;
    let now = now_ms();
    let mut pipe = redis::pipe();
    for j in jobs {
        pipe.cmd("XADD")
            .arg(&sh.keys.stream)
            .arg("*")
            .arg("rid")
            .arg(&j.rid)
            .arg("from")
            .arg(&inner.id)
            .arg("deadline")
            .arg(j.deadline_ms)
            .arg("at")
            .arg(now)
            .arg("index")
            .arg("0")
            .arg("body")
            .arg(j.body.as_slice());
    }
    let ids: Vec<String> = pipe
        .query_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("submitting requests", e))?;
    Ok(ids
        .into_iter()
        .map(|id| format!("+{id}").into_bytes())
        .collect())
}

fn finish_submits(inner: &Inner, jobs: Vec<SubmitJob>, answers: Answers) {
    match answers {
        Ok(answers) => {
            for (mut job, a) in jobs.into_iter().zip(answers) {
                let how = match a.first() {
                    Some(b'+') => {
                        let sid = String::from_utf8_lossy(&a[1..]).into_owned();
                        let mut st = inner.state.lock().unwrap();
                        if let Some(p) = st.pending.get_mut(&job.rid) {
                            p.sid = Some(sid);
                            p.queued = true;
                        }
                        Submitted::Queued
                    }
                    Some(b'=') => {
                        if let Some(p) = inner.state.lock().unwrap().pending.get_mut(&job.rid) {
                            p.queued = true;
                        }
                        Submitted::Joined
                    }
                    _ => match Outcome::decode(&a) {
                        Some(o) => {
                            inner.resolve(&job.rid, Ok(o));
                            Submitted::Cached
                        }
                        None => {
                            let e = Error::new(
                                ErrorKind::Redis,
                                format!(
                                    "unexpected answer from the submit script: {:?}",
                                    String::from_utf8_lossy(&a)
                                ),
                            );
                            inner.resolve(&job.rid, Err(e.clone()));
                            if let Some(ack) = job.ack.take() {
                                let _ = ack.send(Err(e));
                            }
                            continue;
                        }
                    },
                };
                if let Some(ack) = job.ack.take() {
                    let _ = ack.send(Ok(how));
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), n = jobs.len(), "submission failed");
            for mut job in jobs {
                inner.resolve(&job.rid, Err(e.clone()));
                if let Some(ack) = job.ack.take() {
                    let _ = ack.send(Err(e.clone()));
                }
            }
        }
    }
}

async fn canceller(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<CancelJob>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        if let Err(e) = cancel_batch(&inner, &batch).await {
            tracing::warn!(error = %format_args!("{e:#}"), "withdrawing abandoned requests failed; they run and their outcomes are cached");
        }
    }
}

async fn cancel_batch(inner: &Inner, jobs: &[CancelJob]) -> Result<()> {
    let sh = &inner.shared;
    let mut inv = sh.scripts.cancel.prepare_invoke();
    inv.key(&sh.keys.stream)
        .key(&sh.keys.req_prefix)
        .arg(&sh.keys.group)
        .arg(&inner.id);
    for j in jobs {
        inv.arg(&j.rid).arg(j.sid.as_deref().unwrap_or(""));
    }
    // Idempotent: a waiter already removed or a request already withdrawn is skipped.
    let inv = &inv;
    let _: i64 = retry_if_dropped(move || async move { inv.invoke_async(&mut sh.conn()).await })
        .await
        .map_err(|e| Error::redis("withdrawing requests", e))?;
    Ok(())
}

/// Reads the reply stream on a dedicated connection and resolves waiters. On a broken
/// connection it reconnects with backoff and asks for a sweep.
async fn reply_reader(weak: std::sync::Weak<Inner>, mut last_id: String) {
    let mut backoff = Backoff::new();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let block = inner.config.block;
        let key = inner.reply_key.clone();
        let conn = inner.shared.blocking_connection(block).await;
        drop(inner);
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %format_args!("{e:#}"), "reply reader cannot connect; retrying");
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        loop {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(ms(block))
                .arg("STREAMS")
                .arg(&key)
                .arg(&last_id);
            let r = conn.query(&cmd).await;
            let Some(inner) = weak.upgrade() else { return };
            match r {
                Ok(v) => {
                    backoff.reset();
                    let entries = entry::read_into_entries(v);
                    for e in &entries {
                        last_id.clone_from(&e.id);
                        // One entry carries one or more (rid, outcome) pairs. Pairs for
                        // requests this producer does not wait on are ignored (late,
                        // duplicate or forged).
                        for (rid, out) in &e.fields {
                            inner.resolve_raw(rid, out);
                        }
                    }
                    if !entries.is_empty() {
                        inner.last_reply_id.lock().unwrap().clone_from(&last_id);
                        drop(inner);
                        // Let the woken callers run first: a request submitted in answer
                        // to this outcome goes out before the next read.
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reply reader lost its connection; reconnecting");
                    inner.sweep_now.store(true, Ordering::SeqCst);
                    tokio::time::sleep(backoff.next()).await;
                    break;
                }
            }
        }
    }
}

/// Once a second: trim the reply stream, keep it alive, sweep for missed outcomes and
/// run the janitor when due.
async fn maintenance(weak: std::sync::Weak<Inner>) {
    let tick = Duration::from_millis(250);
    let mut trimmed_to = String::new();
    let mut last_refresh = Instant::now();
    let mut last_sweep = Instant::now();
    let mut last_janitor = Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = weak.upgrade() else { return };
        let sh = &inner.shared;
        let mut conn = sh.conn();
        let last = inner.last_reply_id.lock().unwrap().clone();
        if last != trimmed_to {
            let r: redis::RedisResult<i64> = redis::cmd("XTRIM")
                .arg(&inner.reply_key)
                .arg("MINID")
                .arg(&last)
                .query_async(&mut conn)
                .await;
            if r.is_ok() {
                trimmed_to = last;
            }
        }
        // A forced sweep follows a broken connection: Redis may have restarted and lost
        // the reply stream, so check it now rather than at the next refresh.
        let forced = inner.sweep_now.swap(false, Ordering::SeqCst);
        if forced || last_refresh.elapsed() >= inner.config.reply_ttl / 3 {
            let r: redis::RedisResult<i64> = redis::cmd("PEXPIRE")
                .arg(&inner.reply_key)
                .arg(ms(inner.config.reply_ttl))
                .query_async(&mut conn)
                .await;
            match r {
                Ok(1) => last_refresh = Instant::now(),
                Ok(_) => {
                    tracing::warn!(producer = %inner.id, "reply stream was gone (Redis restarted or flushed?); recreating it");
                    if create_reply_stream(sh, &inner.reply_key, inner.config.reply_ttl)
                        .await
                        .is_ok()
                    {
                        last_refresh = Instant::now();
                        inner.sweep_now.store(true, Ordering::SeqCst);
                    }
                }
                Err(_) => {}
            }
        }
        let forced = forced || inner.sweep_now.swap(false, Ordering::SeqCst);
        if forced || last_sweep.elapsed() >= inner.config.sweep_interval {
            let min_age = if forced {
                Duration::ZERO
            } else {
                inner.config.sweep_interval
            };
            match sweep(&inner, min_age).await {
                Ok(()) => last_sweep = Instant::now(),
                Err(e) => {
                    tracing::debug!(error = %format_args!("{e:#}"), "sweep failed; will retry");
                    inner.sweep_now.store(true, Ordering::SeqCst);
                }
            }
        }
        if last_janitor.elapsed() >= sh.queue.janitor_interval {
            last_janitor = Instant::now();
            if let Err(e) = sh.janitor(&inner.id).await {
                tracing::debug!(error = %format_args!("{e:#}"), "janitor failed");
            }
        }
    }
}

/// Looks up the outcomes of requests waiting at least `min_age` directly. Finds outcomes
/// whose push was missed; resubmits indexed requests that Redis no longer knows (lost
/// in a restart without persistence).
async fn sweep(inner: &Arc<Inner>, min_age: Duration) -> Result<()> {
    let due: Vec<(String, bool, bool)> = {
        let st = inner.state.lock().unwrap();
        st.pending
            .iter()
            // Without an index no outcome is stored: nothing to look up.
            .filter(|(_, p)| p.indexed && p.queued && p.started.elapsed() >= min_age)
            .map(|(rid, p)| (rid.clone(), p.indexed, p.deadline_ms > now_ms()))
            .collect()
    };
    let sh = &inner.shared;
    for chunk in due.chunks(500) {
        let keys: Vec<String> = chunk.iter().map(|(rid, _, _)| sh.keys.req(rid)).collect();
        let vals: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("sweeping for outcomes", e))?;
        for ((rid, indexed, alive), v) in chunk.iter().zip(vals) {
            match v {
                Some(v) => {
                    if let Some(o) = Outcome::decode(&v) {
                        inner.resolve(rid, Ok(o));
                    } else if *indexed
                        && !String::from_utf8_lossy(&v).contains(&format!(";{};", inner.id))
                        && *alive
                    {
                        resubmit(inner, rid);
                    }
                }
                None if *indexed && *alive => resubmit(inner, rid),
                None => {}
            }
        }
    }
    Ok(())
}

fn resubmit(inner: &Inner, rid: &str) {
    let job = {
        let st = inner.state.lock().unwrap();
        let Some(p) = st.pending.get(rid) else { return };
        SubmitJob {
            rid: rid.to_string(),
            body: p.body.clone(),
            deadline_ms: p.deadline_ms,
            indexed: p.indexed,
            ack: None,
        }
    };
    tracing::info!(
        rid,
        "request unknown to Redis (lost in a restart?); submitting it again"
    );
    let _ = inner.submit_tx.send(job);
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Producer<u8, u8>>();
    is_send::<Ticket<u8>>();
    let _ = entry::array;
}
