//! Looking inside a queue, and the operator's tools: stats, dead letters, requeue,
//! purge, janitor, destroy.

use crate::config::QueueConfig;
use crate::entry::{self, parse_entries};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::Keys;
use crate::outcome::Outcome;
use crate::shared::{ms, now_ms, JanitorReport, Shared};
use redis::Value;
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Default lifetime of a requeued request: 5 minutes.
pub const DEFAULT_REQUEUE_TIMEOUT: Duration = Duration::from_secs(300);

/// An operator's handle on one queue. Creating it writes nothing to Redis.
pub struct Admin {
    shared: Arc<Shared>,
}

/// A queue at a glance.
#[derive(Debug, Clone, Default, Serialize)]
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
}

/// One consumer of the group.
#[derive(Debug, Clone, Serialize)]
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

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
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
}

/// What Redis knows of one request (see [`Admin::inspect`]).
#[derive(Debug, Clone, Serialize)]
pub struct RequestInfo {
    /// Request id.
    pub rid: String,
    /// `queued` (no consumer took it yet), `in_work` (a consumer holds it), `lost` (the
    /// index names an entry that is no longer in the stream: its producers' sweep submits
    /// it again, or it expires), or the outcome: `ok`, `error`, `dead`, `expired`,
    /// `cancelled`.
    pub state: String,
    /// Its stream entry (while in flight).
    pub entry: Option<String>,
    /// Its deadline, ms since the epoch (while in flight).
    pub deadline_ms: Option<u64>,
    /// Producers waiting for it (while in flight).
    pub waiters: Vec<String>,
    /// The consumer holding it (`in_work`).
    pub consumer: Option<String>,
    /// Time since that consumer took it or renewed its lease, in ms (`in_work`).
    pub idle_ms: Option<u64>,
    /// Deliveries so far, this one included (`in_work`).
    pub deliveries: Option<u64>,
    /// Size of its body in bytes (while its entry is in the stream).
    pub body_len: Option<usize>,
    /// The response or the error message, first bytes, lossy UTF-8 (once finished).
    pub outcome_preview: Option<String>,
    /// How much longer Redis keeps this state, in ms (`None`: no expiry).
    pub ttl_ms: Option<u64>,
}

impl Admin {
    /// Connects to the queue's Redis (validating URL and name).
    pub async fn connect(queue: QueueConfig) -> Result<Admin> {
        Ok(Admin {
            shared: Shared::connect_only(&queue).await?,
        })
    }

    fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// Gathers the queue's statistics. Scans the queue's request keys: fine for an
    /// operator, not for a hot path.
    pub async fn stats(&self) -> Result<Stats> {
        let k = self.keys();
        let mut conn = self.shared.conn();
        let mut st = Stats {
            queue: self.shared.queue.name.clone(),
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
            let m = flat_map(&info);
            st.stream_length = get_u64(&m, "length");
            st.entries_added = get_u64(&m, "entries-added");
            let groups: Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&k.stream)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("XINFO GROUPS", e))?;
            for g in entry::array(&groups) {
                let gm = flat_map(g);
                if gm
                    .iter()
                    .any(|(n, v)| n == "name" && entry::string(v).as_deref() == Some(&k.group))
                {
                    st.pending = get_u64(&gm, "pending");
                    st.queued = get_u64(&gm, "lag");
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
                    let cm = flat_map(c);
                    st.consumers.push(ConsumerStats {
                        name: cm
                            .iter()
                            .find(|(n, _)| n == "name")
                            .and_then(|(_, v)| entry::string(v))
                            .unwrap_or_default(),
                        pending: get_u64(&cm, "pending"),
                        idle_ms: get_u64(&cm, "idle"),
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
        for key in self.scan(&format!("{}*", k.req_prefix)).await? {
            let v: Option<Vec<u8>> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("GET", e))?;
            let Some(v) = v else { continue };
            if v.first() == Some(&b'P') {
                let text = String::from_utf8_lossy(&v[1..]).into_owned();
                let parts: Vec<&str> = text.split(';').collect();
                let waiters: Vec<String> = parts
                    .iter()
                    .skip(2)
                    .filter(|p| !p.is_empty())
                    .map(|p| p.to_string())
                    .collect();
                producers.extend(waiters.iter().cloned());
                st.in_flight.push(InFlight {
                    rid: key[k.req_prefix.len()..].to_string(),
                    entry: parts.first().unwrap_or(&"").to_string(),
                    deadline_ms: parts.get(1).and_then(|d| d.parse().ok()).unwrap_or(0),
                    waiters,
                });
            } else {
                st.cached_results += 1;
            }
        }
        st.waiting_producers = producers.len() as u64;
        st.reply_streams = self.scan(&format!("{}*", k.reply_prefix)).await?.len() as u64;
        Ok(st)
    }

    /// What Redis knows of request `rid`: whether it waits, who holds it and for how
    /// long, how often it was delivered, who waits for it; or its cached outcome.
    /// `None` when Redis knows nothing of it: never submitted, finished longer than
    /// `result_ttl` ago, expired, or submitted with dedup off (no index to look it up).
    pub async fn inspect(&self, rid: &str) -> Result<Option<RequestInfo>> {
        crate::config::validate_request_id(rid)?;
        let k = self.keys();
        let mut conn = self.shared.conn();
        let key = k.req(rid);
        let (value, pttl): (Option<Vec<u8>>, i64) = redis::pipe()
            .cmd("GET")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("reading the request", e))?;
        let Some(value) = value else { return Ok(None) };
        let mut info = RequestInfo {
            rid: rid.to_string(),
            state: String::new(),
            entry: None,
            deadline_ms: None,
            waiters: Vec::new(),
            consumer: None,
            idle_ms: None,
            deliveries: None,
            body_len: None,
            outcome_preview: None,
            ttl_ms: u64::try_from(pttl).ok(),
        };
        if value.first() != Some(&b'P') {
            let Some(o) = Outcome::decode(&value) else {
                return Err(Error::new(
                    ErrorKind::Redis,
                    format!("{key} holds neither a pending state nor an outcome"),
                ));
            };
            info.state = o.label().to_string();
            let payload = &value[1..];
            let n = payload.len().min(200);
            info.outcome_preview = Some(String::from_utf8_lossy(&payload[..n]).into_owned());
            return Ok(Some(info));
        }
        let text = String::from_utf8_lossy(&value[1..]).into_owned();
        let mut parts = text.split(';');
        let sid = parts.next().unwrap_or("").to_string();
        info.deadline_ms = parts.next().and_then(|d| d.parse().ok());
        info.waiters = parts
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let (found, pending): (Value, Value) = redis::pipe()
            .cmd("XRANGE")
            .arg(&k.stream)
            .arg(&sid)
            .arg(&sid)
            .cmd("XPENDING")
            .arg(&k.stream)
            .arg(&k.group)
            .arg(&sid)
            .arg(&sid)
            .arg(1)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("looking up the request's entry", e))?;
        let entry = parse_entries(&found).into_iter().next();
        info.body_len = entry.as_ref().and_then(|e| e.get("body")).map(<[u8]>::len);
        // [[id, consumer, idle, deliveries]] once delivered
        let held = entry::array(&pending)
            .first()
            .map(|p| entry::array(p).to_vec())
            .filter(|p| p.len() >= 4);
        info.state = match (&entry, &held) {
            (None, _) => "lost",
            (Some(_), Some(_)) => "in_work",
            (Some(_), None) => "queued",
        }
        .to_string();
        if let Some(p) = held {
            info.consumer = entry::string(&p[1]);
            info.idle_ms = entry::int(&p[2]).map(|i| i.max(0) as u64);
            info.deliveries = entry::int(&p[3]).map(|i| i.max(0) as u64);
        }
        info.entry = Some(sid);
        Ok(Some(info))
    }

