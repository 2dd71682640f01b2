//! The consumer: reads requests in batches, keeps leases on what it holds, takes over
//! idle work of dead consumers, dead-letters poison and writes outcomes in batches.
//!
//! Tasks: one reader (XREADGROUP BLOCK on a dedicated connection, large reads in parts
//! over a few more, and the reclaim scan between reads; woken out of its read for
//! released work and for a stop, `wake.rs`), one writer (batches completions and releases
//! into one script call each), one maintenance task (lease renewal, janitor).

mod atomic;
mod delivery;
mod fetch;
mod lease;
mod maintenance;
mod reader;
mod reclaim;
mod state;
mod wake;
mod writer;

pub use delivery::{Delivery, HandlerError, Job, LeaseLost};

use crate::clock::ms;
use crate::codec::{Codec, Json};
use crate::config::{ConsumerConfig, QueueConfig};
use crate::conn::retry::retry_idempotent;
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::protocol::scripts::Release;
use crate::shared::Shared;
use crate::task::TaskSet;
use futures_util::FutureExt;
use lease::Leases;
use serde::{de::DeserializeOwned, Serialize};
use state::ConsumerState;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use writer::{WriteJob, Writer, WriterTask};

/// Reads requests of type `Req` from a queue and answers them with `Resp`.
pub struct Consumer<Req, Resp, C: Codec = Json> {
    /// Partition 0's state: what every partition shares (name, settings, slots, stop).
    inner: Arc<ConsumerState>,
    /// One per partition of the queue, each with its reader, writer and leases.
    parts: Vec<Arc<ConsumerState>>,
    rx: mpsc::Receiver<Delivery<Req, Resp, C>>,
    tasks: TaskSet,
}

