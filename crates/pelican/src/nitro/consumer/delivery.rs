//! One entry in a consumer's hands: [`Job`] (what the handler is told) and the
//! delivery that answers it once, through the writer.

use super::writer::{Answer, Kind, Mode, Release, WriteJob, WriterHandle};
use crate::clock::ms;
use crate::consumer::LeaseLost;
use crate::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// What a handler is told about the entry it works on besides its request.
#[derive(Debug, Clone)]
pub struct Job {
    pub(crate) id: String,
    pub(crate) deliveries: u32,
    pub(crate) lease: LeaseLost,
}

impl Job {
    /// The stream entry id: Nitro's request id (`result-key:<stream>.<id>`).
    pub fn entry_id(&self) -> &str {
        &self.id
    }

    /// How many times the entry has been delivered, this time included (1 = first).
    pub fn delivery_count(&self) -> u32 {
        self.deliveries
    }

    /// Fires when this consumer lost the entry (another consumer took it over, it was
    /// answered elsewhere or withdrawn by its producer) or is shutting down past its
    /// timeout: its answer will most likely be dropped.
    pub fn lease_lost(&self) -> LeaseLost {
        self.lease.clone()
    }

    /// Whether the entry has been lost.
    pub fn is_lease_lost(&self) -> bool {
        self.lease.is_lost()
    }
}

/// An entry handed to a handler. Answered once; dropped unanswered, it is handed back.
pub(super) struct Delivery<Req> {
    req: Option<Req>,
    job: Job,
    hash: Option<String>,
    /// The prefetch slot, held until the answer is written.
    permit: Option<OwnedSemaphorePermit>,
    writer: Arc<WriterHandle>,
    answered: bool,
    received: Instant,
}

impl<Req> Delivery<Req> {
    pub(super) fn new(
        writer: Arc<WriterHandle>,
        req: Req,
        job: Job,
        hash: Option<String>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        Delivery {
            req: Some(req),
            job,
            hash,
            permit: Some(permit),
            writer,
            answered: false,
            received: Instant::now(),
        }
    }

    pub(super) fn take_request(&mut self) -> Req {
        self.req.take().expect("request taken once")
    }

    pub(super) fn job(&self) -> &Job {
        &self.job
    }

    /// How long since it was handed out.
    pub(super) fn age(&self) -> Duration {
        self.received.elapsed()
    }

    /// Writes a result (JSON) or an error (text). Returns whether this entry was answered
    /// (false: it was not pending any more, the answer was dropped).
    pub(super) async fn answer(mut self, kind: Kind, value: Vec<u8>) -> Result<bool> {
        self.answered = true;
        let (tx, rx) = oneshot::channel();
        self.writer.send(WriteJob::Answer(Answer {
            id: self.job.id.clone(),
            hash: self.hash.clone(),
            mode: Mode::Handler,
            kind,
            value,
            ack: Some(tx),
        }));
        let r = rx.await.map_err(|_| gone())?;
        self.permit.take();
        r
    }

    /// Hands the entry back, to be taken over after about `delay` (zero: at once). The
    /// delivery count stays: the next claim counts.
    pub(super) async fn release(mut self, delay: Duration) -> Result<()> {
        self.answered = true;
        let (tx, rx) = oneshot::channel();
        self.writer.send(WriteJob::Release(Release {
            id: self.job.id.clone(),
            idle_ms: ms(self.writer.idletime.saturating_sub(delay)),
            ack: Some(tx),
        }));
        let r = rx.await.map_err(|_| gone())?;
        self.permit.take();
        r
    }
}

fn gone() -> Error {
    Error::new(ErrorKind::Shutdown, "the consumer is shut down")
}

impl<Req> Drop for Delivery<Req> {
    fn drop(&mut self) {
        if !self.answered {
            self.writer.send(WriteJob::Release(Release {
                id: self.job.id.clone(),
                idle_ms: ms(self.writer.idletime),
                ack: None,
            }));
        }
    }
}
