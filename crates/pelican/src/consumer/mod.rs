//! The consumer core, one for both wires (pelican's own, `pelican/`; Nitro's,
//! `crate::nitro`): reads requests in batches, keeps leases on what it holds, takes over
//! idle work, hands deliveries to handlers and writes their answers in batches. What a
//! wire does differently is behind [`wire::Wire`].
//!
//! Tasks per partition: one reader (`reader.rs`: XREADGROUP BLOCK on a dedicated
//! connection, large reads in parts over a few more, `fetch.rs`, the reclaim scan between
//! reads; what it read admitted as deliveries, `admit.rs`; woken out of its read for
//! released work and for a stop, `wake.rs`), one writer (`writer.rs`: batches answers and
//! releases into one call each), one maintenance task (`maintenance.rs`: lease renewal,
//! `lease.rs`, and the wire's upkeep). `state.rs` is what they share; `delivery.rs` one
//! entry in a handler's hands; `serve.rs` drives the handlers.

mod admit;
pub(crate) mod delivery;
mod fetch;
mod lease;
mod maintenance;
mod pelican;
mod reader;
mod serve;
mod state;
mod wake;
pub(crate) mod wire;
mod writer;

pub use delivery::{HandlerError, HandlerResultExt, LeaseLost};
pub use pelican::{Consumer, Delivery, Job};

use crate::clock::ms;
use crate::conn::retry::retry_idempotent;
use crate::error::{Error, ErrorKind, Result};
use crate::task::TaskSet;
use lease::Leases;
use state::State;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use wire::{Settings, Wire};
use writer::{WriteJob, Writer, WriterTask};

/// Stops a consumer's `serve` loop from anywhere (a signal handler, a test).
#[derive(Clone, Debug)]
pub struct Stopper(pub(crate) CancellationToken);

impl Stopper {
    /// Asks the consumer to stop: it reads nothing new, finishes or releases what it holds.
    pub fn stop(&self) {
        self.0.cancel();
    }
}

/// A running consumer of wire `W`, over one partition or several, delivering `Req`s.
pub(crate) struct Core<W: Wire, Req> {
    /// One per partition, each with its reader, writer and leases (the first holds what
    /// they all share: the name, the settings, the slots, the stop).
    parts: Vec<Arc<State<W>>>,
    rx: mpsc::Receiver<delivery::Delivery<W, Req>>,
    tasks: TaskSet,
    /// Fire when the partitions' readers have ended, however they ended.
    readers_exited: Vec<CancellationToken>,
}

