//! A Nitro stream at a glance: what `pelican nitro stats` shows.

use super::config::StreamConfig;
use super::link::Link;
use crate::error::{Error, Result};
use crate::protocol::entry;
use redis::Value;
use serde::Serialize;

/// A Nitro stream at a glance.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct StreamStats {
    /// The stream's name.
    pub stream: String,
    /// Whether the stream exists.
    pub exists: bool,
    /// Entries in the stream (waiting, in work, or answered and not deleted yet).
    pub length: u64,
    /// The consumer group (named like the stream), if it exists.
    pub group: Option<GroupStats>,
    /// The group's consumers (Nitro's UUIDs, pelican's `<host>-<pid>-<random>`, and the
    /// UUIDs Nitro's producers register when they reap).
    pub consumers: Vec<ConsumerStats>,
    /// `result-key:<stream>.*` keys: answers not read yet (or orphaned).
    pub result_keys: u64,
    /// `error-key:<stream>.*.error` keys.
    pub error_keys: u64,
    /// Dedup jobs in flight (pelican consumers with dedup on).
    pub dedup_jobs: u64,
    /// Answers in the dedup cache.
    pub dedup_cached: u64,
}

/// The consumer group.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct GroupStats {
    /// The last entry delivered to a consumer.
    pub last_delivered_id: String,
    /// Entries delivered and not answered (the pending list).
    pub pending: u64,
    /// Entries not yet delivered, if Redis knows (7.0 or newer).
    pub lag: Option<u64>,
    /// The oldest pending entry.
    pub oldest_pending_id: Option<String>,
    /// Its idle time, in ms.
    pub oldest_pending_idle_ms: Option<u64>,
    /// Its owner.
    pub oldest_pending_owner: Option<String>,
}

/// One consumer of the group.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Its name.
    pub name: String,
    /// Entries it holds.
    pub pending: u64,
    /// Time since it last read or claimed, in ms.
    pub idle_ms: u64,
}

/// Gathers a stream's statistics. Reads only; scans the answer keys (fine for an
/// operator's tool, not for a hot path).
pub async fn stats(stream: &StreamConfig) -> Result<StreamStats> {
    let link = Link::connect(stream).await?;
    let k = &link.keys;
    let mut conn = link.conn();
    let fail = |e| Error::redis("reading the stream's stats", e);
    let mut st = StreamStats {
        stream: k.stream.clone(),
        ..StreamStats::default()
    };
    st.exists = redis::cmd("EXISTS")
        .arg(&k.stream)
        .query_async::<i64>(&mut conn)
        .await
        .map_err(fail)?
        == 1;
    if st.exists {
        st.length = redis::cmd("XLEN")
            .arg(&k.stream)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&k.stream)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        for g in entry::array(&groups) {
            let f = entry::fields(g);
            let get = |n: &str| f.iter().find(|(k, _)| k == n).map(|(_, v)| v);
            if get("name").and_then(entry::string).as_deref() != Some(k.group()) {
                continue;
            }
            let mut gs = GroupStats {
                last_delivered_id: get("last-delivered-id")
                    .and_then(entry::string)
                    .unwrap_or_default(),
                pending: entry::field_u64(&f, "pending"),
                lag: get("lag").and_then(entry::int).map(|n| n.max(0) as u64),
                ..GroupStats::default()
            };
            if gs.pending > 0 {
                let p: Value = redis::cmd("XPENDING")
                    .arg(&k.stream)
                    .arg(k.group())
                    .arg("-")
                    .arg("+")
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .map_err(fail)?;
                if let Some(first) = entry::array(&p).first() {
                    let e = entry::array(first);
                    gs.oldest_pending_id = e.first().and_then(entry::string);
                    gs.oldest_pending_owner = e.get(1).and_then(entry::string);
                    gs.oldest_pending_idle_ms =
                        e.get(2).and_then(entry::int).map(|n| n.max(0) as u64);
                }
            }
            st.group = Some(gs);
            let cs: Value = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(&k.stream)
                .arg(k.group())
                .query_async(&mut conn)
                .await
                .map_err(fail)?;
            for c in entry::array(&cs) {
                let f = entry::fields(c);
                st.consumers.push(ConsumerStats {
                    name: f
                        .iter()
                        .find(|(k, _)| k == "name")
                        .and_then(|(_, v)| entry::string(v))
                        .unwrap_or_default(),
                    pending: entry::field_u64(&f, "pending"),
                    idle_ms: entry::field_u64(&f, "idle"),
                });
            }
        }
    }
    let [results, errors, jobs, cached] = k.patterns();
    st.result_keys = count(&mut conn, &results).await?;
    st.error_keys = count(&mut conn, &errors).await?;
    st.dedup_jobs = count(&mut conn, &jobs).await?;
    st.dedup_cached = count(&mut conn, &cached).await?;
    Ok(st)
}

async fn count(conn: &mut crate::conn::Conn, pattern: &str) -> Result<u64> {
    let mut cursor: u64 = 0;
    let mut n = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| Error::redis("SCAN", e))?;
        n += keys.len() as u64;
        if next == 0 {
            return Ok(n);
        }
        cursor = next;
    }
}
