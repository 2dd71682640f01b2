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
    let entries = parse_entries(&v);
    // Stored bodies (field bref): their length and first bytes, in one round trip.
    let stored: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].get("bref") == Some(b"1"))
        .collect();
    let mut previews: Vec<(usize, Vec<u8>)> = Vec::new();
    if !stored.is_empty() {
        let mut pipe = redis::pipe();
        for &i in &stored {
            let key = sh.keys.dead_body(&entries[i].id);
            pipe.cmd("STRLEN")
                .arg(&key)
                .cmd("GETRANGE")
                .arg(&key)
                .arg(0)
                .arg(119);
        }
        let flat: Vec<Value> = pipe
            .query_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("reading dead letters' bodies", e))?;
        previews = flat
            .chunks(2)
            .map(|c| {
                let n = crate::protocol::entry::int(&c[0]).unwrap_or(0).max(0) as usize;
                let b = crate::protocol::entry::bytes(&c[1]).unwrap_or(&[]).to_vec();
                (n, b)
            })
            .collect();
    }
    let mut previews = stored.into_iter().zip(previews).peekable();
    Ok(entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let s = |n: &str| e.get_str(n).unwrap_or("").to_string();
            let (len, preview) = match previews.next_if(|(at, _)| *at == i) {
                Some((_, (n, b))) => (n, b),
                None => {
                    let body = e.get("body").unwrap_or(&[]);
                    let n = e
                        .get_str("body_bytes")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(body.len());
                    (n, body[..body.len().min(120)].to_vec())
                }
            };
            DeadLetter {
                id: e.id.to_string(),
                entry: s("entry"),
                reason: s("reason"),
                deliveries: s("deliveries").parse().unwrap_or(0),
                consumer: s("consumer"),
                dead_at_ms: s("dead_at").parse().unwrap_or(0),
                rid: e.rid().map(str::to_string),
                body_len: len,
                body_preview: String::from_utf8_lossy(&preview).into_owned(),
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

/// Deletes the dead-letter stream and the bodies stored for its letters; returns how
/// many letters it held.
pub(super) async fn purge_dead(sh: &Shared) -> Result<u64> {
    // The stored bodies first, a page at a time (their letters name them); a letter
    // added meanwhile keeps its body until the body's own ttl.
    let mut from = "-".to_string();
    loop {
        let v: Value = redis::cmd("XRANGE")
            .arg(&sh.keys.dead)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(500)
            .query_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("purging dead letters", e))?;
        let page = parse_entries(&v);
        let Some(last) = page.last() else { break };
        from = format!("({}", last.id);
        let bodies: Vec<String> = page
            .iter()
            .filter(|e| e.get("bref") == Some(b"1"))
            .map(|e| sh.keys.dead_body(&e.id))
            .collect();
        if !bodies.is_empty() {
            redis::cmd("DEL")
                .arg(&bodies)
                .query_async::<i64>(&mut sh.conn())
                .await
                .map_err(|e| Error::redis("purging dead letters' bodies", e))?;
        }
        if page.len() < 500 {
            break;
        }
    }
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

/// `<ms>-<seq>`, both decimal within 64 bits (Redis refuses more: that is bad input, not
/// a Redis fault).
pub(super) fn is_stream_id(id: &str) -> bool {
    let number = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u64>().is_ok()
    };
    match id.split_once('-') {
        Some((ms, seq)) => number(ms) && number(seq),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_ids_are_read_whole() {
        assert!(super::is_stream_id("1700000000000-0"));
        assert!(super::is_stream_id(
            "18446744073709551615-18446744073709551615"
        ));
        for bad in [
            "18446744073709551616-0",
            "1-18446744073709551616",
            "1-",
            "-1",
            "1-2-3",
            "+1-1",
            "1",
        ] {
            assert!(!super::is_stream_id(bad), "{bad}");
        }
    }
}
