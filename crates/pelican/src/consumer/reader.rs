//! The reader: reads new entries (`XREADGROUP BLOCK` on a connection of its own) and,
//! between reads, reclaims idle ones; turns each entry into a delivery, dead-letters it
//! or answers it "expired". Never holds more than `prefetch` deliveries.

use super::delivery::{Delivery, Job, LeaseLost};
use super::fetch::Fetch;
use super::reclaim::reclaim;
use super::state::{ConsumerState, ReadAhead};
use super::wake::{read_or_wake, ReaderConn};
use super::writer::{Completion, WriteJob};
use crate::clock::{ms, now_ms};
use crate::codec::Codec;
use crate::conn::retry::Backoff;
use crate::metrics::HandBack;
use crate::protocol::entry::{Producers, RawEntry, Request};
use crate::protocol::outcome::Outcome;
use crate::protocol::scripts::Reject;
use serde::{de::DeserializeOwned, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// Most entries read in one call.
const MAX_BATCH: usize = 256;
/// Most bytes of entries (bodies included) one read asks for, going by the size of the
/// entries read last: a worker with megabyte bodies reads a few at a time and starts on
/// them, rather than waiting for hundreds of megabytes in one reply.
const MAX_READ_BYTES: usize = 2 << 20;

/// Reads new entries (and reclaims idle ones when due) into the delivery channel,
/// never holding more than `prefetch` deliveries.
pub(super) async fn run<Req, Resp, C>(
    inner: Arc<ConsumerState>,
    tx: mpsc::Sender<Delivery<Req, Resp, C>>,
) where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    let cfg = inner.config.clone();
    let sh = inner.shared.clone();
    let mut conn = ReaderConn::new();
    let mut fetch = Fetch::new();
    let mut producers = Producers::default();
    let mut backoff = Backoff::new();
    let mut next_reclaim = Instant::now();
    let mut cursor = "-".to_string();
    // Mean size of the entries of the last read (bytes), for the next read's COUNT.
    let mut entry_bytes = 0usize;
    // Several partitions: a reader never blocks holding more than one slot (a reader
    // waiting on an empty stream with many would keep them from the partitions that have
    // work for a whole block). With slots to spare it first reads without blocking; when
    // that finds nothing, the stream is drained, and it waits with one slot.
    let several = sh.queue.partitions > 1;
    let mut drained = false;
    loop {
        // Entries this consumer released that are reclaimable now: scan at once, from
        // the start (the scan's cursor may be past them).
        take_released(&inner, &mut next_reclaim, &mut cursor);
        // This reader's turn among the partitions' readers, then a free slot. Slots
        // freed together would otherwise go one to each waiting reader (the semaphore
        // serves its waiters in order), and every partition would read one entry.
        // Or, with one partition and no slot free, entries read ahead by the slots the
        // outcome writer's call will free (not while a reclaim scan is due: it waits for
        // free slots).
        let reclaim_due = cfg.reclaim && Instant::now() >= next_reclaim;
        let ahead = inner
            .read_ahead
            .as_deref()
            .filter(|_| !reclaim_due && inner.slots.available_permits() == 0);
        let first = tokio::select! {
            biased;
            _ = inner.stop.cancelled() => return,
            p = async {
                let _turn = inner.slot_turn.lock().await;
                inner.slots.clone().acquire_owned().await
            } => p.expect("never closed"),
            Some(ahead) = notified(ahead), if ahead.is_some() => {
                read_ahead(&inner, ahead, &tx, &mut conn, &mut fetch, &mut producers, &mut entry_bytes).await;
                continue;
            }
        };
        // Every free slot, up to a batch, in one bundle (one semaphore operation, not one
        // per slot); a permit is split off per delivery and the rest returned at once.
        let mut bundle = first;
        take_released(&inner, &mut next_reclaim, &mut cursor);
        // A drained stream is waited on with one slot; a reclaim scan that is due takes
        // every free slot all the same (it claims up to as many entries as slots).
        let reclaim_due = cfg.reclaim && Instant::now() >= next_reclaim;
        let extra = if several && drained && !reclaim_due {
            0
        } else {
            inner.slots.available_permits().min(MAX_BATCH - 1)
        };
        if extra > 0 {
            if let Ok(more) = inner.slots.clone().try_acquire_many_owned(extra as u32) {
                bundle.merge(more);
            }
        }
        let mut permits = Hand(Some(bundle));
        if !conn.is_open() {
            match conn.open(&inner).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "consumer cannot connect; retrying");
                    drop(permits);
                    wait_or_stop(&inner, backoff.next()).await;
                    continue;
                }
            }
        }
        if cfg.reclaim && Instant::now() >= next_reclaim {
            // Nothing in hand: it may take a request for its last delivery, alone.
            let idle = permits.len() + inner.slots.available_permits() >= cfg.prefetch;
            let c = conn.get();
            match reclaim(&inner, c, &mut fetch, &cursor, permits.len(), idle).await {
                Ok((next, claimed, solo, waiting_alone)) => {
                    if next == "-" {
                        next_reclaim = Instant::now() + cfg.reclaim_interval();
                    }
                    cursor = next;
                    if !claimed.is_empty() {
                        sh.metrics.redelivered(claimed.len() as u64);
                    }
                    for (e, n) in claimed {
                        let alone = solo.as_deref() == Some(&*e.id);
                        // Its last delivery runs alone (see reclaim.lua): it takes every
                        // slot, so nothing else is read until it is answered.
                        let p = if alone {
                            permits.take_all()
                        } else {
                            permits.take_one()
                        }
                        .expect("claimed at most the free slots");
                        deliver(&inner, &tx, e, n, p, alone, &mut producers).await;
                    }
                    if waiting_alone && solo.is_none() && !idle {
                        // A request waits for its last delivery, which only a consumer
                        // with nothing in hand may take: become one. Claiming it first
                        // and draining after would let a crash caused by the work in
                        // hand use up that last delivery. Nothing new is read meanwhile;
                        // then the scan starts over.
                        let missing = cfg.prefetch.saturating_sub(permits.len());
                        tokio::select! {
                            all = inner.slots.clone().acquire_many_owned(missing as u32) => drop(all),
                            _ = inner.stop.cancelled() => return,
                        }
                        cursor = "-".to_string();
                        next_reclaim = Instant::now();
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "reclaim failed");
                    next_reclaim =
                        Instant::now() + cfg.reclaim_interval().min(Duration::from_secs(1));
                    // Its connection may be broken: the next turn opens another.
                    conn.lost();
                    continue;
                }
            }
            if permits.is_empty() {
                continue;
            }
        }
        // Until the next reclaim scan, or until entries this consumer released become
        // reclaimable: the read ends then (it is also woken for released entries and for
        // a stop that come while it waits: `wake.rs`).
        let now = Instant::now();
        let mut ends = now + cfg.block;
        if cfg.reclaim {
            ends = ends.min(next_reclaim);
            if let Some(due) = inner.wake.next_due() {
                ends = ends.min(due);
            }
        }
        let block = ends
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        let probe = several && permits.len() > 1;
        let count = permits
            .len()
            .min((MAX_READ_BYTES / entry_bytes.max(1)).max(1));
        let (c, client) = conn.for_read();
        let read = fetch.read(&inner, c, count, (!probe).then_some(block));
        let read = read_or_wake(&inner, client, now + block, read).await;
        match read {
            Ok(mut entries) => {
                backoff.reset();
                // Stored bodies, read from the node that owns the partition's slot. A
                // failed read is a failed read: the entries are pending and come back
                // by reclaim.
                let c = conn.get();
                if let Err(e) = fetch.bodies(&inner, c, &mut entries).await {
                    tracing::warn!(error = %format_args!("{e:#}"), "reading stored bodies failed; reconnecting");
                    conn.lost();
                    drop(permits);
                    wait_or_stop(&inner, backoff.next()).await;
                    continue;
                }
                if let Some(mean) = RawEntry::mean_size(&entries) {
                    entry_bytes = mean;
                }
                drained = entries.is_empty();
                if entries.is_empty() && probe {
                    // Nothing waiting: the next read waits, with one slot.
                    continue;
                }
                if entries.is_empty() && cfg.reclaim {
                    // Idle for a whole block (or woken): look for released work now.
                    // Another consumer's retry, dropped delivery or shutdown makes
                    // entries reclaimable at once, and waiting for the reclaim interval
                    // (claim_idle / 2) would leave them lying there while this consumer
                    // has nothing to do.
                    next_reclaim = Instant::now();
                }
                for e in entries {
                    let p = permits.take_one().expect("read at most the free slots");
                    deliver(&inner, &tx, e, 1, p, false, &mut producers).await;
                }
            }
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the consumer group is gone (Redis restarted or the stream was deleted); creating it again");
                drop(permits);
                if let Err(e) = sh.ensure_group().await {
                    tracing::warn!(error = %format_args!("{e:#}"), "cannot create the consumer group");
                    wait_or_stop(&inner, backoff.next()).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), "read failed; reconnecting");
                conn.lost();
                drop(permits);
                wait_or_stop(&inner, backoff.next()).await;
            }
        }
    }
}

