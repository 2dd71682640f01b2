//! Dead letters: list, requeue, purge.

use crate::clock::{ms, now_ms};
use crate::error::{Error, Result};
use crate::protocol::entry::parse_entries;
use crate::protocol::scripts::Requeue;
use crate::shared::Shared;
use redis::Value;
use serde::Serialize;
use std::time::Duration;

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// The request stream entry it came from.
    pub entry: String,
    /// Why it is dead.
    pub reason: String,
    /// How often it was delivered.
    pub deliveries: u64,
    /// The last consumer that held it.
    pub consumer: String,
    /// When it died, ms since the epoch.
    pub dead_at_ms: u64,
    /// Its request id, if it had one.
    pub rid: Option<String>,
    /// Body size in bytes (a body over `max_body_bytes` is not kept, only its size).
    pub body_len: usize,
    /// The first bytes of the body, lossy UTF-8.
    pub body_preview: String,
    /// The partition it belongs to (0 for a queue of one partition).
    pub partition: u32,
}

/// The oldest `count` dead letters.
pub(super) async fn dead_letters(sh: &Shared, count: usize) -> Result<Vec<DeadLetter>> {
    let v: Value = redis::cmd("XRANGE")
        .arg(&sh.keys.dead)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(count)
        .query_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("reading dead letters", e))?;
    Ok(parse_entries(&v)
        .into_iter()
        .map(|e| {
            let s = |n: &str| e.get_str(n).unwrap_or("").to_string();
            let body = e.get("body").unwrap_or(&[]);
            let preview_len = body.len().min(120);
            DeadLetter {
                id: e.id.clone(),
                entry: s("entry"),
                reason: s("reason"),
                deliveries: s("deliveries").parse().unwrap_or(0),
                consumer: s("consumer"),
                dead_at_ms: s("dead_at").parse().unwrap_or(0),
                rid: e.get_str("rid").map(str::to_string),
                body_len: e
                    .get_str("body_bytes")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(body.len()),
                body_preview: String::from_utf8_lossy(&body[..preview_len]).into_owned(),
                partition: sh.partition,
            }
        })
        .collect())
}

/// Puts dead letters back on the queue as fresh requests (new deadline
/// `now + timeout`, delivery count from zero). Returns, per id, the new stream entry
/// id, or `None` when there was no such dead letter (or it had no body).
pub(super) async fn requeue(
    sh: &Shared,
    ids: &[String],
    timeout: Duration,
) -> Result<Vec<(String, Option<String>)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(bad) = ids.iter().find(|id| !is_stream_id(id)) {
        return Err(Error::config(format!(
                "{bad:?} is not a dead-letter id; ids look like 1700000000000-0 (see `pelican dead list`)"
            )));
    }
    sh.ensure_group().await?;
    let now = now_ms();
    Requeue {
        now_ms: now,
        deadline_ms: now + ms(timeout),
        result_ttl_ms: ms(sh.queue.result_ttl),
    }
    .call(&sh.scripts, ids.iter().map(String::as_str))
    .invoke(&mut sh.conn())
    .await
    .map_err(|e| Error::redis("requeueing dead letters", e))
}

/// Requeues every dead letter; returns how many were requeued.
pub(super) async fn requeue_all(sh: &Shared, timeout: Duration) -> Result<usize> {
    let mut total = 0;
    loop {
        let batch: Vec<String> = dead_letters(sh, 500)
            .await?
            .into_iter()
            .map(|d| d.id)
            .collect();
        if batch.is_empty() {
            return Ok(total);
        }
        let done = requeue(sh, &batch, timeout).await?;
        let n = done.iter().filter(|(_, s)| s.is_some()).count();
        total += n;
        if n == 0 {
            // only entries without a body remain: leave them for inspection
            return Ok(total);
        }
    }
}

/// Deletes the dead-letter stream; returns how many letters it held.
pub(super) async fn purge_dead(sh: &Shared) -> Result<u64> {
    let (n, _): (u64, i64) = redis::pipe()
        .cmd("XLEN")
        .arg(&sh.keys.dead)
        .cmd("DEL")
        .arg(&sh.keys.dead)
        .query_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("purging dead letters", e))?;
    Ok(n)
}

/// `<ms>-<seq>`, both decimal.
pub(super) fn is_stream_id(id: &str) -> bool {
    match id.split_once('-') {
        Some((ms, seq)) => {
            !ms.is_empty()
                && !seq.is_empty()
                && ms.bytes().all(|b| b.is_ascii_digit())
                && seq.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}
