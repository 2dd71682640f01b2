//! What a consumer's reader and maintenance share: the queue, the settings, the prefetch
//! slots, the leases, the way to the writer, the stop signal and the reader's wake-ups.

use super::lease::Leases;
use super::wake::Wake;
use super::writer::Writer;
use crate::config::ConsumerConfig;
use crate::shared::Shared;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use tokio::sync::{Mutex, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

pub(super) struct ConsumerState {
    pub(super) shared: Arc<Shared>,
    pub(super) config: ConsumerConfig,
    pub(super) name: String,
    /// The prefetch slots: a delivery holds one until its outcome is written.
    pub(super) slots: Arc<Semaphore>,
    /// The partitions' readers take turns waiting for free slots: the reader whose turn
    /// it is takes every slot free when the first one comes (up to a batch), so slots
    /// freed together (one outcome write) go to one read rather than one to each reader.
    pub(super) slot_turn: Arc<Mutex<()>>,
    pub(super) leases: Arc<Leases>,
    pub(super) writer: Arc<Writer>,
    pub(super) stop: CancellationToken,
    /// A queue of one partition: what the outcome writer's call on the wire will free.
    pub(super) read_ahead: Option<Arc<ReadAhead>>,
    /// When what the writer released becomes reclaimable (the reader wakes for it).
    pub(super) wake: Arc<Wake>,
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
