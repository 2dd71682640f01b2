//! Samples every queue once a second and keeps a bounded history for the charts.
//!
//! Per partition (key tag) one pipeline of O(1) commands: `XLEN` of the dead letters,
//! `XINFO STREAM` (length, entries added, first entry id), `XINFO GROUPS` (lag),
//! `XPENDING` summary (in flight, oldest in-flight entry), `XINFO CONSUMERS`, `TIME` (the
//! node's clock: on a cluster each master stamps its own entry ids); then, when
//! requests are queued, `XRANGE` of the first one after the group's last delivered
//! entry. No key scans (those are what makes `pelican stats` slow on a busy queue); the
//! queue list is refreshed by a SCAN every [`DISCOVER_EVERY`] samples.
//!
//! Throughput comes from counter deltas: *submitted/s* is the change of the stream's
//! entries-added counter; *finished/s* is submitted minus the change of the stream's
//! length (pelican removes an entry once it is answered, dead-lettered, expired or
//! withdrawn: at once, or by a trim within about a second, docs/PROTOCOL.md, "Finished
//! entries leave the stream"). Latency is read from entry ids, which carry Redis's clock
//! at submission: the *oldest request* is the age of the oldest request queued or in
//! work (the longest anyone has been waiting now; not the stream's first entry, which
//! may be a finished one waiting for the trim), *oldest in flight* the age of the
//! oldest delivered, unanswered entry. Both are compared with Redis's own `TIME`, so
//! clock skew between this host and Redis does not matter.

use super::discover::{self, Found};
use super::link::Link;
use super::reply;
use pelican::admin::Keys;
use redis::{RedisResult, Value};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::time::MissedTickBehavior;

/// Time between two samples.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept per queue: five minutes.
pub const HISTORY: usize = 300;
/// The queue list is refreshed every this many samples (a SCAN of the key space).
pub const DISCOVER_EVERY: u64 = 10;

/// One consumer of a partition's group.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerNow {
    /// Its name.
    pub name: String,
    /// The partition (key tag) whose group it belongs to.
    pub partition: String,
    /// Entries it holds.
    pub pending: u64,
    /// Time since it last read, claimed or renewed, in ms.
    pub idle_ms: u64,
}

/// One partition (key tag) of a queue, as last sampled.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartitionNow {
    /// The key tag (`Q`, or `Q#p` for partition p).
    pub tag: String,
    /// On a cluster, the master (`host:port`) that served the partition's slot when the
    /// queues were last looked for; `None` on one node.
    pub node: Option<String>,
    /// Entries in the request stream.
    pub length: u64,
    /// Entries ever added to the stream.
    pub entries_added: u64,
    /// Entries not delivered yet.
    pub queued: u64,
    /// Entries delivered and not answered.
    pub in_flight: u64,
    /// Submission time (Redis clock, ms) of the oldest entry in flight.
    pub oldest_in_flight_at_ms: Option<u64>,
    /// Submission time (Redis clock, ms) of the oldest request queued or in flight.
    pub oldest_entry_at_ms: Option<u64>,
    /// Dead letters.
    pub dead_letters: u64,
    /// The group's consumers.
    pub consumers: Vec<ConsumerNow>,
    /// Redis's clock (`TIME`, ms) on the partition's node when it was sampled: ages and
    /// rates are read against the clock of the node that stamped the entry ids (on a
    /// cluster, each master has its own).
    pub clock_ms: Option<u64>,
    /// Age of the oldest request queued or in flight, ms.
    pub oldest_request_ms: Option<u64>,
}

