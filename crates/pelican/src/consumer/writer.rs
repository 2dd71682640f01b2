//! The outcome writer: batches completions into one `complete.lua` call and releases into
//! one `release.lua` call, on a connection of its own. Deliveries reach it through a
//! [`Writer`] handle.

use super::lease::Leases;
use super::state::ReadAhead;
use super::wake::Wake;
use crate::clock::{ms, now_ms};
use crate::conn::framed::StoredBody;
use crate::conn::retry::Backoff;
use crate::conn::OwnConn;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::{HandBack, Metrics};
use crate::protocol::outcome::{Outcome, STORED_ANSWER_MIN};
use crate::protocol::scripts::{self, Complete, CompleteEntry, Completed, ScriptCall};
use crate::shared::Shared;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Most outcomes or releases written in one call.
const MAX_BATCH: usize = 256;

/// How much longer than the result ttl a stored answer is kept: a waiter told of it just
/// before its outcome expires still finds it.
const ANSWER_GRACE_MS: u64 = 60_000;

/// A job for the writer.
pub(crate) enum WriteJob {
    Complete(Completion),
    Release(Release),
    Flush(oneshot::Sender<()>),
}

/// An outcome to record for one entry.
pub(crate) struct Completion {
    pub(crate) sid: Arc<str>,
    pub(crate) rid: Arc<str>,
    pub(crate) from: Arc<str>,
    /// The entry's deadline (ms since the epoch).
    pub(crate) deadline_ms: u64,
    pub(crate) indexed: bool,
    /// Its body is stored beside the stream (deleted with the entry).
    pub(crate) stored_body: bool,
    /// Small enough to wait for a trim (see `complete.lua`).
    pub(crate) small: bool,
    /// A response of `STORED_ANSWER_MIN` bytes or more is stored beside the stream
    /// (docs/PROTOCOL.md, "Stored answers"): SET under a new name in the same write and
    /// transaction as each call that records it, the outcome naming it. A new name each
    /// time: a call that failed on the way may have recorded its outcome, and the call
    /// sent again must not delete that answer when it loses.
    pub(crate) outcome: Outcome,
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

/// What a delivery needs of its consumer: the way to the writer and the limits.
pub(crate) struct Writer {
    tx: mpsc::UnboundedSender<WriteJob>,
    leases: Arc<Leases>,
    claim_idle: Duration,
    max_body_bytes: usize,
    metrics: Metrics,
}

impl Writer {
    pub(super) fn new(
        tx: mpsc::UnboundedSender<WriteJob>,
        leases: Arc<Leases>,
        claim_idle: Duration,
        max_body_bytes: usize,
        metrics: Metrics,
    ) -> Writer {
        Writer {
            tx,
            leases,
            claim_idle,
            max_body_bytes,
            metrics,
        }
    }

    /// Idle time after which another consumer may take an entry over.
    pub(crate) fn claim_idle(&self) -> Duration {
        self.claim_idle
    }

    /// Largest body accepted.
    pub(crate) fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// The queue's metrics.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Hands entry `sid` back for any consumer to take at once (released with an idle time
    /// of `claim_idle`); its prefetch slot, if it had one, is not the release's. Counted
    /// by `why`.
    pub(crate) fn hand_back(&self, sid: Arc<str>, why: HandBack) {
        self.metrics.handed_back(why);
        self.send(WriteJob::Release(Release {
            sid,
            idle_ms: ms(self.claim_idle),
            ack: None,
            slot: None,
        }));
    }

    /// Hands a job to the writer. An entry whose outcome or release is on the way needs
    /// no more lease renewals.
    pub(crate) fn send(&self, job: WriteJob) {
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
            match job {
                WriteJob::Complete(Completion { ack: Some(a), .. }) => {
                    let _ = a.send(Err(Error::new(
                        ErrorKind::Shutdown,
                        "the consumer is shut down",
                    )));
                }
                WriteJob::Release(Release { ack: Some(a), .. }) => {
                    let _ = a.send(Err(Error::new(
                        ErrorKind::Shutdown,
                        "the consumer is shut down",
                    )));
                }
                _ => {}
            }
        }
    }
}

