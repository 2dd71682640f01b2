//! The outcome writer: batches answers into one call ([`Wire::complete`]) and releases
//! into one call per idle time ([`Wire::release`]), on a connection of its own.
//! Deliveries reach it through a [`Writer`] handle.

use super::lease::Leases;
use super::state::ReadAhead;
use super::wake::Wake;
use super::wire::{Wire, Written};
use crate::clock::ms;
use crate::conn::retry::Backoff;
use crate::conn::OwnConn;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::HandBack;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Most outcomes or releases written in one call.
const MAX_BATCH: usize = 256;

/// A job for the writer.
pub(crate) enum WriteJob<W: Wire> {
    Complete(Completion<W>),
    Release(Release),
    Flush(oneshot::Sender<()>),
}

/// An answer to record for one entry.
pub(crate) struct Completion<W: Wire> {
    pub(crate) sid: Arc<str>,
    pub(crate) finish: W::Finish,
    pub(crate) ack: Option<oneshot::Sender<Result<bool>>>,
    /// Handed over without waiting ([`crate::Consumer::serve`]): the delivery's prefetch
    /// slot, dropped once the outcome is written, and a failure to write it is logged here.
    pub(crate) slot: Option<OwnedSemaphorePermit>,
}

/// An entry to hand back, reclaimable once its idle time reaches claim_idle.
pub(crate) struct Release {
    pub(crate) sid: Arc<str>,
    pub(crate) idle_ms: u64,
    pub(crate) ack: Option<oneshot::Sender<Result<()>>>,
    /// As [`Completion::slot`].
    pub(crate) slot: Option<OwnedSemaphorePermit>,
}

/// What a delivery needs of its consumer: the way to the writer, the wire and the
/// limits.
pub(crate) struct Writer<W: Wire> {
    tx: mpsc::UnboundedSender<WriteJob<W>>,
    pub(crate) wire: Arc<W>,
    leases: Arc<Leases>,
    claim_idle: Duration,
}

impl<W: Wire> Writer<W> {
    pub(super) fn new(
        tx: mpsc::UnboundedSender<WriteJob<W>>,
        wire: Arc<W>,
        leases: Arc<Leases>,
        claim_idle: Duration,
    ) -> Writer<W> {
        Writer {
            tx,
            wire,
            leases,
            claim_idle,
        }
    }

    /// Idle time after which another consumer may take an entry over.
    pub(crate) fn claim_idle(&self) -> Duration {
        self.claim_idle
    }

    /// Hands entry `sid` back for any consumer to take at once (released with an idle time
    /// of `claim_idle`); its prefetch slot, if it had one, is not the release's. Counted
    /// by `why`.
    pub(crate) fn hand_back(&self, sid: Arc<str>, why: HandBack) {
        self.wire.place().metrics.handed_back(why);
        self.send(WriteJob::Release(Release {
            sid,
            idle_ms: ms(self.claim_idle),
            ack: None,
            slot: None,
        }));
    }

    /// Hands a job to the writer. An entry whose outcome or release is on the way needs
    /// no more lease renewals.
    pub(crate) fn send(&self, job: WriteJob<W>) {
        let sid = match &job {
            WriteJob::Complete(c) => Some(&c.sid),
            WriteJob::Release(r) => Some(&r.sid),
            WriteJob::Flush(_) => None,
        };
        if let Some(sid) = sid {
            self.leases.finishing(sid);
        }
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            // The writer is gone (consumer dropped): the entry stays pending and is
            // reclaimed after claim_idle.
            let gone = || Error::new(ErrorKind::Shutdown, "the consumer is shut down");
            match job {
                WriteJob::Complete(Completion { ack: Some(a), .. }) => {
                    let _ = a.send(Err(gone()));
                }
                WriteJob::Release(Release { ack: Some(a), .. }) => {
                    let _ = a.send(Err(gone()));
                }
                _ => {}
            }
        }
    }
}

/// What the writer task works with.
pub(super) struct WriterTask<W: Wire> {
    pub(super) wire: Arc<W>,
    pub(super) name: String,
    pub(super) claim_idle: Duration,
    pub(super) leases: Arc<Leases>,
    pub(super) stop: CancellationToken,
    /// Told how many prefetch slots each call will free (see [`ReadAhead`]).
    pub(super) read_ahead: Option<Arc<ReadAhead>>,
    /// Told when what it released becomes reclaimable (the reader takes it then).
    pub(super) wake: Arc<Wake>,
    /// Whether the consumer reclaims (takes released entries again) at all.
    pub(super) reclaims: bool,
}

