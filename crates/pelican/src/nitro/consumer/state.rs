//! What a Nitro-format consumer's tasks share.

use super::lease::Leases;
use super::writer::WriterHandle;
use crate::nitro::config::ConsumerConfig;
use crate::nitro::link::Link;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub(super) struct ConsumerState {
    pub(super) link: Arc<Link>,
    pub(super) config: ConsumerConfig,
    pub(super) name: String,
    /// The prefetch slots: an entry in hand holds one until its answer is written.
    pub(super) slots: Arc<Semaphore>,
    pub(super) leases: Arc<Leases>,
    pub(super) writer: Arc<WriterHandle>,
    pub(super) stop: CancellationToken,
}
