//! The reader: reads new entries (`XREADGROUP BLOCK` on a connection of its own) and,
//! between reads, takes over idle ones (`nitro_reclaim.lua`); answers the entries it
//! cannot hand out (no `msg`, undecodable, past the retry limit) with an error key at
//! once; with dedup, lets each entry solve, join or be answered from the cache
//! (`nitro_join.lua`). Never holds more than `prefetch` entries.

use super::delivery::{Delivery, Job};
use super::state::ConsumerState;
use super::writer::{Answer, Kind, Mode, Release, WriteJob};
use crate::clock::ms;
use crate::conn::retry::Backoff;
use crate::consumer::LeaseLost;
use crate::error::{Error, Result};
use crate::ids;
use crate::nitro::TOO_MANY_RETRIES;
use crate::protocol::entry::{self, parse_entries, RawEntry};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::DropGuard;

/// Most entries read in one call.
const MAX_BATCH: usize = 256;

/// An entry taken from the stream, with its delivery count before this delivery.
struct Taken {
    entry: RawEntry,
    before: u32,
}

/// Reads until stopped. `_exited` fires when the task ends, however it ends.
pub(super) async fn run<Req>(
    st: Arc<ConsumerState>,
    tx: mpsc::Sender<Delivery<Req>>,
    _exited: DropGuard,
) where
    Req: DeserializeOwned + Send + 'static,
{
    let cfg = st.config.clone();
    let link = st.link.clone();
    let k = &link.keys;
    let mut conn = None;
    let mut backoff = Backoff::new();
    let mut next_reclaim = Instant::now();
    // Until a read succeeds, a missing group is the normal start (the producers create
    // it, as in Nitro); after that, it was lost.
    let mut had_group = false;
    loop {
        // A stop wins over free slots: after it, nothing more is read or taken over (not
        // even this consumer's own hand-backs).
        let first = tokio::select! {
            biased;
            _ = st.stop.cancelled() => return,
            p = st.slots.clone().acquire_owned() => p.expect("never closed"),
        };
        let mut bundle = first;
        let extra = st.slots.available_permits().min(MAX_BATCH - 1);
        if extra > 0 {
            if let Ok(more) = st.slots.clone().try_acquire_many_owned(extra as u32) {
                bundle.merge(more);
            }
        }
        let mut hand = Hand(Some(bundle));
        if cfg.reclaim && Instant::now() >= next_reclaim {
            let want = hand.len();
            match reclaim(&st, want).await {
                Ok(taken) => {
                    // A full hand: more may be waiting; look again at once.
                    next_reclaim = if taken.len() >= want {
                        Instant::now()
                    } else {
                        Instant::now() + cfg.reclaim_interval()
                    };
                    if !taken.is_empty() {
                        link.metrics.redelivered(taken.len() as u64);
                    }
                    process(&st, &tx, taken, &mut hand).await;
                }
                Err(e) => {
                    if is_nogroup(&e) {
                        recreate_group(&st, had_group, &mut backoff).await;
                    } else {
                        tracing::warn!(error = %format_args!("{e:#}"), "looking for idle entries failed");
                    }
                    next_reclaim =
                        Instant::now() + cfg.reclaim_interval().min(Duration::from_secs(1));
                }
            }
            if hand.is_empty() {
                continue;
            }
        }
        if conn.is_none() {
            match link
                .own_connection(cfg.block + link.config.command_timeout)
                .await
            {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "consumer cannot connect; retrying");
                    drop(hand);
                    wait_or_stop(&st, backoff.next()).await;
                    continue;
                }
            }
        }
        let block = if cfg.reclaim {
            next_reclaim
                .saturating_duration_since(Instant::now())
                .min(cfg.block)
                .max(Duration::from_millis(1))
        } else {
            cfg.block
        };
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(k.group())
            .arg(&st.name)
            .arg("COUNT")
            .arg(hand.len())
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS")
            .arg(&k.stream)
            .arg(">");
        // Not cancelled by a stop: a read cut short could leave entries delivered to
        // this consumer unseen. A stop waits for it (at most `block`).
        let read = conn.as_mut().expect("connected").query_streams(&cmd).await;
        match read {
            Ok(streams) => {
                backoff.reset();
                had_group = true;
                let entries: Vec<RawEntry> = streams.into_iter().flat_map(|(_, e)| e).collect();
                if entries.is_empty() && cfg.reclaim {
                    // Idle: look for handed-back work now, not at the next interval.
                    next_reclaim = Instant::now();
                }
                let taken = entries
                    .into_iter()
                    .map(|entry| Taken { entry, before: 0 })
                    .collect();
                process(&st, &tx, taken, &mut hand).await;
            }
            Err(e) if e.code() == Some("NOGROUP") => {
                drop(hand);
                recreate_group(&st, had_group, &mut backoff).await;
            }
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), "read failed; reconnecting");
                conn = None;
                drop(hand);
                wait_or_stop(&st, backoff.next()).await;
            }
        }
    }
}

