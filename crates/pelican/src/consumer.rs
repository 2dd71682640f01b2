//! The consumer: reads requests in batches, keeps leases on what it holds, takes over
//! idle work of dead consumers, dead-letters poison and writes outcomes in batches.
//!
//! Tasks: one reader (XREADGROUP BLOCK on a dedicated connection, and the reclaim scan
//! between reads), one writer (batches completions and releases into one script call
//! each), one maintenance task (lease renewal, janitor).

use crate::codec::{Codec, Json};
use crate::config::{ConsumerConfig, QueueConfig};
use crate::delivery::{Delivery, HandlerError, Job};
use crate::entry::{self, parse_entries, RawEntry, Request};
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::outcome::Outcome;
use crate::shared::{evalsha, ms, now_ms, retry_if_dropped, Backoff, OwnConn, Shared};
use crate::task::TaskSet;
use futures_util::FutureExt;
use redis::Value;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Most entries read or written in one call.
const MAX_BATCH: usize = 256;

/// Reads requests of type `Req` from a queue and answers them with `Resp`.
pub struct Consumer<Req, Resp, C: Codec = Json> {
    inner: Arc<CInner>,
    rx: mpsc::Receiver<Delivery<Req, Resp, C>>,
    tasks: TaskSet,
}

pub(crate) struct CInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) config: ConsumerConfig,
    pub(crate) name: String,
    /// Entries this consumer holds, by stream id.
    held: Mutex<HashMap<String, Held>>,
    /// Held across a lease renewal and across a release: a renewal (`XCLAIM JUSTID`,
    /// idle back to 0) that was decided before an entry was released must not land after
    /// the release (`XCLAIM IDLE`), or the released entry waits a whole claim_idle.
    lease_gate: tokio::sync::Mutex<()>,
    slots: Arc<Semaphore>,
    writer_tx: mpsc::UnboundedSender<WriteJob>,
    stop: CancellationToken,
}

struct Held {
    lease: CancellationToken,
    lost: bool,
    /// Its outcome or release has been handed to the writer: the entry may stop being
    /// pending before the writer reports back, and that is not a lost lease.
    finishing: bool,
}

pub(crate) enum WriteJob {
    Complete(Completion),
    Release(Release),
    Flush(oneshot::Sender<()>),
}

/// An outcome to record for one entry.
pub(crate) struct Completion {
    pub(crate) sid: String,
    pub(crate) rid: String,
    pub(crate) from: String,
    pub(crate) indexed: bool,
    pub(crate) label: &'static str,
    pub(crate) outcome: Vec<u8>,
    pub(crate) ack: Option<oneshot::Sender<Result<bool>>>,
}

/// An entry to hand back, reclaimable once its idle time reaches claim_idle.
pub(crate) struct Release {
    pub(crate) sid: String,
    pub(crate) idle_ms: u64,
    pub(crate) ack: Option<oneshot::Sender<Result<()>>>,
}

impl CInner {
    pub(crate) fn send(&self, job: WriteJob) {
        let sid = match &job {
            WriteJob::Complete(c) => Some(&c.sid),
            WriteJob::Release(r) => Some(&r.sid),
            WriteJob::Flush(_) => None,
        };
        if let Some(sid) = sid {
            if let Some(h) = self.held.lock().unwrap().get_mut(sid) {
                h.finishing = true;
            }
        }
        if let Err(mpsc::error::SendError(job)) = self.writer_tx.send(job) {
            // The writer is gone (consumer dropped): the entry stays pending and is
            // reclaimed after claim_idle.
            match job {
                WriteJob::Complete(Completion { ack: Some(a), .. }) => {
                    let _ = a.send(Err(Error::new(
                        ErrorKind::Shutdown,
                        "the consumer is shut down",
                    )));
                }
                WriteJob::Release(Release { ack: Some(a), .. }) => {
                    let _ = a.send(Err(Error::new(
                        ErrorKind::Shutdown,
                        "the consumer is shut down",
                    )));
                }
                _ => {}
            }
        }
    }
}

/// Stops a consumer's [`Consumer::serve`] loop from anywhere (a signal handler, a test).
#[derive(Clone, Debug)]
pub struct Stopper(CancellationToken);

impl Stopper {
    /// Asks the consumer to stop: it reads nothing new, finishes or releases what it holds.
    pub fn stop(&self) {
        self.0.cancel();
    }
}

