//! What a consumer's reader and maintenance share: the queue, the settings, the prefetch
//! slots, the leases, the way to the writer and the stop signal.

use super::lease::Leases;
use super::writer::Writer;
use crate::config::ConsumerConfig;
use crate::shared::Shared;
use std::sync::Arc;
use tokio::sync::{Mutex, Semaphore};
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
}