fn is_nogroup(e: &Error) -> bool {
    e.redis_source()
        .is_some_and(|r| r.code() == Some("NOGROUP") || r.to_string().contains("NOGROUP"))
}

/// The stream or its group is gone (deleted, flushed, a restart without persistence; or
/// a Nitro producer's XADD made the stream again without the group): create the group,
/// at `0` so that entries added meanwhile are served.
async fn recreate_group(st: &ConsumerState, had_group: bool, backoff: &mut Backoff) {
    if had_group {
        tracing::warn!(stream = %st.link.keys.stream, "the stream or its consumer group is gone; creating the group again");
    } else {
        tracing::info!(stream = %st.link.keys.stream, "no consumer group yet (no producer has created it); creating it");
    }
    match st.link.create_group("0").await {
        Ok(()) => st.link.register(&st.name).await,
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), "cannot create the consumer group");
            wait_or_stop(st, backoff.next()).await;
        }
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

    fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        let p = self.0.as_mut()?;
        if p.num_permits() > 1 {
            p.split(1)
        } else {
            self.0.take()
        }
    }
}

async fn wait_or_stop(st: &ConsumerState, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = st.stop.cancelled() => {}
    }
}

/// One `nitro_reclaim.lua` call: entries idle for the idletime, at most `count`.
async fn reclaim(st: &ConsumerState, count: usize) -> Result<Vec<Taken>> {
    let link = &st.link;
    let k = &link.keys;
    let v: redis::Value = link
        .scripts
        .reclaim
        .key(&k.stream)
        .arg(k.group())
        .arg(&st.name)
        .arg(ms(st.config.idletime))
        .arg(count)
        .invoke_async(&mut link.conn())
        .await
        .map_err(|e| Error::redis("looking for idle entries", e))?;
    let parts = entry::array(&v);
    let counts: std::collections::HashMap<String, u32> = parts
        .first()
        .map(entry::array)
        .unwrap_or(&[])
        .chunks(2)
        .filter_map(|c| Some((entry::string(c.first()?)?, entry::int(c.get(1)?)? as u32)))
        .collect();
    Ok(parts
        .get(1)
        .map(parse_entries)
        .unwrap_or_default()
        .into_iter()
        .map(|entry| {
            let before = counts.get(&*entry.id).copied().unwrap_or(1);
            Taken { entry, before }
        })
        .collect())
}

/// An entry that decoded, waiting for the dedup verdict or going to a handler.
struct Ready<Req> {
    id: String,
    hash: Option<String>,
    req: Req,
    deliveries: u32,
    permit: OwnedSemaphorePermit,
}