impl<Req, Resp, C> Consumer<Req, Resp, C>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    /// Connects and starts reading. Fails with [`ErrorKind::Config`] for bad settings and
    /// [`ErrorKind::Redis`] when Redis cannot be reached.
    pub async fn connect(queue: QueueConfig, config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        let shared = Shared::connect(&queue).await?;
        let name = config.name.clone().unwrap_or_else(ids::consumer_name);
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(config.prefetch);
        let inner = Arc::new(CInner {
            shared,
            slots: Arc::new(Semaphore::new(config.prefetch)),
            config,
            name,
            held: Mutex::new(HashMap::new()),
            lease_gate: tokio::sync::Mutex::new(()),
            writer_tx,
            stop: CancellationToken::new(),
        });
        // Register the consumer now: Redis 7.0 creates it only at its first delivery, and
        // an operator should see an idle worker in `pelican stats`.
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&inner.shared.keys.stream)
            .arg(&inner.shared.keys.group)
            .arg(&inner.name)
            .query_async(&mut inner.shared.conn())
            .await;
        let tasks = TaskSet::new();
        tasks.spawn(writer(inner.clone(), writer_rx));
        tasks.spawn(reader::<Req, Resp, C>(inner.clone(), tx));
        tasks.spawn(maintenance(Arc::downgrade(&inner)));
        tracing::debug!(queue = %inner.shared.queue.name, consumer = %inner.name, "consumer started");
        Ok(Consumer { inner, rx, tasks })
    }

    /// This consumer's name in the group.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A handle that stops [`Consumer::serve`].
    pub fn stopper(&self) -> Stopper {
        Stopper(self.inner.stop.clone())
    }

    /// The next delivery; `None` once the consumer is stopping.
    pub async fn next(&mut self) -> Option<Delivery<Req, Resp, C>> {
        tokio::select! {
            d = self.rx.recv() => d,
            _ = self.inner.stop.cancelled() => None,
        }
    }

    /// Runs `handler` on every delivery, at most `concurrency` at a time, until
    /// [`Stopper::stop`] is called; then shuts down gracefully (see
    /// [`Consumer::shutdown`]). A handler's `Ok` is the response; `Err` says whether to
    /// fail for good or retry; a handler that panics counts as a failed delivery (the
    /// request is released for redelivery) and never stops the consumer.
    pub async fn serve<F, Fut>(mut self, concurrency: usize, handler: F) -> Result<()>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let limit = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        loop {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => p.expect("never closed"),
                _ = self.inner.stop.cancelled() => break,
            };
            let Some(mut d) = self.next().await else {
                break;
            };
            let handler = handler.clone();
            running.spawn(async move {
                let req = d.take_request();
                let job = d.job().clone();
                // A panic is caught here and counts as a failed delivery; aborting this
                // task (shutdown timeout) drops the handler with it.
                let result = AssertUnwindSafe(handler(req, job)).catch_unwind().await;
                // The handler slot is free once the handler is done; writing the outcome
                // holds only the delivery's prefetch slot.
                drop(permit);
                let rid = d.job().request_id().to_string();
                let r = match result {
                    Ok(Ok(resp)) => d.respond(&resp).await.map(|_| ()),
                    Ok(Err(HandlerError::Fail(m))) => d.fail(m).await.map(|_| ()),
                    Ok(Err(HandlerError::Retry(m))) => {
                        tracing::debug!(rid = %rid, reason = %m, "handler asked for a retry");
                        d.retry().await
                    }
                    Ok(Err(HandlerError::RetryAfter(delay, m))) => {
                        tracing::debug!(rid = %rid, reason = %m, ?delay, "handler asked for a retry");
                        d.retry_after(delay).await
                    }
                    Err(panic) => {
                        let e = panic_message(&panic);
                        tracing::warn!(rid = %rid, error = %e, "handler panicked; the request is released for redelivery");
                        d.retry().await
                    }
                };
                if let Err(e) = r {
                    tracing::warn!(rid = %rid, error = %format_args!("{e:#}"), "could not record an outcome");
                }
            });
            // reap finished handlers so the set does not grow
            while running.try_join_next().is_some() {}
        }
        let deadline = tokio::time::sleep(self.inner.config.shutdown_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = running.join_next() => if r.is_none() { break },
                _ = &mut deadline => {
                    tracing::warn!(n = running.len(), "shutdown timeout: cancelling handlers still running and releasing their requests");
                    self.inner.cancel_all();
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                    break;
                }
            }
        }
        self.shutdown().await
    }

    /// Stops gracefully: reads nothing new, waits up to `shutdown_timeout` for the
    /// deliveries in hand to be answered, then releases whatever is left so another
    /// consumer can take it at once, and writes every pending outcome. It leaves the
    /// group if it owns nothing then; otherwise the janitor removes it once the released
    /// entries have been taken over and `consumer_gc_after` has passed.
    pub async fn shutdown(mut self) -> Result<()> {
        self.inner.stop.cancel();
        // Deliveries read ahead but not handed out are released.
        self.rx.close();
        while let Ok(d) = self.rx.try_recv() {
            drop(d);
        }
        let prefetch = self.inner.config.prefetch as u32;
        let all = tokio::time::timeout(
            self.inner.config.shutdown_timeout,
            self.inner.slots.clone().acquire_many_owned(prefetch),
        )
        .await;
        if all.is_err() {
            tracing::warn!("shutdown timeout: releasing deliveries still in hand");
            self.inner.cancel_all();
        }
        let (tx, rx) = oneshot::channel();
        self.inner.send(WriteJob::Flush(tx));
        let _ = rx.await;
        self.tasks.abort_all();
        // Release everything still owned (including entries a cancelled read may have
        // delivered unseen), then leave the group if nothing is left.
        let sh = &self.inner.shared;
        let mut release = sh.scripts.release.prepare_invoke();
        release
            .key(&sh.keys.stream)
            .arg(&sh.keys.group)
            .arg(&self.inner.name)
            .arg(ms(self.inner.config.claim_idle));
        // Idempotent: releasing an entry twice backdates it twice.
        let release = &release;
        let released: i64 =
            retry_if_dropped(move || async move { release.invoke_async(&mut sh.conn()).await })
                .await
                .map_err(|e| Error::redis("releasing entries on shutdown", e))?;
        if released == 0 {
            let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
                .arg("DELCONSUMER")
                .arg(&sh.keys.stream)
                .arg(&sh.keys.group)
                .arg(&self.inner.name)
                .query_async(&mut sh.conn())
                .await;
        }
        tracing::debug!(consumer = %self.inner.name, released, "consumer stopped");
        Ok(())
    }
}

