//! The producer's slow loop: trim and refresh its reply stream, sweep for outcomes whose
//! push was missed, run the janitor.

use super::replies::create_reply_stream;
use super::state::Inner;
use crate::clock::{ms, now_ms};
use crate::error::{Error, Result};
use crate::metrics::Resubmit;
use crate::protocol::index::IndexValue;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the loop wakes: the reply stream is trimmed this soon after outcomes are read
/// (a busy producer keeps it short); the other steps have their own, longer intervals.
const TICK: Duration = Duration::from_millis(250);

/// Every 250 ms: trim the reply stream, keep it alive, sweep for missed outcomes and
/// run the janitor when due.
pub(super) async fn maintenance(weak: std::sync::Weak<Inner>) {
    let tick = TICK;
    let mut trimmed_to = String::new();
    let mut last_refresh = Instant::now();
    let mut last_sweep = Instant::now();
    let mut last_janitor = Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = weak.upgrade() else { return };
        let sh = &inner.shared;
        let mut conn = sh.conn();
        let last = inner.last_reply_id.lock().unwrap().clone();
        if last != trimmed_to {
            let r: redis::RedisResult<i64> = redis::cmd("XTRIM")
                .arg(&inner.reply_key)
                .arg("MINID")
                .arg(&last)
                .query_async(&mut conn)
                .await;
            if r.is_ok() {
                trimmed_to = last;
            }
        }
        // A forced sweep follows a broken connection: Redis may have restarted and lost
        // the reply stream, so check it now rather than at the next refresh.
        let forced = inner.sweep_now.swap(false, Ordering::SeqCst);
        if forced || last_refresh.elapsed() >= inner.config.reply_ttl / 3 {
            let r: redis::RedisResult<i64> = redis::cmd("PEXPIRE")
                .arg(&inner.reply_key)
                .arg(ms(inner.config.reply_ttl))
                .query_async(&mut conn)
                .await;
            match r {
                Ok(1) => last_refresh = Instant::now(),
                Ok(_) => {
                    tracing::warn!(producer = %inner.id, "reply stream was gone (Redis restarted or flushed?); recreating it");
                    if create_reply_stream(sh, &inner.reply_key, inner.config.reply_ttl)
                        .await
                        .is_ok()
                    {
                        last_refresh = Instant::now();
                        inner.sweep_now.store(true, Ordering::SeqCst);
                    }
                }
                Err(_) => {}
            }
        }
        let forced = forced || inner.sweep_now.swap(false, Ordering::SeqCst);
        if forced || last_sweep.elapsed() >= inner.config.sweep_interval {
            let min_age = if forced {
                Duration::ZERO
            } else {
                inner.config.sweep_interval
            };
            let swept = match sweep(&inner, min_age).await {
                Ok(()) => sweep_unindexed(&inner, min_age).await,
                Err(e) => Err(e),
            };
            match swept {
                Ok(()) => last_sweep = Instant::now(),
                Err(e) => {
                    tracing::debug!(error = %format_args!("{e:#}"), "sweep failed; will retry");
                    inner.sweep_now.store(true, Ordering::SeqCst);
                }
            }
        }
        if last_janitor.elapsed() >= sh.queue.janitor_interval {
            last_janitor = Instant::now();
            if let Err(e) = sh.janitor(&inner.id).await {
                tracing::debug!(error = %format_args!("{e:#}"), "janitor failed");
            }
        }
    }
}

