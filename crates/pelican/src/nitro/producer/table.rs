//! The producer's outstanding requests, by token: what the poller looks up, and what a
//! ticket waits on.

use crate::error::Result;
use crate::metrics::Metrics;
use crate::nitro::config::ProducerConfig;
use crate::nitro::link::Link;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, Notify};

/// What a request resolves to: the result key's JSON, or an error.
pub(super) type Resolution = Result<Vec<u8>>;

/// One request waiting for its answer.
pub(super) struct Waiting {
    /// Its current stream entry (a request lost with the stream gets a new one).
    pub(super) id: String,
    /// When it times out, in ms by the Redis clock.
    pub(super) deadline_ms: u64,
    /// The request, kept to submit it again if the stream loses it.
    pub(super) body: Arc<Vec<u8>>,
    pub(super) tx: oneshot::Sender<Resolution>,
    pub(super) started: Instant,
    pub(super) resubmits: u32,
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) waiting: HashMap<u64, Waiting>,
    /// The stream was seen missing: every request is checked at the next poll.
    pub(super) loss_suspected: bool,
}

pub(super) struct Inner {
    pub(super) link: Arc<Link>,
    pub(super) config: ProducerConfig,
    pub(super) table: Mutex<Table>,
    /// Wakes the poller when the first request comes in.
    pub(super) wake: Notify,
    /// Entries to withdraw (abandoned tickets), sent by `Drop`.
    pub(super) withdraw_tx: mpsc::UnboundedSender<String>,
    pub(super) closed: AtomicBool,
    pub(super) next_token: AtomicU64,
}

impl Inner {
    pub(super) fn metrics(&self) -> &Metrics {
        &self.link.metrics
    }

    /// Resolves request `token` (if it still waits), with `label` for the metrics.
    pub(super) fn resolve(&self, token: u64, label: &str, r: Resolution) {
        let w = self.table.lock().unwrap().waiting.remove(&token);
        if let Some(w) = w {
            self.metrics().resolved(label, w.started.elapsed());
            let _ = w.tx.send(r);
        }
    }

    /// A ticket was dropped unresolved: stop polling for it and withdraw its entry.
    pub(super) fn abandon(&self, token: u64) {
        let w = self.table.lock().unwrap().waiting.remove(&token);
        if let Some(w) = w {
            let _ = self.withdraw_tx.send(w.id);
        }
    }

    /// Fails every waiting request (shutdown, or the producer dropped); returns their
    /// entries.
    pub(super) fn fail_all(&self, err: impl Fn() -> crate::Error) -> Vec<String> {
        let drained: Vec<Waiting> = {
            let mut t = self.table.lock().unwrap();
            t.waiting.drain().map(|(_, w)| w).collect()
        };
        drained
            .into_iter()
            .map(|w| {
                let _ = w.tx.send(Err(err()));
                w.id
            })
            .collect()
    }
}