/// The message of a caught panic, for the log.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

impl CInner {
    fn cancel_all(&self) {
        for h in self.held.lock().unwrap().values() {
            h.lease.cancel();
        }
    }
}

/// Reads new entries (and reclaims idle ones when due) into the delivery channel,
/// never holding more than `prefetch` deliveries.
async fn reader<Req, Resp, C>(inner: Arc<CInner>, tx: mpsc::Sender<Delivery<Req, Resp, C>>)
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    let cfg = inner.config.clone();
    let sh = inner.shared.clone();
    let mut conn = None;
    let mut backoff = Backoff::new();
    let mut next_reclaim = Instant::now();
    let mut cursor = "-".to_string();
    loop {
        let first = tokio::select! {
            p = inner.slots.clone().acquire_owned() => p.expect("never closed"),
            _ = inner.stop.cancelled() => return,
        };
        // Every free slot, up to a batch, in one bundle (one semaphore operation, not one
        // per slot); a permit is split off per delivery and the rest returned at once.
        let mut bundle = first;
        let extra = inner.slots.available_permits().min(MAX_BATCH - 1);
        if extra > 0 {
            if let Ok(more) = inner.slots.clone().try_acquire_many_owned(extra as u32) {
                bundle.merge(more);
            }
        }
        let mut permits = Hand(Some(bundle));
        if cfg.reclaim && Instant::now() >= next_reclaim {
            // Nothing in hand: it may take a request for its last delivery, alone.
            let idle = permits.len() + inner.slots.available_permits() >= cfg.prefetch;
            match reclaim(&inner, &cursor, permits.len(), idle).await {
                Ok((next, claimed, solo, waiting_alone)) => {
                    if next == "-" {
                        next_reclaim = Instant::now() + cfg.reclaim_interval();
                    }
                    cursor = next;
                    if !claimed.is_empty() {
                        sh.metrics.redelivered(claimed.len() as u64);
                    }
                    for (e, n) in claimed {
                        let alone = solo.as_deref() == Some(e.id.as_str());
                        // Its last delivery runs alone (see reclaim.lua): it takes every
                        // slot, so nothing else is read until it is answered.
                        let p = if alone {
                            permits.take_all()
                        } else {
                            permits.take_one()
                        }
                        .expect("claimed at most the free slots");
                        deliver(&inner, &tx, e, n, p, alone).await;
                    }
                    if waiting_alone && solo.is_none() && !idle {
                        // A request waits for its last delivery, which only a consumer
                        // with nothing in hand may take: become one. Claiming it first
                        // and draining after would let a crash caused by the work in
                        // hand use up that last delivery. Nothing new is read meanwhile;
                        // then the scan starts over.
                        let missing = cfg.prefetch.saturating_sub(permits.len());
                        tokio::select! {
                            all = inner.slots.clone().acquire_many_owned(missing as u32) => drop(all),
                            _ = inner.stop.cancelled() => return,
                        }
                        cursor = "-".to_string();
                        next_reclaim = Instant::now();
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "reclaim failed");
                    next_reclaim =
                        Instant::now() + cfg.reclaim_interval().min(Duration::from_secs(1));
                }
            }
            if permits.is_empty() {
                continue;
            }
        }
        if conn.is_none() {
            match sh.blocking_connection(cfg.block).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "consumer cannot connect; retrying");
                    drop(permits);
                    wait_or_stop(&inner, backoff.next()).await;
                    continue;
                }
            }
        }
        let block = if cfg.reclaim {
            next_reclaim
                .saturating_duration_since(Instant::now())
                .min(cfg.block)
                .max(Duration::from_millis(1))
        } else {
            cfg.block
        };
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&sh.keys.group)
            .arg(&inner.name)
            .arg("COUNT")
            .arg(permits.len())
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS")
            .arg(&sh.keys.stream)
            .arg(">");
        let read = conn.as_mut().expect("connected").query(&cmd).await;
        match read {
            Ok(v) => {
                backoff.reset();
                let entries = entry::read_into_entries(v);
                if entries.is_empty() && cfg.reclaim {
                    // Idle for a whole block: look for released work now. A retry, a
                    // dropped delivery or a shutdown makes entries reclaimable at once,
                    // and waiting for the reclaim interval (claim_idle / 2) would leave
                    // them lying there while this consumer has nothing to do.
                    next_reclaim = Instant::now();
                }
                for e in entries {
                    let p = permits.take_one().expect("read at most the free slots");
                    deliver(&inner, &tx, e, 1, p, false).await;
                }
            }
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the consumer group is gone (Redis restarted or the stream was deleted); creating it again");
                drop(permits);
                if let Err(e) = sh.ensure_group().await {
                    tracing::warn!(error = %format_args!("{e:#}"), "cannot create the consumer group");
                    wait_or_stop(&inner, backoff.next()).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "read failed; reconnecting");
                conn = None;
                drop(permits);
                wait_or_stop(&inner, backoff.next()).await;
            }
        }
    }
}

