//! The producer's state: what its handles and tasks share (the queue, the settings, the
//! waiters table of `pending.rs`, the ways to its tasks, the lean connections of
//! `lean.rs`), and its closing.

use super::answers::AnswerJob;
use super::pending::{CancelJob, Pending, State, SubmitJob};
use crate::config::ProducerConfig;
use crate::error::{Error, ErrorKind};
use crate::shared::Shared;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) config: ProducerConfig,
    pub(crate) id: String,
    pub(crate) reply_key: String,
    pub(crate) state: Mutex<State>,
    pub(crate) submit_tx: mpsc::UnboundedSender<SubmitJob>,
    pub(crate) cancel_tx: mpsc::UnboundedSender<CancelJob>,
    /// Stored answers to fetch (`answers.rs`).
    pub(crate) answer_tx: mpsc::UnboundedSender<AnswerJob>,
    pub(crate) closed: AtomicBool,
    /// Why the producer stopped working, when one of its tasks panicked.
    pub(crate) failure: Mutex<Option<Error>>,
    pub(crate) next_token: AtomicU64,
    pub(crate) sweep_now: AtomicBool,
    pub(crate) last_reply_id: Mutex<String>,
    /// Idle lean connections for stored bodies (`lean.rs`).
    pub(crate) body_conns: Mutex<Vec<crate::conn::wire::LeanConn>>,
    /// Set once this queue's connections turned out not to be lean ones (TLS, ...).
    pub(crate) no_lean_bodies: AtomicBool,
}

impl Inner {
    /// Closes the producer and fails every request still waiting with `err`.
    pub(crate) fn fail_all(&self, err: Error) {
        self.closed.store(true, Ordering::SeqCst);
        let drained: Vec<Pending> = {
            let mut st = self.state.lock().unwrap();
            st.pending.drain().map(|(_, p)| p).collect()
        };
        for p in drained {
            for (_, w) in p.waiters {
                let _ = w.send(Err(err.clone()));
            }
        }
    }

    /// The error of a call to a closed producer: why it failed, or that it was shut down.
    pub(crate) fn closed_error(&self) -> Error {
        self.failure
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| Error::new(ErrorKind::Shutdown, "the producer is shut down"))
    }
}