/// Turns taken entries into deliveries, or answers them at once.
async fn process<Req>(
    st: &ConsumerState,
    tx: &mpsc::Sender<Delivery<Req>>,
    taken: Vec<Taken>,
    hand: &mut Hand,
) where
    Req: DeserializeOwned + Send + 'static,
{
    let mut ready = Vec::with_capacity(taken.len());
    for Taken { entry, before } in taken {
        let permit = hand.take_one().expect("took at most the free slots");
        let id = entry.id.to_string();
        if before > 0 && st.leases.in_work(&id) {
            // Its own entry, in work, taken over from itself because a heartbeat came
            // late: the takeover reset its idle time; the work goes on as it was.
            tracing::debug!(entry = %id, "took over an entry already in hand");
            continue;
        }
        let msg = entry.get("msg");
        let hash = if st.config.dedup {
            msg.map(ids::request_id)
        } else {
            None
        };
        if st.config.max_retry_count.is_some_and(|max| before > max) {
            tracing::warn!(entry = %id, deliveries = before, "past the retry limit: answering \"too many retries\"");
            answer_now(st, id, hash, Mode::RetryLimit, TOO_MANY_RETRIES.into());
            continue;
        }
        let req = match msg.map(serde_json::from_slice::<Req>) {
            Some(Ok(req)) => req,
            Some(Err(e)) => {
                let text = format!("pelican: the request in entry {id} cannot be decoded: {e}");
                tracing::warn!(entry = %id, error = %e, "undecodable request: answering with an error");
                answer_now(st, id, None, Mode::Handler, text);
                continue;
            }
            None => {
                let text = format!("pelican: entry {id} has no 'msg' field");
                tracing::warn!(entry = %id, "entry without a msg field: answering with an error");
                answer_now(st, id, None, Mode::Handler, text);
                continue;
            }
        };
        drop(entry);
        ready.push(Ready {
            id,
            hash,
            req,
            deliveries: before + 1,
            permit,
        });
    }
    if !st.config.dedup || ready.is_empty() {
        for r in ready {
            deliver(st, tx, r).await;
        }
        return;
    }
    let pairs: Vec<(String, String)> = ready
        .iter()
        .map(|r| (r.id.clone(), r.hash.clone().unwrap_or_default()))
        .collect();
    match join(st, &pairs).await {
        Ok(verdicts) => {
            let m = &st.link.metrics;
            for (r, v) in ready.into_iter().zip(verdicts) {
                match v.as_str() {
                    "s" => deliver(st, tx, r).await,
                    "j" => m.joined(1),
                    "c" => m.cached(1),
                    _ => {}
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), "dedup failed; handing the entries back");
            for r in ready {
                st.writer.send(WriteJob::Release(Release {
                    id: r.id,
                    idle_ms: ms(st.config.idletime),
                    ack: None,
                }));
            }
        }
    }
}

/// An error key for an entry no handler will see.
fn answer_now(st: &ConsumerState, id: String, hash: Option<String>, mode: Mode, text: String) {
    st.writer.send(WriteJob::Answer(Answer {
        id,
        hash,
        mode,
        kind: Kind::Error,
        value: text.into_bytes(),
        ack: None,
    }));
}

/// One `nitro_join.lua` call: a verdict per entry.
async fn join(st: &ConsumerState, pairs: &[(String, String)]) -> Result<Vec<String>> {
    let link = &st.link;
    let k = &link.keys;
    let mut inv = link.scripts.join.prepare_invoke();
    inv.key(&k.stream)
        .key(&k.job_prefix)
        .key(&k.cache_prefix)
        .key(&k.result_prefix)
        .arg(k.group())
        .arg(&st.name)
        .arg(ms(st.config.idletime))
        .arg(ms(st.config.job_ttl()))
        .arg(ms(st.config.response_ttl));
    for (id, hash) in pairs {
        inv.arg(id).arg(hash);
    }
    let verdicts: Vec<String> = inv
        .invoke_async(&mut link.conn())
        .await
        .map_err(|e| Error::redis("deduplicating entries", e))?;
    if verdicts.len() != pairs.len() {
        return Err(Error::new(
            crate::ErrorKind::Redis,
            "unexpected answer from the dedup script",
        ));
    }
    Ok(verdicts)
}

async fn deliver<Req>(st: &ConsumerState, tx: &mpsc::Sender<Delivery<Req>>, r: Ready<Req>) {
    let lease = st.leases.hold(&r.id, r.hash.clone());
    let job = Job {
        id: r.id,
        deliveries: r.deliveries,
        lease: LeaseLost(lease),
    };
    let d = Delivery::new(st.writer.clone(), r.req, job, r.hash, r.permit);
    if let Err(mpsc::error::SendError(d)) = tx.send(d).await {
        // Stopping: dropping it hands it back.
        drop(d);
    }
}