    async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.shared.conn();
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("SCAN", e))?;
            out.extend(keys);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// The oldest `count` dead letters.
    pub async fn dead_letters(&self, count: usize) -> Result<Vec<DeadLetter>> {
        let v: Value = redis::cmd("XRANGE")
            .arg(&self.keys().dead)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.shared.conn())
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
                }
            })
            .collect())
    }

    /// Puts dead letters back on the queue as fresh requests (new deadline
    /// `now + timeout`, delivery count from zero). Returns, per id, the new stream entry
    /// id, or `None` when there was no such dead letter (or it had no body).
    pub async fn requeue(
        &self,
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
        let sh = &self.shared;
        sh.ensure_group().await?;
        let now = now_ms();
        let mut inv = sh.scripts.requeue.prepare_invoke();
        inv.key(&sh.keys.stream)
            .key(&sh.keys.dead)
            .key(&sh.keys.req_prefix)
            .arg(now)
            .arg(now + ms(timeout))
            .arg(ms(sh.queue.result_ttl));
        for id in ids {
            inv.arg(id);
        }
        let flat: Vec<String> = inv
            .invoke_async(&mut sh.conn())
            .await
            .map_err(|e| Error::redis("requeueing dead letters", e))?;
        Ok(flat
            .chunks(2)
            .map(|c| {
                let new = c.get(1).filter(|s| !s.is_empty()).cloned();
                (c[0].clone(), new)
            })
            .collect())
    }

    /// Requeues every dead letter; returns how many were requeued.
    pub async fn requeue_all(&self, timeout: Duration) -> Result<usize> {
        let mut total = 0;
        loop {
            let batch: Vec<String> = self
                .dead_letters(500)
                .await?
                .into_iter()
                .map(|d| d.id)
                .collect();
            if batch.is_empty() {
                return Ok(total);
            }
            let done = self.requeue(&batch, timeout).await?;
            let n = done.iter().filter(|(_, s)| s.is_some()).count();
            total += n;
            if n == 0 {
                // only entries without a body remain: leave them for inspection
                return Ok(total);
            }
        }
    }

    /// Deletes the dead-letter stream; returns how many letters it held.
    pub async fn purge_dead(&self) -> Result<u64> {
        let (n, _): (u64, i64) = redis::pipe()
            .cmd("XLEN")
            .arg(&self.keys().dead)
            .cmd("DEL")
            .arg(&self.keys().dead)
            .query_async(&mut self.shared.conn())
            .await
            .map_err(|e| Error::redis("purging dead letters", e))?;
        Ok(n)
    }

    /// Runs the janitor now (unless another process ran it within the interval).
    pub async fn janitor(&self) -> Result<JanitorReport> {
        self.shared.janitor("admin").await
    }

    /// Deletes every key of the queue; returns how many. For tests and benchmarks:
    /// producers and consumers still attached lose their state.
    pub async fn destroy(&self) -> Result<u64> {
        let keys = self.scan(&self.shared.keys.pattern()).await?;
        let mut n = 0;
        for chunk in keys.chunks(500) {
            let d: u64 = redis::cmd("DEL")
                .arg(chunk)
                .query_async(&mut self.shared.conn())
                .await
                .map_err(|e| Error::redis("deleting the queue's keys", e))?;
            n += d;
        }
        Ok(n)
    }
}

/// `<ms>-<seq>`, both decimal.
fn is_stream_id(id: &str) -> bool {
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

fn flat_map(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((entry::string(k)?, v.clone())))
            .collect(),
        _ => entry::array(v)
            .chunks(2)
            .filter_map(|c| Some((entry::string(c.first()?)?, c.get(1)?.clone())))
            .collect(),
    }
}

fn get_u64(m: &[(String, Value)], name: &str) -> u64 {
    m.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| entry::int(v))
        .unwrap_or(0)
        .max(0) as u64
}