/// A queue now: its partitions added up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueNow {
    /// Queue name.
    pub name: String,
    /// Its key tags (one, unless the queue is partitioned).
    pub partitions: Vec<String>,
    /// Requests not delivered yet.
    pub queued: u64,
    /// Requests delivered and not answered.
    pub in_flight: u64,
    /// Consumers (distinct names over the partitions).
    pub consumers: u64,
    /// Age of the oldest request in flight (since submission), ms.
    pub oldest_in_flight_ms: Option<u64>,
    /// Age of the oldest request in the stream (queued or in flight), ms.
    pub oldest_request_ms: Option<u64>,
    /// Dead letters.
    pub dead_letters: u64,
    /// Requests ever submitted (entries added).
    pub entries_added: u64,
    /// Submitted per second over the last interval.
    pub submitted_per_s: f64,
    /// Finished (answered, dead-lettered, expired, withdrawn) per second.
    pub finished_per_s: f64,
}

/// One point of a queue's history.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Redis time of the sample, ms since the epoch.
    pub t: u64,
    /// Submitted per second.
    pub submitted: f64,
    /// Finished per second.
    pub finished: f64,
    /// Age of the oldest request in the stream, ms (0 when empty).
    pub oldest_ms: u64,
    /// Queued.
    pub queued: u64,
    /// In flight.
    pub in_flight: u64,
}

/// What is known of one queue.
#[derive(Debug, Clone, Default)]
pub struct QueueState {
    /// The latest numbers.
    pub now: QueueNow,
    /// Per partition, for the queue page (and a partitions breakdown).
    pub parts: Vec<PartitionNow>,
    /// Oldest first, at most [`HISTORY`] points.
    pub history: VecDeque<Point>,
    /// (its node's Redis time, entries added, stream length) per partition at the last
    /// sample.
    prev: BTreeMap<String, (u64, u64, u64)>,
}

/// Everything the dashboard shows, as last sampled.
#[derive(Debug, Default)]
pub struct Board {
    /// Queues by name.
    pub queues: BTreeMap<String, QueueState>,
    /// Redis time of the last good sample.
    pub sampled_at_ms: Option<u64>,
    /// Why the last sample failed (Redis down, ...); `None` when it worked.
    pub error: Option<String>,
    /// Look for queues again at the next sample.
    pub rediscover: bool,
    /// Times a sample failed after one that worked (Redis went away): a connection made
    /// before an outage is not trusted after it.
    pub outages: u64,
}

/// The board, shared between the sampler and the web server.
pub type SharedBoard = Arc<RwLock<Board>>;

/// Samples forever (the task is aborted with the dashboard).
pub async fn run(mut conn: Link, prefix: String, board: SharedBoard) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut found: Option<Found> = None;
    let mut nodes = Nodes::new();
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        let again = std::mem::take(&mut board.write().expect("board lock").rediscover);
        let result = async {
            if again || found.is_none() || n.is_multiple_of(DISCOVER_EVERY) {
                let f = discover::discover(&mut conn, &prefix).await?;
                nodes = nodes_of(&conn, &prefix, &f).await?;
                found = Some(f);
            }
            let found = found.as_ref().expect("discovered");
            sample_all(&mut conn, &prefix, found, &nodes).await
        }
        .await;
        n += 1;
        let mut b = board.write().expect("board lock");
        match result {
            Ok((t, sampled)) => {
                b.error = None;
                b.sampled_at_ms = Some(t);
                apply(&mut b, t, sampled);
            }
            Err(e) => {
                if b.error.is_none() {
                    b.outages += 1;
                }
                // Keep the last numbers; the page says they are stale and why.
                b.error = Some(format!("cannot read Redis: {e}"));
                found = None;
            }
        }
    }
}

/// Looks for queues now (a page asked for one not seen yet), and has the sampler pick
/// up the new list at its next sample.
pub async fn discover_now(
    conn: &mut Link,
    prefix: &str,
    board: &SharedBoard,
) -> RedisResult<Found> {
    let found = discover::discover(conn, prefix).await?;
    board.write().expect("board lock").rediscover = true;
    Ok(found)
}

type Sampled = BTreeMap<String, Vec<PartitionNow>>;
/// On a cluster: key tag -> the master serving its slot.
type Nodes = BTreeMap<String, String>;

