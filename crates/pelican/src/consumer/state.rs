//! What a consumer's reader, writer handle and maintenance share, per partition: the
//! wire, the settings, the prefetch slots, the leases, the way to the writer, the stop
//! signal and the reader's wake-ups.

use super::lease::Leases;
use super::wake::Wake;
use super::wire::{Settings, Wire};
use super::writer::Writer;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use tokio::sync::{Mutex, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub(crate) struct State<W: Wire> {
    pub(crate) wire: Arc<W>,
    pub(crate) settings: Settings,
    pub(crate) name: String,
    /// The prefetch slots: a delivery holds one until its outcome is written.
    pub(crate) slots: Arc<Semaphore>,
    /// The partitions' readers take turns waiting for free slots: the reader whose turn
    /// it is takes every slot free when the first one comes (up to a batch), so slots
    /// freed together (one outcome write) go to one read rather than one to each reader.
    pub(crate) slot_turn: Arc<Mutex<()>>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) writer: Arc<Writer<W>>,
    pub(crate) stop: CancellationToken,
    /// A queue of one partition: what the outcome writer's call on the wire will free.
    pub(crate) read_ahead: Option<Arc<ReadAhead>>,
    /// When what the writer released becomes reclaimable (the reader wakes for it).
    pub(crate) wake: Arc<Wake>,
    /// Whether the queue has more than one partition.
    pub(crate) several: bool,
}

/// The prefetch slots the outcome writer's call on the wire will free when it returns.
/// The reader, waiting for slots, reads that many new entries at once instead of a round
/// trip after the call: they arrive while the call is on its way back, and each is handed
/// out once its slot is free, so the consumer still holds at most `prefetch` deliveries
/// (its pending list may hold one call's worth more meanwhile). Without it a delivery's
/// slot was held for a read and a write round trip through a Redis busy with the
/// producers' submissions, and that, more than Redis, bounded a worker of small quick
/// requests (docs/benchmarks/2026-12-03-34d2f6e-read-ahead.md).
#[derive(Default)]
pub(crate) struct ReadAhead {
    pub(crate) freeing: AtomicUsize,
    pub(crate) notify: Notify,
}

/// The prefetch slots a reader holds for one read: one permit bundle.
pub(crate) struct Hand(pub(crate) Option<OwnedSemaphorePermit>);

impl Hand {
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One slot, for one delivery.
    pub(crate) fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        let p = self.0.as_mut()?;
        if p.num_permits() > 1 {
            p.split(1)
        } else {
            self.0.take()
        }
    }

    /// Every slot left.
    pub(crate) fn take_all(&mut self) -> Option<OwnedSemaphorePermit> {
        self.0.take()
    }
}