/// Stops a consumer's [`Consumer::serve`] loop from anywhere (a signal handler, a test).
#[derive(Clone, Debug)]
pub struct Stopper(pub(crate) CancellationToken);

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
    pub async fn connect(queue: QueueConfig, mut config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        let parts = Shared::connect(&queue).await?;
        // Every partition's reader holds a slot while it waits on its stream: one more
        // per extra partition, so a partition with work still gets `prefetch` while the
        // others wait empty.
        config.prefetch += parts.len() - 1;
        let name = config.name.clone().unwrap_or_else(ids::consumer_name);
        let (tx, rx) = mpsc::channel(config.prefetch);
        let slots = Arc::new(Semaphore::new(config.prefetch));
        let slot_turn = Arc::new(tokio::sync::Mutex::new(()));
        let stop = CancellationToken::new();
        let tasks = TaskSet::new();
        let mut states = Vec::new();
        let one_partition = parts.len() == 1;
        for shared in parts {
            let read_ahead = one_partition.then(|| Arc::new(state::ReadAhead::default()));
            let (writer_tx, writer_rx) = mpsc::unbounded_channel();
            let leases = Arc::new(Leases::default());
            let wake = Arc::new(wake::Wake::default());
            let writer = Arc::new(Writer::new(
                writer_tx,
                leases.clone(),
                config.claim_idle,
                shared.queue.max_body_bytes,
                shared.metrics.clone(),
            ));
            let inner = Arc::new(ConsumerState {
                slots: slots.clone(),
                slot_turn: slot_turn.clone(),
                shared,
                config: config.clone(),
                name: name.clone(),
                leases,
                writer,
                stop: stop.clone(),
                read_ahead: read_ahead.clone(),
                wake: wake.clone(),
            });
            // Register the consumer now: Redis 7.0 creates it only at its first delivery,
            // and an operator should see an idle worker in `pelican stats`.
            let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
                .arg("CREATECONSUMER")
                .arg(&inner.shared.keys.stream)
                .arg(&inner.shared.keys.group)
                .arg(&inner.name)
                .query_async(&mut inner.shared.conn())
                .await;
            // Not aborted with the others: dropped without `shutdown`, the consumer still
            // writes the outcomes and releases already handed to the writer (it ends once
            // every delivery is answered or dropped).
            tasks.spawn_detached(
                "outcome writer",
                writer::run(
                    WriterTask {
                        shared: inner.shared.clone(),
                        name: inner.name.clone(),
                        claim_idle: inner.config.claim_idle,
                        leases: inner.leases.clone(),
                        stop: inner.stop.clone(),
                        answer_token: crate::ids::random_id()[..16].to_string(),
                        next_answer: AtomicU64::new(1),
                        read_ahead,
                        wake,
                        reclaims: config.reclaim,
                    },
                    writer_rx,
                ),
            );
            tasks.spawn(
                "reader",
                reader::run::<Req, Resp, C>(inner.clone(), tx.clone()),
            );
            tasks.spawn("lease renewal", maintenance::run(inner.clone()));
            states.push(inner);
        }
        tracing::debug!(queue = %queue.name, consumer = %name, partitions = states.len(), "consumer started");
        Ok(Consumer {
            inner: states[0].clone(),
            parts: states,
            rx,
            tasks,
        })
    }

    /// This consumer's name in the group.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A handle that stops [`Consumer::serve`].
    pub fn stopper(&self) -> Stopper {
        Stopper(self.inner.stop.clone())
    }

    /// The next delivery; `Ok(None)` once the consumer is stopping. An error means the
    /// consumer cannot go on ([`ErrorKind::Internal`](crate::ErrorKind::Internal): one of
    /// its tasks panicked); shut it down or drop it.
    pub async fn next(&mut self) -> Result<Option<Delivery<Req, Resp, C>>> {
        if let Some(e) = self.tasks.failure() {
            return Err(e);
        }
        tokio::select! {
            d = self.rx.recv() => match d {
                Some(d) => Ok(Some(d)),
                None if self.inner.stop.is_cancelled() => Ok(None),
                // The reader is gone without a stop: it panicked (the failure is recorded
                // right after its unwinding dropped the channel).
                None => Err(self.reader_failure().await),
            },
            _ = self.inner.stop.cancelled() => Ok(None),
            e = self.tasks.failed() => Err(e),
        }
    }

    async fn reader_failure(&self) -> Error {
        match tokio::time::timeout(Duration::from_secs(1), self.tasks.failed()).await {
            Ok(e) => e,
            Err(_) => Error::new(
                ErrorKind::Internal,
                "the consumer's reader stopped without being asked to",
            ),
        }
    }

    /// Runs `handler` on every delivery, at most `concurrency` at a time, until
    /// [`Stopper::stop`] is called; then shuts down gracefully (see
    /// [`Consumer::shutdown`]). A handler's `Ok` is the response; `Err` says whether to
    /// fail for good or retry; a handler that panics counts as a failed delivery (the
    /// request is released for redelivery) and never stops the consumer. Returns an
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) error if one of the consumer's
    /// own tasks panicked (after shutting down as well as it can).
    pub async fn serve<F, Fut>(mut self, concurrency: usize, handler: F) -> Result<()>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
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
        let queue = self.inner.shared.queue.name.clone();
        let mut running = tokio::task::JoinSet::new();
        let mut handlers = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, mut rx) = mpsc::channel::<Delivery<Req, Resp, C>>(1);
            handlers.push(tx);
            let (handler, free_tx, queue) = (handler.clone(), free_tx.clone(), queue.clone());
            let _ = free_tx.send(i);
            running.spawn(async move {
                while let Some(d) = rx.recv().await {
                    // A panic past the handler's own catch (the response's Serialize,
                    // say) loses this delivery only (dropped: released), not the task.
                    let _ = AssertUnwindSafe(handle(&queue, &*handler, d))
                        .catch_unwind()
                        .await;
                    let _ = free_tx.send(i);
                }
            });
        }
        drop(free_tx);
        let mut failure = None;
        loop {
            let i = tokio::select! {
                i = free.recv() => i.expect("the handlers outlive this loop"),
                _ = self.inner.stop.cancelled() => break,
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
        let deadline = tokio::time::sleep(self.inner.config.shutdown_timeout);
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

    /// Stops gracefully: reads nothing new, waits up to `shutdown_timeout` for the
    /// deliveries in hand to be answered, then releases whatever is left so another
    /// consumer can take it at once, and writes every pending outcome. It leaves the
    /// group if it owns nothing then; otherwise the janitor removes it once the released
    /// entries have been taken over and `consumer_gc_after` has passed. Returns an
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) error if one of the consumer's
    /// tasks had panicked.
    ///
    /// A consumer dropped without `shutdown` still writes the outcomes (and releases)
    /// already given to it, in the background; deliveries not yet answered are released
    /// when they are dropped. What it read ahead and did not hand out, and deliveries a
    /// read delivered unseen, wait `claim_idle` before another consumer takes them.
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
            self.cancel_all();
        }
        for part in &self.parts {
            let (tx, rx) = oneshot::channel();
            part.writer.send(WriteJob::Flush(tx));
            let _ = rx.await;
        }
        self.tasks.abort_all();
        let mut released = 0;
        for part in &self.parts {
            released += leave(part).await?;
        }
        tracing::debug!(consumer = %self.inner.name, released, "consumer stopped");
        match self.tasks.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn cancel_all(&self) {
        for part in &self.parts {
            part.leases.cancel_all();
        }
    }
}