/// Which master serves each partition found (one `CLUSTER SLOTS`; nothing on one node).
async fn nodes_of(conn: &Link, prefix: &str, found: &Found) -> RedisResult<Nodes> {
    let Link::Cluster(d) = conn else {
        return Ok(Nodes::new());
    };
    let tags: Vec<&String> = found.values().flatten().collect();
    let streams: Vec<String> = tags
        .iter()
        .map(|t| Keys::new(prefix, t).stream().to_string())
        .collect();
    let keys: Vec<&str> = streams.iter().map(String::as_str).collect();
    let masters = d.masters_of(&keys).await?;
    Ok(tags
        .into_iter()
        .zip(masters)
        .filter_map(|(t, m)| Some((t.clone(), m?)))
        .collect())
}

async fn sample_all(
    conn: &mut Link,
    prefix: &str,
    found: &Found,
    nodes: &Nodes,
) -> RedisResult<(u64, Sampled)> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let now = secs * 1000 + micros / 1000;
    let mut out = Sampled::new();
    for (queue, tags) in found {
        let mut parts = Vec::with_capacity(tags.len());
        for tag in tags {
            let mut p = sample_partition(conn, prefix, tag).await?;
            p.node = nodes.get(tag).cloned();
            parts.push(p);
        }
        out.insert(queue.clone(), parts);
    }
    Ok((now, out))
}