/// Writes outcomes and releases in batches: whatever queued up while the previous call
/// was on the wire goes in the next one. The writers of the partitions on one node take
/// turns (one call on the wire per node, see [`crate::shared::NodeGate`]): what queues up
/// while another partition's call is on the wire goes in this partition's next call.
pub(super) async fn run<W: Wire>(w: WriterTask<W>, mut rx: mpsc::UnboundedReceiver<WriteJob<W>>) {
    // The writer's own connection: one call at a time, off the shared connection.
    let mut conn: Option<OwnConn> = None;
    let mut jobs = Vec::new();
    let gate = w.wire.place().write_gate.clone();
    while rx.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        // This node's turn (held over this round of calls), then whatever else queued
        // up meanwhile.
        let mut turn = Some(gate.acquire().await.expect("never closed"));
        take_queued(&mut rx, &mut jobs);
        let mut completes: Vec<Completion<W>> = Vec::new();
        let mut releases: Vec<Release> = Vec::new();
        let mut flushes = Vec::new();
        let mut wake_others = false;
        for j in jobs.drain(..) {
            match j {
                WriteJob::Complete(c) => completes.push(c),
                WriteJob::Release(r) => releases.push(r),
                WriteJob::Flush(tx) => flushes.push(tx),
            }
        }
        if !completes.is_empty() {
            // The slots this call frees, for the reader to read ahead by.
            let freeing = completes.iter().filter(|c| c.slot.is_some()).count();
            let ahead = w.read_ahead.as_ref().filter(|_| freeing > 0);
            if let Some(a) = ahead {
                a.freeing.fetch_add(freeing, Ordering::SeqCst);
                a.notify.notify_one();
            }
            let results = write_all(&w, &mut conn, &completes, &gate, &mut turn).await;
            w.leases.forget(completes.iter().map(|c| &c.sid));
            let metrics = &w.wire.place().metrics;
            for (c, r) in completes.into_iter().zip(results) {
                let r = match r {
                    Ok(Written::Recorded(others)) => {
                        let label = W::label(&c.finish);
                        metrics.completed(label, 1 + others);
                        Ok(true)
                    }
                    Ok(_) => {
                        metrics.duplicate_dropped(1);
                        Ok(false)
                    }
                    Err(e) => Err(e),
                };
                if let Some(a) = c.ack {
                    let _ = a.send(r);
                } else if let (Some(_), Err(e)) = (&c.slot, &r) {
                    tracing::warn!(entry = %c.sid, error = %format_args!("{e:#}"), "could not record an outcome");
                }
            }
            // Every slot of the call is free now (dropped with its completion).
            if let Some(a) = ahead {
                a.freeing.fetch_sub(freeing, Ordering::SeqCst);
            }
        }
        if !releases.is_empty() {
            let mut by_idle: HashMap<u64, Vec<Arc<str>>> = HashMap::new();
            for r in &releases {
                by_idle.entry(r.idle_ms).or_default().push(r.sid.clone());
            }
            let mut result = Ok(());
            for (idle, sids) in by_idle {
                let released = {
                    let _gate = w.leases.gate.lock().await;
                    w.wire.release(&mut conn, &w.name, idle, &sids).await
                };
                match released {
                    // Reclaimable once their idle time reaches claim_idle (a
                    // millisecond later, for Redis' clock's rounding): the reader wakes
                    // then (told before the slots go: a reader waiting for one scans
                    // first).
                    Ok(()) => {
                        let wait = ms(w.claim_idle).saturating_sub(idle) + 1;
                        let at = Instant::now() + Duration::from_millis(wait);
                        w.wake
                            .released(w.reclaims.then_some(at), w.stop.is_cancelled());
                        // This consumer never takes released entries: the others do,
                        // at once (a delayed one at their next scan).
                        wake_others |= !w.reclaims && idle >= ms(w.claim_idle);
                    }
                    Err(e) => {
                        tracing::warn!(error = %format_args!("{e:#}"), "releasing entries failed; they are reclaimed after claim_idle");
                        result = Err(e);
                    }
                }
            }
            w.leases.forget(releases.iter().map(|r| &r.sid));
            for r in releases {
                if let Some(a) = r.ack {
                    let _ = a.send(result.clone());
                }
                // Its prefetch slot, if it came with it, is free now.
                drop(r.slot);
            }
        }
        drop(turn);
        if wake_others {
            super::wake::wake_others(&*w.wire, &w.name).await;
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

/// Adds to `jobs` what is queued in `rx` now, up to a batch in all.
fn take_queued<T>(rx: &mut mpsc::UnboundedReceiver<T>, jobs: &mut Vec<T>) {
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => return,
        }
    }
}

/// Writes the answers of `completes`: what became of each (or the error). Retries while
/// the leases could still be ours (after that another consumer has taken the entries
/// over and the answers would be dropped anyway), the node's turn given up meanwhile so
/// the other partitions' writers go on: a failed call is sent again whole, an answer
/// whose stored answer did not arrive alone.
async fn write_all<'g, W: Wire>(
    w: &WriterTask<W>,
    conn: &mut Option<OwnConn>,
    completes: &[Completion<W>],
    gate: &'g Semaphore,
    turn: &mut Option<SemaphorePermit<'g>>,
) -> Vec<Result<Written>> {
    let give_up = Instant::now() + w.claim_idle;
    let mut backoff = Backoff::new();
    let mut results: Vec<Option<Result<Written>>> = vec![None; completes.len()];
    let mut todo: Vec<usize> = (0..completes.len()).collect();
    loop {
        let batch: Vec<(&Arc<str>, &W::Finish)> = todo
            .iter()
            .map(|&i| (&completes[i].sid, &completes[i].finish))
            .collect();
        let retry = match w.wire.complete(conn, &batch).await {
            Ok(done) if done.len() == todo.len() => {
                let mut missing = Vec::new();
                for (&i, d) in todo.iter().zip(done) {
                    match d {
                        Written::AnswerMissing => missing.push(i),
                        d => results[i] = Some(Ok(d)),
                    }
                }
                todo = missing;
                if todo.is_empty() {
                    break;
                }
                Error::new(
                    ErrorKind::Redis,
                    "Redis did not store the response (the SET before the outcome failed)",
                )
            }
            Ok(_) => Error::new(
                ErrorKind::Redis,
                "unexpected reply to the outcome write: not one result per outcome",
            ),
            Err(e) => e,
        };
        if Instant::now() >= give_up || w.stop.is_cancelled() {
            for &i in &todo {
                results[i] = Some(Err(retry.clone()));
            }
            break;
        }
        tracing::warn!(error = %format_args!("{retry:#}"), "writing outcomes failed; retrying");
        drop(turn.take());
        tokio::time::sleep(backoff.next()).await;
        *turn = Some(gate.acquire().await.expect("never closed"));
    }
    results
        .into_iter()
        .map(|r| r.expect("every outcome written or failed"))
        .collect()
}