impl<W, Req> Core<W, Req>
where
    W: Wire,
    Req: serde::de::DeserializeOwned + Send + 'static,
{
    /// Starts the tasks of consumer `name` on `wires` (one per partition).
    pub(crate) async fn start(wires: Vec<W>, mut settings: Settings, name: String) -> Self {
        // Every partition's reader holds a slot while it waits on its stream: one more
        // per extra partition, so a partition with work still gets `prefetch` while the
        // others wait empty.
        settings.prefetch += wires.len() - 1;
        let (tx, rx) = mpsc::channel(settings.prefetch);
        let slots = Arc::new(Semaphore::new(settings.prefetch));
        let slot_turn = Arc::new(tokio::sync::Mutex::new(()));
        let stop = CancellationToken::new();
        let tasks = TaskSet::new();
        let mut parts = Vec::new();
        let mut readers_exited = Vec::new();
        let several = wires.len() > 1;
        for wire in wires {
            let wire = Arc::new(wire);
            let read_ahead = (!several).then(|| Arc::new(state::ReadAhead::default()));
            let (writer_tx, writer_rx) = mpsc::unbounded_channel();
            let leases = Arc::new(Leases::default());
            let wake = Arc::new(wake::Wake::default());
            let writer = Arc::new(Writer::new(
                writer_tx,
                wire.clone(),
                leases.clone(),
                settings.claim_idle,
            ));
            let st = Arc::new(State {
                wire,
                settings: settings.clone(),
                name: name.clone(),
                slots: slots.clone(),
                slot_turn: slot_turn.clone(),
                leases,
                writer,
                stop: stop.clone(),
                read_ahead: read_ahead.clone(),
                wake: wake.clone(),
                several,
            });
            register(&*st.wire, &st.name).await;
            // Not aborted with the others: dropped without `shutdown`, the consumer still
            // writes the outcomes and releases already handed to the writer (it ends once
            // every delivery is answered or dropped).
            tasks.spawn_detached(
                "outcome writer",
                writer::run(
                    WriterTask {
                        wire: st.wire.clone(),
                        name: st.name.clone(),
                        claim_idle: settings.claim_idle,
                        leases: st.leases.clone(),
                        stop: stop.clone(),
                        read_ahead,
                        wake,
                        reclaims: settings.reclaim,
                    },
                    writer_rx,
                ),
            );
            let exited = CancellationToken::new();
            let guard = exited.clone().drop_guard();
            let reader = reader::run::<W, Req>(st.clone(), tx.clone());
            tasks.spawn("reader", async move {
                let _exited = guard;
                reader.await
            });
            readers_exited.push(exited);
            tasks.spawn("lease renewal", maintenance::run(st.clone()));
            parts.push(st);
        }
        Core {
            parts,
            rx,
            tasks,
            readers_exited,
        }
    }

    fn first(&self) -> &State<W> {
        &self.parts[0]
    }

    /// This consumer's name in the group.
    pub(crate) fn name(&self) -> &str {
        &self.first().name
    }

    /// A handle that stops the consumer.
    pub(crate) fn stopper(&self) -> Stopper {
        Stopper(self.first().stop.clone())
    }

    /// The next delivery; `Ok(None)` once the consumer is stopping. An error means the
    /// consumer cannot go on (one of its tasks panicked).
    pub(crate) async fn next(&mut self) -> Result<Option<delivery::Delivery<W, Req>>> {
        if let Some(e) = self.tasks.failure() {
            return Err(e);
        }
        // The stop borrowed, not cloned: a token's clone takes its tree's lock.
        let stop = &self.parts[0].stop;
        tokio::select! {
            d = self.rx.recv() => match d {
                Some(d) => Ok(Some(d)),
                None if stop.is_cancelled() => Ok(None),
                // The reader is gone without a stop: it panicked (the failure is recorded
                // right after its unwinding dropped the channel).
                None => Err(reader_failure(&self.tasks).await),
            },
            _ = stop.cancelled() => Ok(None),
            e = self.tasks.failed() => Err(e),
        }
    }

    /// Stops gracefully: reads nothing new (the read under way is ended, `wake.rs`),
    /// waits up to `shutdown_timeout` for the deliveries in hand to be answered, then
    /// releases whatever is left so another consumer can take it at once, and writes every
    /// pending outcome. It leaves the group if it owns nothing then. Returns an
    /// [`ErrorKind::Internal`] error if one of the consumer's tasks had panicked.
    pub(crate) async fn shutdown(mut self) -> Result<()> {
        let settings = self.first().settings.clone();
        self.first().stop.cancel();
        // Deliveries read ahead but not handed out are released.
        self.rx.close();
        while let Ok(d) = self.rx.try_recv() {
            drop(d);
        }
        // The readers end their reads (cut short, `wake.rs`), and whatever those
        // delivered is released: nothing is left delivered to this consumer unseen.
        let read_limit = settings.block + self.first().wire.place().command_timeout;
        for exited in &self.readers_exited {
            if tokio::time::timeout(read_limit, exited.cancelled())
                .await
                .is_err()
            {
                tracing::warn!("the reader did not stop in time");
            }
        }
        while let Ok(d) = self.rx.try_recv() {
            drop(d);
        }
        let all = tokio::time::timeout(
            settings.shutdown_timeout,
            self.first()
                .slots
                .clone()
                .acquire_many_owned(settings.prefetch as u32),
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
        tracing::debug!(consumer = %self.name(), released, "consumer stopped");
        match self.tasks.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// How many prefetch slots are free.
    #[cfg(test)]
    pub(crate) fn free_slots(&self) -> usize {
        self.first().slots.available_permits()
    }

    fn cancel_all(&self) {
        for part in &self.parts {
            part.leases.cancel_all();
        }
    }
}

/// The failure of a reader gone without a stop (it panicked).
async fn reader_failure(tasks: &TaskSet) -> Error {
    match tokio::time::timeout(Duration::from_secs(1), tasks.failed()).await {
        Ok(e) => e,
        Err(_) => Error::new(
            ErrorKind::Internal,
            "the consumer's reader stopped without being asked to",
        ),
    }
}

/// Registers consumer `name` in the group (`XGROUP CREATECONSUMER`): Redis 7.0 creates a
/// consumer only at its first delivery, and an operator should see an idle worker. Best
/// effort: a missing group is created by the reader, which registers it then.
async fn register<W: Wire>(wire: &W, name: &str) {
    let place = wire.place();
    let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
        .arg("CREATECONSUMER")
        .arg(&place.stream)
        .arg(&place.group)
        .arg(name)
        .query_async(&mut place.conn.clone())
        .await;
}

/// Releases everything the consumer still owns in a partition (including entries a
/// cancelled read may have delivered unseen) and wakes the other consumers' readers if it
/// released anything since it began to stop, then leaves its group if nothing is left.
/// Returns how many entries were released.
async fn leave<W: Wire>(part: &State<W>) -> Result<u64> {
    let wire = &*part.wire;
    let (name, idle_ms) = (&*part.name, ms(part.settings.claim_idle));
    // Idempotent: releasing an entry twice backdates it twice.
    let released = match retry_idempotent(
        move || async move { wire.release_all(name, idle_ms).await },
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
        wake::wake_others(wire, name).await;
    }
    if released == 0 {
        let place = wire.place();
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("DELCONSUMER")
            .arg(&place.stream)
            .arg(&place.group)
            .arg(name)
            .query_async(&mut place.conn.clone())
            .await;
    }
    Ok(released)
}