/// What the writer task works with.
pub(super) struct WriterTask {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    pub(super) claim_idle: Duration,
    pub(super) leases: Arc<Leases>,
    pub(super) stop: CancellationToken,
    /// This consumer's part of the names of its stored answers, random: a name is never
    /// used twice, by this consumer or another, or by this one after a restart.
    pub(super) answer_token: String,
    pub(super) next_answer: AtomicU64,
    /// Told how many prefetch slots each call will free (see [`ReadAhead`]).
    pub(super) read_ahead: Option<Arc<ReadAhead>>,
    /// Told when what it released becomes reclaimable (the reader takes it then).
    pub(super) wake: Arc<Wake>,
    /// Whether the consumer reclaims (takes released entries again) at all.
    pub(super) reclaims: bool,
}

impl WriterTask {
    /// A new name for a stored answer of entry `sid` (see `lib.lua`, "stored answer").
    fn answer_name(&self, sid: &str) -> String {
        let n = self.next_answer.fetch_add(1, Ordering::Relaxed);
        format!("a{sid}.{}.{n}", self.answer_token)
    }
}

/// Writes outcomes and releases in batches: whatever queued up while the previous call
/// was on the wire goes in the next one. The writers of the partitions on one node take
/// turns (one call on the wire per node, see [`crate::shared::NodeGate`]): what queues up
/// while another partition's call is on the wire goes in this partition's next call.
pub(super) async fn run(inner: WriterTask, mut rx: mpsc::UnboundedReceiver<WriteJob>) {
    // The writer's own connection: one call at a time, off the shared connection.
    let mut conn: Option<OwnConn> = None;
    let mut jobs = Vec::new();
    let gate = inner.shared.node.writes.clone();
    while rx.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        // This node's turn (held over this round of calls), then whatever else queued
        // up meanwhile.
        let mut turn = Some(gate.acquire().await.expect("never closed"));
        take_queued(&mut rx, &mut jobs);
        let mut completes: Vec<Completion> = Vec::new();
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
            let ahead = inner.read_ahead.as_ref().filter(|_| freeing > 0);
            if let Some(a) = ahead {
                a.freeing.fetch_add(freeing, Ordering::SeqCst);
                a.notify.notify_one();
            }
            let results =
                write_all_completions(&inner, &mut conn, &completes, &gate, &mut turn).await;
            let metrics = &inner.shared.metrics;
            let mut held = inner.leases.held.lock().unwrap();
            for (c, r) in completes.into_iter().zip(results) {
                held.remove(&c.sid);
                match &r {
                    Ok(true) => metrics.completed(c.outcome.label(), 1),
                    Ok(false) => metrics.duplicate_dropped(1),
                    Err(_) => {}
                }
                if let Some(a) = c.ack {
                    let _ = a.send(r);
                } else if let (Some(_), Err(e)) = (&c.slot, &r) {
                    tracing::warn!(rid = %c.rid, error = %format_args!("{e:#}"), "could not record an outcome");
                }
            }
            drop(held);
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
                match release(&inner, &mut conn, idle, &sids).await {
                    // Reclaimable once their idle time reaches claim_idle (a
                    // millisecond later, for Redis' clock's rounding): the reader wakes
                    // then (told before the slots go: a reader waiting for one scans
                    // first).
                    Ok(()) => {
                        let wait = ms(inner.claim_idle).saturating_sub(idle) + 1;
                        let at = Instant::now() + Duration::from_millis(wait);
                        inner
                            .wake
                            .released(inner.reclaims.then_some(at), inner.stop.is_cancelled());
                        // This consumer never takes released entries: the others do,
                        // at once (a delayed one at their next scan).
                        wake_others |= !inner.reclaims && idle >= ms(inner.claim_idle);
                    }
                    Err(e) => {
                        tracing::warn!(error = %format_args!("{e:#}"), "releasing entries failed; they are reclaimed after claim_idle");
                        result = Err(e);
                    }
                }
            }
            let mut held = inner.leases.held.lock().unwrap();
            for r in releases {
                held.remove(&r.sid);
                if let Some(a) = r.ack {
                    let _ = a.send(result.clone());
                }
                // Its prefetch slot, if it came with it, is free now.
                drop(r.slot);
            }
        }
        drop(turn);
        if wake_others {
            super::wake::wake_others(&inner.shared, &inner.name).await;
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

/// Writes the outcomes of `completes`: whether each was recorded (or the error). Retries
/// while the leases could still be ours (after that another consumer has taken the
/// entries over and the outcomes would be dropped anyway), the node's turn given up
/// meanwhile so the other partitions' writers go on: a failed call is sent again whole,
/// an outcome whose stored answer did not arrive alone.
async fn write_all_completions<'g>(
    inner: &WriterTask,
    conn: &mut Option<OwnConn>,
    completes: &[Completion],
    gate: &'g tokio::sync::Semaphore,
    turn: &mut Option<tokio::sync::SemaphorePermit<'g>>,
) -> Vec<Result<bool>> {
    let give_up = Instant::now() + inner.claim_idle;
    let mut backoff = Backoff::new();
    let mut results: Vec<Option<Result<bool>>> = vec![None; completes.len()];
    let mut todo: Vec<usize> = (0..completes.len()).collect();
    loop {
        let batch: Vec<&Completion> = todo.iter().map(|&i| &completes[i]).collect();
        let retry = match write_completions(inner, conn, &batch).await {
            Ok(done) => {
                let mut missing = Vec::new();
                for (&i, d) in todo.iter().zip(done) {
                    match d {
                        Completed::Recorded => results[i] = Some(Ok(true)),
                        Completed::Dropped => results[i] = Some(Ok(false)),
                        Completed::AnswerMissing => missing.push(i),
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
            Err(e) => e,
        };
        if Instant::now() >= give_up || inner.stop.is_cancelled() {
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

async fn write_completions(
    inner: &WriterTask,
    conn: &mut Option<OwnConn>,
    jobs: &[&Completion],
) -> Result<Vec<Completed>> {
    let sh = &inner.shared;
    // Each outcome as sent; a large response stored under a new name, named instead.
    let ttl_ms = ms(sh.queue.result_ttl) + ANSWER_GRACE_MS;
    let mut answers: Vec<StoredBody<'_>> = Vec::new();
    let outcomes: Vec<Vec<u8>> = jobs
        .iter()
        .map(|c| match &c.outcome {
            Outcome::Ok(body) if body.len() >= STORED_ANSWER_MIN => {
                let name = inner.answer_name(&c.sid);
                answers.push(StoredBody {
                    key: sh.keys.body(&name),
                    body,
                    ttl_ms,
                });
                Outcome::Stored {
                    len: body.len(),
                    name,
                }
                .encode()
            }
            o => o.encode(),
        })
        .collect();
    let call = Complete {
        result_ttl_ms: ms(sh.queue.result_ttl),
        reply_maxlen: sh.queue.reply_maxlen,
        now_ms: now_ms(),
    }
    .call(
        &sh.scripts,
        jobs.iter()
            .zip(&outcomes)
            .map(|(c, outcome)| CompleteEntry {
                sid: &c.sid,
                rid: &c.rid,
                from: &c.from,
                deadline_ms: c.deadline_ms,
                indexed: c.indexed,
                stored_body: c.stored_body,
                small: c.small,
                outcome,
            }),
    );
    eval_own(inner, conn, &call, &answers)
        .await
        .map_err(|e| Error::redis("writing outcomes", e))
}

async fn release(
    inner: &WriterTask,
    conn: &mut Option<OwnConn>,
    idle_ms: u64,
    sids: &[Arc<str>],
) -> Result<()> {
    let sh = &inner.shared;
    let _gate = inner.leases.gate.lock().await;
    let call = scripts::Release {
        consumer: &inner.name,
        idle_ms,
    }
    .call(&sh.scripts, sids.iter().map(|s| &**s));
    eval_own(inner, conn, &call, &[])
        .await
        .map_err(|e| Error::redis("releasing entries", e))?;
    Ok(())
}

/// Runs a script call on the writer's own connection, after the SETs of `answers` in the
/// same write and the same transaction (`atomic.rs`), opening the connection when needed
/// ([`crate::conn::on_own`]: one that failed, or whose partition's slot is served
/// elsewhere now, is dropped, and the next call opens a new one).
async fn eval_own<R>(
    inner: &WriterTask,
    conn: &mut Option<OwnConn>,
    call: &ScriptCall<'_, R>,
    answers: &[StoredBody<'_>],
) -> redis::RedisResult<R> {
    let sh = &inner.shared;
    let open = async || sh.own_connection(sh.queue.command_timeout).await;
    crate::conn::on_own(conn, open, async |c| {
        if answers.is_empty() {
            call.invoke_on(c, &mut sh.conn()).await
        } else {
            super::atomic::invoke_with_answers(call, c, &mut sh.conn(), answers).await
        }
    })
    .await
}