/// Entries this consumer released that are reclaimable now ([`super::wake::Wake`]): the
/// reclaim scan is due at once, and starts over.
fn take_released(inner: &ConsumerState, next_reclaim: &mut Instant, cursor: &mut String) {
    if inner.config.reclaim && inner.wake.take_due(Instant::now()) {
        *next_reclaim = Instant::now();
        "-".clone_into(cursor);
    }
}

/// `ahead`, once the outcome writer has sent a call that frees slots.
async fn notified(ahead: Option<&ReadAhead>) -> Option<&ReadAhead> {
    ahead?.notify.notified().await;
    ahead
}

/// Reads up to as many new entries as the outcome writer's call on the wire will free
/// ([`ReadAhead`]), and hands each out once its slot is free. Entries whose slots do not
/// come free within a quarter of `claim_idle` (the writer retrying a failed call), or when
/// the consumer stops, are released for any consumer to take at once.
async fn read_ahead<Req, Resp, C>(
    inner: &ConsumerState,
    ahead: &ReadAhead,
    tx: &mpsc::Sender<Delivery<Req, Resp, C>>,
    conn: &mut ReaderConn,
    fetch: &mut Fetch,
    producers: &mut Producers,
    entry_bytes: &mut usize,
) where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    let freeing = ahead.freeing.load(Ordering::SeqCst);
    if freeing == 0 || inner.stop.is_cancelled() {
        return;
    }
    let sh = &inner.shared;
    // The reader's own turn reconnects, with backoff.
    if !conn.is_open() && conn.open(inner).await.is_err() {
        return;
    }
    let count = freeing
        .min(MAX_BATCH)
        .min((MAX_READ_BYTES / (*entry_bytes).max(1)).max(1));
    let mut entries = match fetch.read(inner, conn.get(), count, None).await {
        Ok(e) if e.is_empty() => return,
        Ok(e) => e,
        Err(e) => {
            tracing::debug!(error = %format_args!("{e:#}"), "reading ahead failed; reconnecting");
            conn.lost();
            return;
        }
    };
    let wait = inner.config.claim_idle / 4;
    let slots = inner.slots.clone().acquire_many_owned(entries.len() as u32);
    // Stopping first: a consumer that stops frees the slots of what it had in work, and
    // entries given those slots now would only be dropped again by the stopping reader.
    let permits = tokio::select! {
        biased;
        _ = inner.stop.cancelled() => None,
        p = tokio::time::timeout(wait, slots) => p.ok().map(|p| p.expect("never closed")),
    };
    let Some(permits) = permits else {
        for e in entries {
            inner.writer.hand_back(e.id.clone(), HandBack::ReadAhead);
        }
        return;
    };
    if let Err(e) = fetch.bodies(inner, conn.get(), &mut entries).await {
        // As for any read: the entries are pending and come back by reclaim.
        tracing::warn!(error = %format_args!("{e:#}"), "reading stored bodies failed; reconnecting");
        conn.lost();
        return;
    }
    if let Some(mean) = RawEntry::mean_size(&entries) {
        *entry_bytes = mean;
    }
    sh.metrics.read_ahead(entries.len() as u64);
    let mut permits = Hand(Some(permits));
    for e in entries {
        let p = permits.take_one().expect("a slot for each entry");
        deliver(inner, tx, e, 1, p, false, producers).await;
    }
}