/// The prefetch slots a reader holds for one read: one permit bundle.
struct Hand(Option<OwnedSemaphorePermit>);

impl Hand {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One slot, for one delivery.
    fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        let p = self.0.as_mut()?;
        if p.num_permits() > 1 {
            p.split(1)
        } else {
            self.0.take()
        }
    }

    /// Every slot left.
    fn take_all(&mut self) -> Option<OwnedSemaphorePermit> {
        self.0.take()
    }
}

async fn wait_or_stop(inner: &CInner, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = inner.stop.cancelled() => {}
    }
}

/// The next cursor, the entries taken over with their delivery counts, the id of the one
/// taken for its last delivery (which must run alone), and whether an entry was left
/// waiting for its last delivery.
type Reclaimed = (String, Vec<(RawEntry, u32)>, Option<String>, bool);

/// One reclaim call. `idle`: the consumer holds nothing, so it may take an entry for
/// its last delivery.
async fn reclaim(inner: &CInner, cursor: &str, count: usize, idle: bool) -> Result<Reclaimed> {
    let sh = &inner.shared;
    let cfg = &inner.config;
    let v: Value = sh
        .scripts
        .reclaim
        .key(&sh.keys.stream)
        .key(&sh.keys.dead)
        .key(&sh.keys.req_prefix)
        .key(&sh.keys.reply_prefix)
        .arg(&sh.keys.group)
        .arg(&inner.name)
        .arg(ms(cfg.claim_idle))
        .arg(cursor)
        .arg(count)
        .arg(cfg.max_deliveries)
        .arg(now_ms())
        .arg(ms(sh.queue.result_ttl))
        .arg(sh.queue.reply_maxlen)
        .arg(sh.queue.dead_maxlen)
        .arg(sh.queue.max_body_bytes)
        .arg(if idle { "1" } else { "0" })
        .invoke_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("reclaiming idle entries", e))?;
    let parts = entry::array(&v);
    let next = parts
        .first()
        .and_then(entry::string)
        .unwrap_or_else(|| "-".into());
    let claimed = parts.get(1).map(parse_entries).unwrap_or_default();
    let counts: HashMap<String, u32> = parts
        .get(2)
        .map(entry::array)
        .unwrap_or(&[])
        .chunks(2)
        .filter_map(|c| Some((entry::string(c.first()?)?, entry::int(c.get(1)?)? as u32)))
        .collect();
    let dead = parts.get(3).and_then(entry::int).unwrap_or(0);
    let solo = parts
        .get(4)
        .and_then(entry::string)
        .filter(|s| !s.is_empty());
    if dead > 0 {
        tracing::warn!(
            n = dead,
            "dead-lettered entries that reached max_deliveries"
        );
        sh.metrics.dead_lettered(dead as u64);
    }
    let claimed = claimed
        .into_iter()
        .map(|e| {
            let n = counts.get(&e.id).copied().unwrap_or(2);
            (e, n)
        })
        .collect();
    let waiting_alone = parts.get(5).and_then(entry::int).unwrap_or(0) > 0;
    Ok((next, claimed, solo, waiting_alone))
}