/// Looks up the outcomes of requests waiting at least `min_age` directly. Finds outcomes
/// whose push was missed; resubmits indexed requests that Redis no longer knows (lost
/// in a restart without persistence).
async fn sweep(inner: &Arc<Inner>, min_age: Duration) -> Result<()> {
    let due: Vec<(Arc<str>, bool)> = {
        let st = inner.state.lock().unwrap();
        st.pending
            .iter()
            // Without an index no outcome is stored: nothing to look up.
            .filter(|(_, p)| p.indexed && p.queued && p.started.elapsed() >= min_age)
            .map(|(rid, p)| (rid.clone(), p.deadline_ms > now_ms()))
            .collect()
    };
    let sh = &inner.shared;
    for chunk in due.chunks(500) {
        let keys: Vec<String> = chunk.iter().map(|(rid, _)| sh.keys.req(rid)).collect();
        let vals: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("sweeping for outcomes", e))?;
        for ((rid, alive), v) in chunk.iter().zip(vals) {
            match v.as_deref().map(IndexValue::decode) {
                Some(Some(IndexValue::Done(o))) => inner.resolve(rid, Ok(o)),
                // In flight, and this producer is among its waiters: the push will come.
                Some(Some(IndexValue::Pending(p))) if p.has_waiter(&inner.id) => {}
                // Unknown to Redis (lost in a restart without persistence), in flight
                // without this producer (a requeued dead letter, a value rewritten by
                // someone else) or not pelican's: submit it again while it has time.
                _ if *alive => inner.resubmit(
                    rid,
                    Resubmit::Lost,
                    "request unknown to Redis (lost in a restart?); submitting it again",
                ),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Requests without an index (dedup off) store no outcome to look up, but a request Redis
/// lost (a submission the old master acknowledged and never passed on before a failover,
/// or Redis restarted without persistence) can still be told from one that finished:
/// `complete.lua` removes a finished entry from the stream and pushes its outcome in one
/// script, so an entry gone from the stream whose outcome is neither in this producer's
/// reply stream nor read already was never finished. Such a request is submitted again
/// (it may run twice if Redis lost only its outcome, as any request without dedup may
/// run twice). Looked at: requests waiting at least `min_age`, queued, whose outcome is
/// not being fetched, with time left.
async fn sweep_unindexed(inner: &Arc<Inner>, min_age: Duration) -> Result<()> {
    let due: Vec<(Arc<str>, String)> = {
        let st = inner.state.lock().unwrap();
        let now = now_ms();
        st.pending
            .iter()
            .filter(|(_, p)| {
                !p.indexed
                    && p.queued
                    && !p.answer_fetching
                    && p.deadline_ms > now
                    && p.started.elapsed() >= min_age
            })
            .filter_map(|(rid, p)| Some((rid.clone(), p.sid.clone()?)))
            .collect()
    };
    if due.is_empty() {
        return Ok(());
    }
    let sh = &inner.shared;
    let err = |e| Error::redis("sweeping for lost requests", e);
    let mut gone = Vec::new();
    for chunk in due.chunks(500) {
        let mut pipe = redis::pipe();
        for (_, sid) in chunk {
            pipe.cmd("XRANGE")
                .arg(sh.keys.stream())
                .arg(sid)
                .arg(sid)
                .arg("COUNT")
                .arg(1);
        }
        let found: Vec<redis::Value> = pipe.query_async(&mut sh.conn()).await.map_err(err)?;
        for (job, entries) in chunk.iter().zip(found) {
            if matches!(entries, redis::Value::Array(ref a) if a.is_empty()) {
                gone.push(job);
            }
        }
    }
    if gone.is_empty() {
        return Ok(());
    }
    // Read after the entries were found gone: an outcome pushed with their removal is here,
    // unless the reply reader read it (and resolved its request) and the stream was trimmed.
    let replies: redis::Value = redis::cmd("XRANGE")
        .arg(&inner.reply_key)
        .arg("-")
        .arg("+")
        .query_async(&mut sh.conn())
        .await
        .map_err(err)?;
    let answered = reply_rids(&replies);
    for (rid, sid) in gone {
        if answered.contains(rid.as_bytes()) {
            continue;
        }
        let lost = {
            let st = inner.state.lock().unwrap();
            st.pending.get(rid).is_some_and(|p| {
                p.queued && !p.answer_fetching && p.sid.as_deref() == Some(sid.as_str())
            })
        };
        if lost {
            inner.resubmit(
                rid,
                Resubmit::Lost,
                "request without an index unknown to Redis (lost in a failover or a restart?); submitting it again",
            );
        }
    }
    Ok(())
}

/// The request ids in an `XRANGE` reply of a reply stream: each entry's field names
/// (its fields are pairs of a request id and an outcome).
fn reply_rids(v: &redis::Value) -> std::collections::HashSet<&[u8]> {
    use redis::Value;
    let mut out = std::collections::HashSet::new();
    let Value::Array(entries) = v else {
        return out;
    };
    for e in entries {
        let Value::Array(parts) = e else { continue };
        let Some(Value::Array(fields)) = parts.get(1) else {
            continue;
        };
        for f in fields.iter().step_by(2) {
            if let Value::BulkString(rid) = f {
                out.insert(rid.as_slice());
            }
        }
    }
    out
}