/// The prefetch slots a reader holds for one read: one permit bundle.
struct Hand(Option<OwnedSemaphorePermit>);

impl Hand {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One slot, for one delivery.
    fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        let p = self.0.as_mut()?;
        if p.num_permits() > 1 {
            p.split(1)
        } else {
            self.0.take()
        }
    }

    /// Every slot left.
    fn take_all(&mut self) -> Option<OwnedSemaphorePermit> {
        self.0.take()
    }
}

async fn wait_or_stop(inner: &ConsumerState, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = inner.stop.cancelled() => {}
    }
}

/// Turns one entry into a delivery, or dead-letters it, or answers it "expired".
/// `alone`: its last delivery; it is handed out only once every other delivery in hand
/// has been answered, and holds every slot until it is answered itself.
async fn deliver<Req, Resp, C>(
    inner: &ConsumerState,
    tx: &mpsc::Sender<Delivery<Req, Resp, C>>,
    e: RawEntry,
    deliveries: u32,
    mut permit: OwnedSemaphorePermit,
    alone: bool,
    producers: &mut Producers,
) where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    let sid = e.id.clone();
    let tp = crate::trace::from_entry(e.get(crate::trace::FIELD));
    let mut req = match Request::from_entry(e, inner.shared.queue.max_body_bytes, producers) {
        Ok(r) => r,
        Err(reason) => return reject(inner, &sid, &reason, deliveries).await,
    };
    if req.deadline_ms < now_ms() {
        inner.writer.send(WriteJob::Complete(Completion {
            sid,
            rid: req.rid,
            from: req.from,
            deadline_ms: req.deadline_ms,
            indexed: req.indexed,
            stored_body: req.stored_body,
            small: req.small,
            outcome: Outcome::Expired("deadline passed before a consumer started it".into()),
            ack: None,
            slot: None,
        }));
        return;
    }
    let value = match req.decode_body::<C, Req>() {
        Ok(v) => v,
        Err(err) => {
            return reject(inner, &sid, &format!("undecodable body: {err}"), deliveries).await
        }
    };
    let lease = inner.leases.hold(&sid);
    if alone {
        // Held (so its lease is renewed) while the work in hand drains.
        let missing = inner.config.prefetch.saturating_sub(permit.num_permits());
        if missing > 0 {
            tokio::select! {
                rest = inner.slots.clone().acquire_many_owned(missing as u32) => {
                    permit.merge(rest.expect("never closed"));
                }
                _ = inner.stop.cancelled() => {}
            }
        }
    }
    let job = Job {
        sid,
        rid: req.rid,
        from: req.from,
        indexed: req.indexed,
        stored_body: req.stored_body,
        small: req.small,
        deliveries,
        deadline_ms: req.deadline_ms,
        submitted_ms: req.submitted_ms,
        tp,
        lease: LeaseLost(lease),
    };
    let d = Delivery::new(inner.writer.clone(), value, job, permit);
    if let Err(mpsc::error::SendError(d)) = tx.send(d).await {
        // Nobody takes deliveries any more (stopping): dropping it releases it.
        drop(d);
    }
}

async fn reject(inner: &ConsumerState, sid: &str, reason: &str, deliveries: u32) {
    let sh = &inner.shared;
    tracing::warn!(entry = sid, reason, "dead-lettering a malformed entry");
    let r = Reject {
        consumer: &inner.name,
        sid,
        reason,
        deliveries,
        now_ms: now_ms(),
        result_ttl_ms: ms(sh.queue.result_ttl),
        reply_maxlen: sh.queue.reply_maxlen,
        dead_maxlen: sh.queue.dead_maxlen,
        max_body_bytes: sh.queue.max_body_bytes,
    }
    .call(&sh.scripts)
    .invoke(&mut sh.conn())
    .await;
    match r {
        Ok(true) => sh.metrics.dead_lettered(1),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), entry = sid, "could not dead-letter; it will be reclaimed and tried again")
        }
    }
}
