//! The reader: reads new entries (`XREADGROUP BLOCK` on a connection of its own) and,
//! between reads, reclaims idle ones, and hands what it read to `admit.rs`. Never holds
//! more than `prefetch` deliveries.

use super::admit::admit_all;
use super::delivery::Delivery;
use super::fetch::Fetch;
use super::state::{Hand, ReadAhead, State};
use super::wake::{read_or_wake, ReaderConn};
use super::wire::{Reclaimed, Wire};
use crate::conn::retry::Backoff;
use crate::error::Error;
use crate::metrics::HandBack;
use crate::protocol::entry::RawEntry;
use serde::de::DeserializeOwned;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most entries read in one call.
const MAX_BATCH: usize = 256;
/// Most bytes of entries (bodies included) one read asks for, going by the size of the
/// entries read last: a worker with megabyte bodies reads a few at a time and starts on
/// them, rather than waiting for hundreds of megabytes in one reply.
const MAX_READ_BYTES: usize = 2 << 20;

/// What the reader keeps between its turns.
struct Reader<W: Wire> {
    fetch: Fetch,
    /// The wire's parsing state.
    parse: W::ReadState,
    /// Mean size of the entries of the last read (bytes), for the next read's COUNT.
    entry_bytes: usize,
}

/// Reads new entries (and reclaims idle ones when due) into the delivery channel,
/// never holding more than `prefetch` deliveries.
pub(super) async fn run<W, Req>(inner: Arc<State<W>>, tx: mpsc::Sender<Delivery<W, Req>>)
where
    W: Wire,
    Req: DeserializeOwned + Send + 'static,
{
    let cfg = inner.settings.clone();
    let mut conn = ReaderConn::new();
    let mut r = Reader::<W> {
        fetch: Fetch::new(),
        parse: W::ReadState::default(),
        entry_bytes: 0,
    };
    let mut backoff = Backoff::new();
    let mut next_reclaim = Instant::now();
    let mut cursor = "-".to_string();
    // Until a read succeeds, a missing group may be the normal start (Nitro's producers
    // create it); after that, it was lost.
    let mut had_group = false;
    // Several partitions: a reader never blocks holding more than one slot (a reader
    // waiting on an empty stream with many would keep them from the partitions that have
    // work for a whole block). With slots to spare it first reads without blocking; when
    // that finds nothing, the stream is drained, and it waits with one slot.
    let several = inner.several;
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
        // free slots). A stop wins over free slots: after it, nothing more is read or
        // taken over.
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
                read_ahead(&inner, ahead, &tx, &mut conn, &mut r).await;
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
            match reclaim(&inner, &mut conn, &mut r, &cursor, permits.len(), idle).await {
                Ok(Reclaimed {
                    next_cursor,
                    claimed,
                    solo,
                    waiting_alone,
                }) => {
                    had_group = true;
                    if next_cursor == "-" {
                        next_reclaim = Instant::now() + cfg.reclaim_interval;
                    }
                    cursor = next_cursor;
                    if !claimed.is_empty() {
                        inner.wire.place().metrics.redelivered(claimed.len() as u64);
                    }
                    admit_all(
                        &inner,
                        &tx,
                        claimed,
                        solo.as_deref(),
                        &mut permits,
                        &mut r.parse,
                    )
                    .await;
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
                    if is_nogroup(&e) {
                        drop(permits);
                        ensure_group(&inner, had_group, &mut backoff).await;
                    } else {
                        tracing::warn!(error = %format_args!("{e:#}"), "reclaim failed");
                        // Its connection may be broken: the next turn opens another.
                        conn.lost();
                    }
                    next_reclaim =
                        Instant::now() + cfg.reclaim_interval.min(Duration::from_secs(1));
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
            .min((MAX_READ_BYTES / r.entry_bytes.max(1)).max(1));
        let (c, client) = conn.for_read();
        let read = r.fetch.read(&inner, c, count, (!probe).then_some(block));
        let read = read_or_wake(&inner, client, now + block, read).await;
        match read {
            Ok(mut entries) => {
                backoff.reset();
                had_group = true;
                // Stored bodies, read from the node that owns the partition's slot. A
                // failed read is a failed read: the entries are pending and come back
                // by reclaim.
                let c = conn.get();
                if let Err(e) = r.fetch.bodies(&inner, c, &mut entries).await {
                    tracing::warn!(error = %format_args!("{e:#}"), "reading stored bodies failed; reconnecting");
                    conn.lost();
                    drop(permits);
                    wait_or_stop(&inner, backoff.next()).await;
                    continue;
                }
                if let Some(mean) = RawEntry::mean_size(&entries) {
                    r.entry_bytes = mean;
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
                    // would leave them lying there while this consumer has nothing to do.
                    next_reclaim = Instant::now();
                }
                let read = entries.into_iter().map(|e| (e, 1)).collect();
                admit_all(&inner, &tx, read, None, &mut permits, &mut r.parse).await;
            }
            Err(e) if e.code() == Some("NOGROUP") => {
                drop(permits);
                ensure_group(&inner, had_group, &mut backoff).await;
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

/// One reclaim scan on the reader's connection, and the stored bodies of what it
/// claimed (on failure the entries stay claimed by this consumer and are reclaimed again
/// later).
async fn reclaim<W: Wire>(
    inner: &State<W>,
    conn: &mut ReaderConn,
    r: &mut Reader<W>,
    cursor: &str,
    count: usize,
    idle: bool,
) -> crate::error::Result<Reclaimed> {
    let c = conn.get();
    let mut done = inner
        .wire
        .reclaim(c, &inner.name, &inner.settings, cursor, count, idle)
        .await?;
    if inner.wire.stored_bodies().is_some() {
        let (mut entries, counts): (Vec<RawEntry>, Vec<u32>) =
            std::mem::take(&mut done.claimed).into_iter().unzip();
        r.fetch
            .bodies(inner, c, &mut entries)
            .await
            .map_err(|e| Error::redis("reading stored bodies", e))?;
        done.claimed = entries.into_iter().zip(counts).collect();
    }
    Ok(done)
}

fn is_nogroup(e: &Error) -> bool {
    e.redis_source()
        .is_some_and(|r| r.code() == Some("NOGROUP") || r.to_string().contains("NOGROUP"))
}

/// The stream or its group is gone (deleted, flushed, a restart without persistence), or
/// not there yet: the wire creates the group.
async fn ensure_group<W: Wire>(inner: &State<W>, had_group: bool, backoff: &mut Backoff) {
    match inner.wire.ensure_group(had_group).await {
        Ok(()) => super::register(&*inner.wire, &inner.name).await,
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), "cannot create the consumer group");
            wait_or_stop(inner, backoff.next()).await;
        }
    }
}

/// Entries this consumer released that are reclaimable now ([`super::wake::Wake`]): the
/// reclaim scan is due at once, and starts over.
fn take_released<W: Wire>(inner: &State<W>, next_reclaim: &mut Instant, cursor: &mut String) {
    if inner.settings.reclaim && inner.wake.take_due(Instant::now()) {
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
async fn read_ahead<W, Req>(
    inner: &State<W>,
    ahead: &ReadAhead,
    tx: &mpsc::Sender<Delivery<W, Req>>,
    conn: &mut ReaderConn,
    r: &mut Reader<W>,
) where
    W: Wire,
    Req: DeserializeOwned + Send + 'static,
{
    let freeing = ahead.freeing.load(Ordering::SeqCst);
    if freeing == 0 || inner.stop.is_cancelled() {
        return;
    }
    // The reader's own turn reconnects, with backoff.
    if !conn.is_open() && conn.open(inner).await.is_err() {
        return;
    }
    let count = freeing
        .min(MAX_BATCH)
        .min((MAX_READ_BYTES / r.entry_bytes.max(1)).max(1));
    let mut entries = match r.fetch.read(inner, conn.get(), count, None).await {
        Ok(e) if e.is_empty() => return,
        Ok(e) => e,
        Err(e) => {
            tracing::debug!(error = %format_args!("{e:#}"), "reading ahead failed; reconnecting");
            conn.lost();
            return;
        }
    };
    let wait = inner.settings.claim_idle / 4;
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
    if let Err(e) = r.fetch.bodies(inner, conn.get(), &mut entries).await {
        // As for any read: the entries are pending and come back by reclaim.
        tracing::warn!(error = %format_args!("{e:#}"), "reading stored bodies failed; reconnecting");
        conn.lost();
        return;
    }
    if let Some(mean) = RawEntry::mean_size(&entries) {
        r.entry_bytes = mean;
    }
    inner.wire.place().metrics.read_ahead(entries.len() as u64);
    let mut permits = Hand(Some(permits));
    let read = entries.into_iter().map(|e| (e, 1)).collect();
    admit_all(inner, tx, read, None, &mut permits, &mut r.parse).await;
}

async fn wait_or_stop<W: Wire>(inner: &State<W>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = inner.stop.cancelled() => {}
    }
}