async fn sample_partition(conn: &mut Link, prefix: &str, tag: &str) -> RedisResult<PartitionNow> {
    let keys = Keys::new(prefix, tag);
    let replies: Vec<Value> = redis::pipe()
        .ignore_errors()
        .cmd("XLEN")
        .arg(keys.dead())
        .cmd("XINFO")
        .arg("STREAM")
        .arg(keys.stream())
        .cmd("XINFO")
        .arg("GROUPS")
        .arg(keys.stream())
        .cmd("XPENDING")
        .arg(keys.stream())
        .arg(keys.group())
        .cmd("XINFO")
        .arg("CONSUMERS")
        .arg(keys.stream())
        .arg(keys.group())
        .cmd("TIME")
        .query_async(conn)
        .await?;
    // A missing stream or group answers with an error: that part is simply empty. A
    // connection error fails the whole query above.
    let ok = |i: usize| {
        replies
            .get(i)
            .filter(|v| !matches!(v, Value::ServerError(_)))
    };
    let time = ok(5).map(reply::array).unwrap_or_default();
    let time_part = |i: usize| -> Option<u64> { reply::string(time.get(i)?)?.parse().ok() };
    let mut p = PartitionNow {
        tag: tag.to_string(),
        dead_letters: ok(0).and_then(reply::int).unwrap_or(0).max(0) as u64,
        clock_ms: time_part(0)
            .zip(time_part(1))
            .map(|(s, us)| s * 1000 + us / 1000),
        ..PartitionNow::default()
    };
    if let Some(info) = ok(1) {
        p.length = reply::field_u64(info, "length").unwrap_or(0);
        p.entries_added = reply::field_u64(info, "entries-added").unwrap_or(0);
        let first = reply::field(info, "recorded-first-entry-id")
            .and_then(reply::string)
            .or_else(|| {
                reply::field(info, "first-entry")
                    .and_then(|e| reply::array(e).first())
                    .and_then(reply::string)
            });
        if p.length > 0 {
            p.oldest_entry_at_ms = first.as_deref().and_then(reply::id_ms);
        }
    }
    let (mut lag, mut last_delivered) = (None, None);
    if let Some(groups) = ok(2) {
        for g in reply::array(groups) {
            if reply::field(g, "name").and_then(reply::string).as_deref() == Some(keys.group()) {
                lag = reply::field_u64(g, "lag");
                p.in_flight = reply::field_u64(g, "pending").unwrap_or(0);
                last_delivered = reply::field(g, "last-delivered-id").and_then(reply::string);
            }
        }
    }
    // The lag is nil when Redis cannot tell (entries deleted after the last delivered
    // one); then every entry not in flight is taken as queued.
    p.queued = lag.unwrap_or_else(|| p.length.saturating_sub(p.in_flight));
    if let Some(summary) = ok(3) {
        p.oldest_in_flight_at_ms = reply::array(summary)
            .get(1)
            .and_then(reply::string)
            .as_deref()
            .and_then(reply::id_ms);
    }
    // The oldest request waiting: the oldest in flight, or the first queued one (after
    // the last delivered entry) if older. Entries before that are finished.
    if p.length > 0 {
        let first_queued = match (&last_delivered, p.queued) {
            (_, 0) => None,
            (None, _) => p.oldest_entry_at_ms,
            (Some(last), _) => {
                let next: Value = redis::cmd("XRANGE")
                    .arg(keys.stream())
                    .arg(format!("({last}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(conn)
                    .await?;
                reply::array(&next)
                    .first()
                    .and_then(|e| reply::array(e).first())
                    .and_then(reply::string)
                    .as_deref()
                    .and_then(reply::id_ms)
            }
        };
        p.oldest_entry_at_ms = match (first_queued, p.oldest_in_flight_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    if let Some(cs) = ok(4) {
        for c in reply::array(cs) {
            p.consumers.push(ConsumerNow {
                name: reply::field(c, "name")
                    .and_then(reply::string)
                    .unwrap_or_default(),
                partition: tag.to_string(),
                pending: reply::field_u64(c, "pending").unwrap_or(0),
                idle_ms: reply::field_u64(c, "idle").unwrap_or(0),
            });
        }
    }
    Ok(p)
}

/// Folds one sample into the board: new numbers, rates from the deltas, a history point.
fn apply(b: &mut Board, t: u64, sampled: Sampled) {
    b.queues.retain(|name, _| sampled.contains_key(name));
    for (name, mut parts) in sampled {
        let q = b.queues.entry(name.clone()).or_default();
        let mut now = QueueNow {
            name: name.clone(),
            partitions: parts.iter().map(|p| p.tag.clone()).collect(),
            ..QueueNow::default()
        };
        let mut consumers = std::collections::BTreeSet::new();
        let (mut submitted, mut finished) = (0.0, 0.0);
        for p in &mut parts {
            // The partition's node's clock; the sample's when it gave none.
            let clock = p.clock_ms.unwrap_or(t);
            let age = |at: Option<u64>| at.map(|at| clock.saturating_sub(at));
            p.oldest_request_ms = age(p.oldest_entry_at_ms);
            now.queued += p.queued;
            now.in_flight += p.in_flight;
            now.dead_letters += p.dead_letters;
            now.entries_added += p.entries_added;
            consumers.extend(p.consumers.iter().map(|c| c.name.as_str()));
            now.oldest_in_flight_ms = now.oldest_in_flight_ms.max(age(p.oldest_in_flight_at_ms));
            now.oldest_request_ms = now.oldest_request_ms.max(p.oldest_request_ms);
            if let Some(&(t0, added0, len0)) = q.prev.get(&p.tag) {
                let dt = clock.saturating_sub(t0) as f64 / 1000.0;
                // A counter that went back: the stream was deleted and made again.
                if dt > 0.0 && p.entries_added >= added0 {
                    let added = (p.entries_added - added0) as f64;
                    let grown = p.length as f64 - len0 as f64;
                    submitted += added / dt;
                    finished += (added - grown).max(0.0) / dt;
                }
            }
            q.prev
                .insert(p.tag.clone(), (clock, p.entries_added, p.length));
        }
        now.consumers = consumers.len() as u64;
        now.submitted_per_s = submitted;
        now.finished_per_s = finished;
        q.prev.retain(|tag, _| now.partitions.contains(tag));
        q.history.push_back(Point {
            t,
            submitted,
            finished,
            oldest_ms: now.oldest_request_ms.unwrap_or(0),
            queued: now.queued,
            in_flight: now.in_flight,
        });
        while q.history.len() > HISTORY {
            q.history.pop_front();
        }
        q.now = now;
        q.parts = parts;
    }
}

#[cfg(test)]
mod tests;
