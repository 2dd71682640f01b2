//! The poller: every `poll_interval`, the answer keys of ALL outstanding requests in one
//! pipelined round trip (`MGET` of the error keys and the result keys, with Redis' `TIME`
//! for the timeouts and `EXISTS` of the stream); answers found are deleted. It also
//! withdraws abandoned requests, trims the stream and checks that old requests still
//! exist (submitting again those lost with the stream).

use super::table::Inner;
use super::xadd;
use crate::conn::retry::Backoff;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::entry;
use redis::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Most requests looked up per MGET.
const MGET_CHUNK: usize = 1000;

/// Nitro's timeout text (`TimeoutErrorMessage`): Nitro's validator matches it as a
/// substring, so it is kept word for word.
pub(crate) const TIMEOUT_TEXT: &str =
    "error getting response, request has been waiting for too long";

pub(super) async fn run(inner: Arc<Inner>, mut withdraw_rx: mpsc::UnboundedReceiver<String>) {
    let cfg = inner.config.clone();
    let mut last_trim = Instant::now();
    let mut last_verify = Instant::now();
    let mut withdraws = Vec::new();
    let mut backoff = Backoff::new();
    loop {
        let idle = inner.table.lock().unwrap().waiting.is_empty();
        if idle {
            let until_trim = cfg.trim_interval.saturating_sub(last_trim.elapsed());
            tokio::select! {
                _ = inner.wake.notified() => {}
                n = withdraw_rx.recv_many(&mut withdraws, 1000) => if n == 0 { return },
                _ = tokio::time::sleep(until_trim) => {}
            }
        }
        tokio::time::sleep(cfg.poll_interval).await;
        while let Ok(id) = withdraw_rx.try_recv() {
            withdraws.push(id);
        }
        if !withdraws.is_empty() {
            let ids = std::mem::take(&mut withdraws);
            if let Err(e) = withdraw(&inner, &ids).await {
                tracing::debug!(error = %format_args!("{e:#}"), "withdrawing abandoned requests failed");
            }
        }
        match poll_once(&inner).await {
            Ok(()) => backoff.reset(),
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), "polling for answers failed");
                // Redis away: poll again, but not every few ms.
                tokio::time::sleep(backoff.next()).await;
            }
        }
        let suspected = std::mem::take(&mut inner.table.lock().unwrap().loss_suspected);
        if suspected || last_verify.elapsed() >= cfg.verify_interval {
            last_verify = Instant::now();
            if let Err(e) = verify(&inner, suspected).await {
                tracing::warn!(error = %format_args!("{e:#}"), "checking outstanding requests failed");
                if suspected {
                    inner.table.lock().unwrap().loss_suspected = true;
                }
            }
        }
        if last_trim.elapsed() >= cfg.trim_interval {
            last_trim = Instant::now();
            trim(&inner).await;
        }
    }
}

/// One poll of every outstanding request.
async fn poll_once(inner: &Inner) -> Result<()> {
    let snapshot: Vec<(u64, String, u64)> = inner
        .table
        .lock()
        .unwrap()
        .waiting
        .iter()
        .map(|(t, w)| (*t, w.id.clone(), w.deadline_ms))
        .collect();
    if snapshot.is_empty() {
        return Ok(());
    }
    let k = &inner.link.keys;
    let mut pipe = redis::pipe();
    pipe.cmd("TIME").cmd("EXISTS").arg(&k.stream);
    for chunk in snapshot.chunks(MGET_CHUNK) {
        let errors: Vec<String> = chunk.iter().map(|(_, id, _)| k.error(id)).collect();
        let results: Vec<String> = chunk.iter().map(|(_, id, _)| k.result(id)).collect();
        pipe.cmd("MGET").arg(errors).cmd("MGET").arg(results);
    }
    let replies: Vec<Value> = pipe
        .query_async(&mut inner.link.conn())
        .await
        .map_err(|e| Error::redis("polling for answers", e))?;
    let now_ms = redis_time_ms(&replies[0])?;
    if entry::int(&replies[1]) == Some(0) {
        inner.table.lock().unwrap().loss_suspected = true;
    }
    let mut found_keys = Vec::new();
    let mut answered = Vec::new();
    let mut expired = Vec::new();
    for (c, chunk) in snapshot.chunks(MGET_CHUNK).enumerate() {
        let errors = entry::array(&replies[2 + 2 * c]);
        let results = entry::array(&replies[3 + 2 * c]);
        for (i, (token, id, deadline)) in chunk.iter().enumerate() {
            let err = errors.get(i).and_then(entry::bytes);
            let res = results.get(i).and_then(entry::bytes);
            // Both are deleted: the error wins, and a result beside it is never read.
            if err.is_some() {
                found_keys.push(k.error(id));
            }
            if res.is_some() {
                found_keys.push(k.result(id));
            }
            if let Some(text) = err {
                let text = String::from_utf8_lossy(text).into_owned();
                answered.push((*token, "error", Err(Error::new(ErrorKind::Remote, text))));
            } else if let Some(json) = res {
                answered.push((*token, "ok", Ok(json.to_vec())));
            } else if now_ms > *deadline {
                expired.push((*token, id.clone()));
            }
        }
    }
    // Deleted before the callers hear: a caller that exits at once leaves nothing.
    if !found_keys.is_empty() {
        let r: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(&found_keys)
            .query_async(&mut inner.link.conn())
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %format_args!("{e:#}"), "deleting answer keys failed; they expire");
        }
    }
    for (token, label, r) in answered {
        inner.resolve(token, label, r);
    }
    if !expired.is_empty() {
        let timeout = inner.config.request_timeout;
        let ids: Vec<String> = expired.iter().map(|(_, id)| id.clone()).collect();
        // Withdrawn before the callers hear (a consumer still working on them loses them,
        // and its answer is dropped).
        if let Err(e) = withdraw(inner, &ids).await {
            tracing::debug!(error = %format_args!("{e:#}"), "withdrawing timed-out requests failed");
        }
        for (token, id) in expired {
            inner.resolve(
                token,
                "failed",
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("{TIMEOUT_TEXT} (entry {id}: no answer within {timeout:?} by the Redis clock)"),
                )),
            );
        }
    }
    Ok(())
}

