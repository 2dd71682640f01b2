//! A queue at a glance: what `pelican stats` shows.

use crate::error::{Error, Result};
use crate::protocol::entry;
use crate::protocol::index::IndexValue;
use crate::shared::Shared;
use redis::Value;
use serde::Serialize;
use std::collections::BTreeSet;

/// A queue at a glance.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Queue name.
    pub queue: String,
    /// Entries in the request stream (queued, in work, or acknowledged and not trimmed yet).
    pub stream_length: u64,
    /// Entries ever added to the stream.
    pub entries_added: u64,
    /// Entries not yet delivered to any consumer.
    pub queued: u64,
    /// Entries delivered and not yet answered (in the group's pending list).
    pub pending: u64,
    /// Idle time of the oldest pending entry, in ms.
    pub oldest_pending_idle_ms: Option<u64>,
    /// Consumers of the group.
    pub consumers: Vec<ConsumerStats>,
    /// Requests in flight (indexed ones: dedup on).
    pub in_flight: Vec<InFlight>,
    /// Distinct producers waiting on indexed requests.
    pub waiting_producers: u64,
    /// Reply streams (one per live producer).
    pub reply_streams: u64,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// Outcomes cached for `result_ttl`.
    pub cached_results: u64,
    /// Which partition these figures are of (`None`: the whole queue).
    pub partition: Option<u32>,
    /// With several partitions, the figures of each (the fields above are the totals);
    /// empty for a queue of one partition.
    pub partitions: Vec<Stats>,
}

/// One consumer of the group.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Its name (`<host>-<pid>-<random>` by default).
    pub name: String,
    /// Entries it holds.
    pub pending: u64,
    /// Time since it last read or claimed, in ms.
    pub idle_ms: u64,
}

/// A request in flight.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct InFlight {
    /// Request id.
    pub rid: String,
    /// Its stream entry.
    pub entry: String,
    /// Deadline, ms since the epoch.
    pub deadline_ms: u64,
    /// Producers waiting for it.
    pub waiters: Vec<String>,
}

/// Gathers the queue's statistics (see [`super::Admin::stats`]).
pub(super) async fn gather(sh: &Shared) -> Result<Stats> {
    let k = &sh.keys;
    let mut conn = sh.conn();
    let mut st = Stats {
        queue: sh.queue.name.clone(),
        ..Stats::default()
    };
    let exists: bool = redis::cmd("EXISTS")
        .arg(&k.stream)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::redis("reading stats", e))?;
    if exists {
        let info: Value = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&k.stream)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("XINFO STREAM", e))?;
        let m = entry::fields(&info);
        st.stream_length = entry::field_u64(&m, "length");
        st.entries_added = entry::field_u64(&m, "entries-added");
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&k.stream)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("XINFO GROUPS", e))?;
        for g in entry::array(&groups) {
            let gm = entry::fields(g);
            if gm
                .iter()
                .any(|(n, v)| n == "name" && entry::string(v).as_deref() == Some(&k.group))
            {
                st.pending = entry::field_u64(&gm, "pending");
                st.queued = entry::field_u64(&gm, "lag");
            }
        }
        if st.pending > 0 {
            let p: Value = redis::cmd("XPENDING")
                .arg(&k.stream)
                .arg(&k.group)
                .arg("-")
                .arg("+")
                .arg(1)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("XPENDING", e))?;
            st.oldest_pending_idle_ms = entry::array(&p)
                .first()
                .and_then(|e| entry::array(e).get(2).and_then(entry::int))
                .map(|i| i as u64);
        }
        let cs: redis::RedisResult<Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&k.stream)
            .arg(&k.group)
            .query_async(&mut conn)
            .await;
        if let Ok(cs) = cs {
            for c in entry::array(&cs) {
                let cm = entry::fields(c);
                st.consumers.push(ConsumerStats {
                    name: cm
                        .iter()
                        .find(|(n, _)| n == "name")
                        .and_then(|(_, v)| entry::string(v))
                        .unwrap_or_default(),
                    pending: entry::field_u64(&cm, "pending"),
                    idle_ms: entry::field_u64(&cm, "idle"),
                });
            }
        }
    }
    st.dead_letters = redis::cmd("XLEN")
        .arg(&k.dead)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::redis("XLEN", e))?;
    let mut producers = BTreeSet::new();
    for key in sh.scan(&format!("{}*", k.req_prefix)).await? {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("GET", e))?;
        let Some(v) = v else { continue };
        match IndexValue::decode(&v) {
            Some(IndexValue::Pending(p)) => {
                producers.extend(p.waiters.iter().cloned());
                st.in_flight.push(InFlight {
                    rid: key[k.req_prefix.len()..].to_string(),
                    entry: p.sid,
                    deadline_ms: p.deadline_ms,
                    waiters: p.waiters,
                });
            }
            Some(IndexValue::Done(_)) => st.cached_results += 1,
            None => {}
        }
    }
    st.waiting_producers = producers.len() as u64;
    st.reply_streams = sh.scan(&format!("{}*", k.reply_prefix)).await?.len() as u64;
    Ok(st)
}

/// The whole queue's figures from its partitions': sums, the oldest pending age, each
/// consumer once (what it holds in every partition, its shortest idle time), and each
/// waiting producer once.
pub(super) fn total(mut parts: Vec<Stats>) -> Stats {
    if parts.len() == 1 {
        let mut only = parts.remove(0);
        only.partition = None;
        return only;
    }
    let mut t = Stats {
        queue: parts.first().map(|p| p.queue.clone()).unwrap_or_default(),
        ..Stats::default()
    };
    let mut consumers: std::collections::BTreeMap<String, ConsumerStats> = Default::default();
    let mut producers = BTreeSet::new();
    for p in &parts {
        t.stream_length += p.stream_length;
        t.entries_added += p.entries_added;
        t.queued += p.queued;
        t.pending += p.pending;
        t.oldest_pending_idle_ms = t.oldest_pending_idle_ms.max(p.oldest_pending_idle_ms);
        t.in_flight.extend(p.in_flight.iter().cloned());
        t.reply_streams += p.reply_streams;
        t.dead_letters += p.dead_letters;
        t.cached_results += p.cached_results;
        for f in &p.in_flight {
            producers.extend(f.waiters.iter().cloned());
        }
        for c in &p.consumers {
            consumers
                .entry(c.name.clone())
                .and_modify(|m| {
                    m.pending += c.pending;
                    m.idle_ms = m.idle_ms.min(c.idle_ms);
                })
                .or_insert_with(|| c.clone());
        }
    }
    t.consumers = consumers.into_values().collect();
    t.waiting_producers = producers.len() as u64;
    t.partitions = parts;
    t
}