/// Turns one entry into a delivery, or dead-letters it, or answers it "expired".
/// `alone`: its last delivery; it is handed out only once every other delivery in hand
/// has been answered, and holds every slot until it is answered itself.
async fn deliver<Req, Resp, C>(
    inner: &Arc<CInner>,
    tx: &mpsc::Sender<Delivery<Req, Resp, C>>,
    e: RawEntry,
    deliveries: u32,
    mut permit: OwnedSemaphorePermit,
    alone: bool,
) where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    let sid = e.id.clone();
    let req = match Request::from_entry(e, inner.shared.queue.max_body_bytes) {
        Ok(r) => r,
        Err(reason) => return reject(inner, &sid, &reason, deliveries).await,
    };
    if req.deadline_ms < now_ms() {
        inner.send(WriteJob::Complete(Completion {
            sid: req.id,
            rid: req.rid,
            from: req.from,
            indexed: req.indexed,
            label: "expired",
            outcome: Outcome::Expired("deadline passed before a consumer started it".into())
                .encode(),
            ack: None,
        }));
        return;
    }
    let value = match C::decode::<Req>(&req.body) {
        Ok(v) => v,
        Err(err) => {
            return reject(inner, &sid, &format!("undecodable body: {err}"), deliveries).await
        }
    };
    let lease = CancellationToken::new();
    inner.held.lock().unwrap().insert(
        sid.clone(),
        Held {
            lease: lease.clone(),
            lost: false,
            finishing: false,
        },
    );
    if alone {
        // Held (so its lease is renewed) while the work in hand drains.
        let missing = inner.config.prefetch.saturating_sub(permit.num_permits());
        if missing > 0 {
            tokio::select! {
                rest = inner.slots.clone().acquire_many_owned(missing as u32) => {
                    permit.merge(rest.expect("never closed"));
                }
                _ = inner.stop.cancelled() => {}
            }
        }
    }
    let d = Delivery {
        inner: inner.clone(),
        req: Some(value),
        job: Job {
            sid,
            rid: req.rid,
            from: req.from,
            indexed: req.indexed,
            deliveries,
            deadline_ms: req.deadline_ms,
            submitted_ms: req.submitted_ms,
            lease,
        },
        permit: Some(permit),
        answered: false,
        received: Instant::now(),
        _types: PhantomData,
    };
    if let Err(mpsc::error::SendError(d)) = tx.send(d).await {
        // Nobody takes deliveries any more (stopping): dropping it releases it.
        drop(d);
    }
}