fn redis_time_ms(v: &Value) -> Result<u64> {
    let parts = entry::array(v);
    let secs = parts.first().and_then(entry::int);
    let micros = parts.get(1).and_then(entry::int);
    match (secs, micros) {
        (Some(s), Some(us)) => Ok(s as u64 * 1000 + us as u64 / 1000),
        _ => Err(Error::new(ErrorKind::Redis, "unexpected answer to TIME")),
    }
}

/// Takes requests out of the stream: XACK + XDEL, atomically (a consumer that holds
/// one finds it gone, and its answer is dropped without leaving a key).
pub(super) async fn withdraw(inner: &Inner, ids: &[String]) -> Result<()> {
    let k = &inner.link.keys;
    let mut pipe = redis::pipe();
    pipe.atomic();
    for chunk in ids.chunks(1000) {
        pipe.cmd("XACK")
            .arg(&k.stream)
            .arg(k.group())
            .arg(chunk)
            .ignore();
        pipe.cmd("XDEL").arg(&k.stream).arg(chunk).ignore();
    }
    let _: () = pipe
        .query_async(&mut inner.link.conn())
        .await
        .map_err(|e| Error::redis("withdrawing requests", e))?;
    Ok(())
}

/// Checks that requests outstanding longer than the verify interval (all of them when
/// the stream was seen missing) still exist; a request lost with the stream is
/// submitted again while it has time and resubmissions left, or fails.
async fn verify(inner: &Inner, all: bool) -> Result<()> {
    let age = inner.config.verify_interval;
    let candidates: Vec<(u64, String)> = inner
        .table
        .lock()
        .unwrap()
        .waiting
        .iter()
        .filter(|(_, w)| all || w.started.elapsed() >= age)
        .map(|(t, w)| (*t, w.id.clone()))
        .collect();
    if candidates.is_empty() {
        return Ok(());
    }
    let link = &inner.link;
    let k = &link.keys;
    let mut lost = Vec::new();
    for chunk in candidates.chunks(MGET_CHUNK) {
        let mut inv = link.scripts.verify.prepare_invoke();
        inv.key(&k.stream)
            .key(&k.result_prefix)
            .key(&k.error_prefix)
            .arg(k.group());
        for (_, id) in chunk {
            inv.arg(id);
        }
        let alive: Vec<i64> = inv
            .invoke_async(&mut link.conn())
            .await
            .map_err(|e| Error::redis("checking outstanding requests", e))?;
        for ((token, id), a) in chunk.iter().zip(alive) {
            if a == 0 {
                lost.push((*token, id.clone()));
            }
        }
    }
    for (token, old) in lost {
        let body = {
            let t = inner.table.lock().unwrap();
            match t.waiting.get(&token) {
                Some(w) if w.id == old && w.resubmits < inner.config.max_resubmits => {
                    Some(w.body.clone())
                }
                Some(w) if w.id == old => None,
                _ => continue,
            }
        };
        let Some(body) = body else {
            inner.resolve(
                token,
                "failed",
                Err(Error::new(
                    ErrorKind::Cancelled,
                    format!(
                        "the request's stream entry {old} was lost (the stream was deleted or \
                         flushed) {} times; giving up",
                        inner.config.max_resubmits + 1
                    ),
                )),
            );
            continue;
        };
        tracing::warn!(entry = %old, "a request was lost with the stream; submitting it again");
        match xadd(inner, &body).await {
            Ok(id) => {
                let mut t = inner.table.lock().unwrap();
                if let Some(w) = t.waiting.get_mut(&token) {
                    w.id = id;
                    w.resubmits += 1;
                }
            }
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), "submitting a lost request again failed");
                inner.table.lock().unwrap().loss_suspected = true;
            }
        }
    }
    Ok(())
}

/// Trims the stream below its oldest pending entry (`nitro_trim.lua`).
async fn trim(inner: &Inner) {
    let link = &inner.link;
    let r: redis::RedisResult<i64> = link
        .scripts
        .trim
        .key(&link.keys.stream)
        .arg(link.keys.group())
        .invoke_async(&mut link.conn())
        .await;
    match r {
        Ok(n) if n > 0 => tracing::debug!(trimmed = n, "trimmed the stream"),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %format_args!("{e:#}"), "trimming the stream failed"),
    }
}

/// The time part of an entry id, in ms.
pub(super) fn id_ms(id: &str) -> Option<u64> {
    id.split_once('-').and_then(|(t, _)| t.parse().ok())
}