/// Runs `handler` on one delivery (in a span continuing the submitter's trace, `otel`
/// feature) and hands its outcome to the writer.
async fn handle<Req, Resp, C, F, Fut>(queue: &str, handler: &F, mut d: Delivery<Req, Resp, C>)
where
    Resp: Serialize,
    C: Codec,
    F: Fn(Req, Job) -> Fut,
    Fut: Future<Output = std::result::Result<Resp, HandlerError>>,
{
    let span = tracing::info_span!(
        "pelican.handle",
        queue = %queue,
        rid = %d.job().request_id(),
        delivery = d.job().delivery_count(),
    );
    crate::trace::continue_from(&span, d.job().trace_parent());
    async move {
        let req = d.take_request();
        let job = d.job().clone();
        // A panic is caught here and counts as a failed delivery.
        let result = AssertUnwindSafe(handler(req, job)).catch_unwind().await;
        match result {
            Ok(Ok(resp)) => {
                let rid = d.job().rid.clone();
                if let Err(e) = d.respond_in_background(&resp) {
                    tracing::warn!(rid = %rid, error = %format_args!("{e:#}"), "could not record an outcome");
                }
            }
            Ok(Err(HandlerError::Fail(m))) => d.fail_in_background(m),
            Ok(Err(HandlerError::Retry(m))) => {
                tracing::debug!(rid = %d.job().rid, reason = %m, "handler asked for a retry");
                d.retry_in_background(Duration::ZERO);
            }
            Ok(Err(HandlerError::RetryAfter(delay, m))) => {
                tracing::debug!(rid = %d.job().rid, reason = %m, ?delay, "handler asked for a retry");
                d.retry_in_background(delay);
            }
            Err(panic) => {
                let e = crate::task::panic_message(&*panic);
                tracing::warn!(rid = %d.job().rid, error = %format_args!("{e:#}"), "handler panicked; the request is released for redelivery");
                d.retry_in_background(Duration::ZERO);
            }
        }
    }
    .instrument(span)
    .await
}

/// Releases everything the consumer still owns in a partition (including entries a
/// cancelled read may have delivered unseen) and wakes the other consumers' readers if it
/// released anything since it began to stop, then leaves its group if nothing is left.
/// Returns how many entries were released.
async fn leave(part: &ConsumerState) -> Result<u64> {
    let sh = &part.shared;
    let release = Release {
        consumer: &part.name,
        idle_ms: ms(part.config.claim_idle),
    }
    .call(&sh.scripts, []);
    // Idempotent: releasing an entry twice backdates it twice.
    let release = &release;
    let released = match retry_idempotent(
        move || async move { release.invoke(&mut sh.conn()).await },
    )
    .await
    {
        Ok(n) => n,
        // The group is gone, and with it every entry it tracked (a failover to a
        // replica that had not seen them, the stream deleted): nothing is held.
        Err(e) if e.code() == Some("NOGROUP") => {
            tracing::warn!(
                    "the consumer group is gone (a failover lost it, or the stream was deleted): nothing to release"
                );
            return Ok(0);
        }
        Err(e) => return Err(Error::redis("releasing entries on shutdown", e)),
    };
    if released > 0 || part.wake.released_stopping() {
        // This consumer takes nothing more: the others take it, at once.
        wake::wake_others(sh, &part.name).await;
    }
    if released == 0 {
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("DELCONSUMER")
            .arg(&sh.keys.stream)
            .arg(&sh.keys.group)
            .arg(&part.name)
            .query_async(&mut sh.conn())
            .await;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_testkit::{eventually, RedisServer};

    /// A partitioned consumer's readers waiting on empty streams hold one prefetch slot
    /// each, not every free one: with 2 partitions and prefetch 4 (5 slots), both
    /// readers end up blocked in XREADGROUP and 3 slots stay free. (A reader that blocked
    /// with every free slot kept the other partition's reader from reading for a whole
    /// block.)
    #[tokio::test]
    async fn readers_waiting_on_empty_partitions_hold_one_slot_each() {
        let server = RedisServer::start();
        let q = QueueConfig::new(server.url(), "one-slot").with_partitions(2);
        let cfg = ConsumerConfig::default()
            .with_prefetch(4)
            .with_block(Duration::from_secs(60))
            .with_claim_idle(Duration::from_secs(240));
        let c = Consumer::<u64, u64>::connect(q, cfg).await.unwrap();
        let client = server.client();
        eventually(
            Duration::from_secs(10),
            "both readers blocked in XREADGROUP",
            || {
                let client = client.clone();
                async move {
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let list: String = redis::cmd("CLIENT")
                        .arg("LIST")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    list.lines()
                        .filter(|l| l.contains(" cmd=xreadgroup ") && l.contains(" flags=b "))
                        .count()
                        == 2
                }
            },
        )
        .await;
        assert_eq!(c.inner.slots.available_permits(), 3);
        drop(c);
    }
}