async fn reject(inner: &CInner, sid: &str, reason: &str, deliveries: u32) {
    let sh = &inner.shared;
    tracing::warn!(entry = sid, reason, "dead-lettering a malformed entry");
    let r: redis::RedisResult<i64> = sh
        .scripts
        .reject
        .key(&sh.keys.stream)
        .key(&sh.keys.dead)
        .key(&sh.keys.req_prefix)
        .key(&sh.keys.reply_prefix)
        .arg(&sh.keys.group)
        .arg(&inner.name)
        .arg(sid)
        .arg(reason)
        .arg(deliveries)
        .arg(now_ms())
        .arg(ms(sh.queue.result_ttl))
        .arg(sh.queue.reply_maxlen)
        .arg(sh.queue.dead_maxlen)
        .arg(sh.queue.max_body_bytes)
        .invoke_async(&mut sh.conn())
        .await;
    match r {
        Ok(1) => sh.metrics.dead_lettered(1),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, entry = sid, "could not dead-letter; it will be reclaimed and tried again")
        }
    }
}

/// Writes outcomes and releases in batches: whatever queued up while the previous call
/// was on the wire goes in the next one.
async fn writer(inner: Arc<CInner>, mut rx: mpsc::UnboundedReceiver<WriteJob>) {
    let mut backoff = Backoff::new();
    // The writer's own connection: one call at a time, off the shared connection.
    let mut conn: Option<OwnConn> = None;
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let mut completes: Vec<Completion> = Vec::new();
        let mut releases: Vec<Release> = Vec::new();
        let mut flushes = Vec::new();
        for j in jobs {
            match j {
                WriteJob::Complete(c) => completes.push(c),
                WriteJob::Release(r) => releases.push(r),
                WriteJob::Flush(tx) => flushes.push(tx),
            }
        }
        if !completes.is_empty() {
            // Retry while the lease could still be ours; after that another consumer
            // has taken the entry over and our outcome would be dropped anyway.
            let give_up = Instant::now() + inner.config.claim_idle;
            let result = loop {
                match write_completions(&inner, &mut conn, &completes).await {
                    Ok(r) => break Ok(r),
                    Err(e) if Instant::now() < give_up && !inner.stop.is_cancelled() => {
                        tracing::warn!(error = %format_args!("{e:#}"), "writing outcomes failed; retrying");
                        tokio::time::sleep(backoff.next()).await;
                    }
                    Err(e) => break Err(e),
                }
            };
            backoff.reset();
            let metrics = &inner.shared.metrics;
            let mut held = inner.held.lock().unwrap();
            for (i, c) in completes.into_iter().enumerate() {
                held.remove(&c.sid);
                let r = match &result {
                    Ok(flags) => {
                        let recorded = flags.get(i).copied().unwrap_or(false);
                        if recorded {
                            metrics.completed(c.label, 1);
                        } else {
                            metrics.duplicate_dropped(1);
                        }
                        Ok(recorded)
                    }
                    Err(e) => Err(e.clone()),
                };
                if let Some(a) = c.ack {
                    let _ = a.send(r);
                }
            }
        }
        if !releases.is_empty() {
            let mut by_idle: HashMap<u64, Vec<String>> = HashMap::new();
            for r in &releases {
                by_idle.entry(r.idle_ms).or_default().push(r.sid.clone());
            }
            let mut result = Ok(());
            for (idle, sids) in by_idle {
                if let Err(e) = release(&inner, &mut conn, idle, &sids).await {
                    tracing::warn!(error = %format_args!("{e:#}"), "releasing entries failed; they are reclaimed after claim_idle");
                    result = Err(e);
                }
            }
            let mut held = inner.held.lock().unwrap();
            for r in releases {
                held.remove(&r.sid);
                if let Some(a) = r.ack {
                    let _ = a.send(result.clone());
                }
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

async fn write_completions(
    inner: &CInner,
    conn: &mut Option<OwnConn>,
    jobs: &[Completion],
) -> Result<Vec<bool>> {
    let sh = &inner.shared;
    let k = &sh.keys;
    let mut cmd = evalsha(
        &sh.scripts.complete,
        &[&k.stream, &k.req_prefix, &k.reply_prefix],
    );
    cmd.arg(&k.group)
        .arg(ms(sh.queue.result_ttl))
        .arg(sh.queue.reply_maxlen)
        .arg(now_ms());
    for c in jobs {
        cmd.arg(&c.sid)
            .arg(&c.rid)
            .arg(&c.from)
            .arg(if c.indexed { "1" } else { "0" })
            .arg(c.outcome.as_slice());
    }
    let v = eval_own(inner, conn, &sh.scripts.complete, &cmd)
        .await
        .map_err(|e| Error::redis("writing outcomes", e))?;
    Ok(entry::array(&v)
        .iter()
        .map(|f| entry::int(f) == Some(1))
        .collect())
}

async fn release(
    inner: &CInner,
    conn: &mut Option<OwnConn>,
    idle_ms: u64,
    sids: &[String],
) -> Result<()> {
    let sh = &inner.shared;
    let _gate = inner.lease_gate.lock().await;
    let mut cmd = evalsha(&sh.scripts.release, &[&sh.keys.stream]);
    cmd.arg(&sh.keys.group).arg(&inner.name).arg(idle_ms);
    for s in sids {
        cmd.arg(s);
    }
    eval_own(inner, conn, &sh.scripts.release, &cmd)
        .await
        .map_err(|e| Error::redis("releasing entries", e))?;
    Ok(())
}

/// Runs a script call on the writer's own connection, opening it when needed; a
/// connection that failed (other than with an error reply) is dropped, and the next
/// call opens a new one.
async fn eval_own(
    inner: &CInner,
    conn: &mut Option<OwnConn>,
    script: &redis::Script,
    cmd: &redis::Cmd,
) -> redis::RedisResult<Value> {
    let sh = &inner.shared;
    if conn.is_none() {
        match sh.own_connection(sh.queue.command_timeout).await {
            Ok(c) => *conn = Some(c),
            // The client library's error as it was: an ACL denial stays one (not
            // retryable), a refused connection stays an I/O error.
            Err(e) => {
                return Err(e
                    .redis_source()
                    .cloned()
                    .unwrap_or_else(|| std::io::Error::other(format!("{e:#}")).into()))
            }
        }
    }
    let c = conn.as_mut().expect("just opened");
    let r = c.eval(&mut sh.conn(), script, cmd).await;
    if let Err(e) = &r {
        if e.code().is_none() {
            *conn = None;
        }
    }
    r
}

/// Renews leases every `lease_interval` and runs the janitor when due.
async fn maintenance(weak: std::sync::Weak<CInner>) {
    let mut last_janitor = Instant::now() - Duration::from_secs(3600);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let interval = inner.config.lease_interval();
        drop(inner);
        tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
        let Some(inner) = weak.upgrade() else { return };
        if let Err(e) = renew(&inner).await {
            tracing::warn!(error = %format_args!("{e:#}"), "lease renewal failed");
        }
        let sh = &inner.shared;
        if last_janitor.elapsed() >= sh.queue.janitor_interval {
            last_janitor = Instant::now();
            if let Err(e) = sh.janitor(&inner.name).await {
                tracing::debug!(error = %format_args!("{e:#}"), "janitor failed");
            }
        }
    }
}

async fn renew(inner: &CInner) -> Result<()> {
    let _gate = inner.lease_gate.lock().await;
    // Entries being finished or released need no lease any more (and a released one
    // must not get one).
    let ids: Vec<String> = inner
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost && !h.finishing)
        .map(|(sid, _)| sid.clone())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let sh = &inner.shared;
    let mut inv = sh.scripts.renew.prepare_invoke();
    inv.key(&sh.keys.stream)
        .arg(&sh.keys.group)
        .arg(&inner.name);
    for id in &ids {
        inv.arg(id);
    }
    let lost: Vec<String> = inv
        .invoke_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("renewing leases", e))?;
    if !lost.is_empty() {
        let mut held = inner.held.lock().unwrap();
        let mut n = 0;
        for sid in lost {
            if let Some(h) = held.get_mut(&sid).filter(|h| !h.finishing) {
                h.lost = true;
                h.lease.cancel();
                n += 1;
                tracing::warn!(entry = %sid, consumer = %inner.name, "lease lost: another consumer took the request over or it was withdrawn");
            }
        }
        sh.metrics.lease_lost(n);
    }
    Ok(())
}
