//! The reply spy, and the raw-connection helpers it shares with the scenarios.

#![allow(dead_code)]

use crate::common::keys;
use crate::fleet::rid_key;
use pelican_testkit::info_int;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads a producer's reply stream alongside the producer, on a connection of its
/// own (straight to the server, never through a fault proxy), and counts the outcomes
/// pushed per request: a second push for one request would be a duplicate delivered
/// to its caller, whatever the producer then does with it.
///
/// It runs on a thread of its own, so the load's tasks cannot starve it; still, the
/// producer trims what it has read, and a spy that falls far enough behind misses
/// entries: `SpyReport::complete` says whether it saw them all.
pub struct ReplySpy {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<SpyReport>,
    key: String,
    url: String,
}

#[derive(Debug, Default, Clone)]
pub struct SpyReport {
    /// Reply entries read.
    pub entries: u64,
    /// (rid, outcome) pairs read.
    pub pairs: u64,
    /// Requests that were pushed more than one outcome.
    pub duplicated: u64,
    /// Whether the spy read every entry ever added (none trimmed before it saw them).
    pub complete: bool,
    pub entries_added: u64,
}

impl SpyReport {
    /// No outcome was pushed twice; and, when the spy saw every reply entry, exactly one
    /// was pushed per request. The spy shares the cores with the whole load and can fall
    /// behind the producer's trimming (reported, not a failure): the callers' own
    /// accounting stays exact, and what the spy saw still holds no duplicate.
    pub fn assert_one_push_per_request(&self, requests: u64) {
        assert_eq!(self.duplicated, 0, "an outcome was pushed twice: {self:?}");
        if self.complete {
            assert_eq!(
                self.pairs, requests,
                "one outcome pushed per request: {self:?}"
            );
        } else {
            eprintln!(
                "note: the spy missed {} reply entries (trimmed before it read them); its duplicate check covers the rest",
                self.missed()
            );
        }
    }

    /// Reply entries trimmed before the spy saw them.
    pub fn missed(&self) -> u64 {
        // One entry, the stream's creation mark, is trimmed at once by design.
        self.entries_added.saturating_sub(self.entries + 1)
    }
}

impl ReplySpy {
    pub async fn start(url: &str, queue: &str, producer_id: &str) -> ReplySpy {
        let key = keys(queue).reply(producer_id);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (key, url, stop) = (key.clone(), url.to_string(), stop.clone());
            std::thread::spawn(move || spy(&url, &key, &stop))
        };
        ReplySpy {
            stop,
            thread,
            key,
            url: url.to_string(),
        }
    }

    /// Stops reading (after one more read) and reports.
    pub async fn finish(self) -> SpyReport {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread;
        let mut rep = tokio::task::spawn_blocking(move || thread.join().expect("spy thread"))
            .await
            .expect("joining the spy");
        if let Ok(mut c) = raw_conn(&self.url).await {
            let v: redis::RedisResult<Value> = redis::cmd("XINFO")
                .arg("STREAM")
                .arg(&self.key)
                .query_async(&mut c)
                .await;
            if let Ok(v) = v {
                rep.entries_added = info_int(&v, "entries-added").unwrap_or(0) as u64;
                rep.complete = rep.missed() == 0;
            }
        }
        rep
    }
}

fn spy(url: &str, key: &str, stop: &AtomicBool) -> SpyReport {
    let mut rep = SpyReport::default();
    let mut seen: HashMap<u128, u8> = HashMap::new();
    let mut last = "0-0".to_string();
    let mut conn: Option<redis::Connection> = None;
    let mut drained_after_stop = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            if drained_after_stop {
                break;
            }
            drained_after_stop = true;
        }
        if conn.is_none() {
            let c = redis::Client::open(url)
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)));
            match c {
                Ok(c) => {
                    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
                    conn = Some(c);
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
        }
        let r: redis::RedisResult<Value> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(10_000)
            .arg("BLOCK")
            .arg(200)
            .arg("STREAMS")
            .arg(key)
            .arg(&last)
            .query(conn.as_mut().unwrap());
        let v = match r {
            Ok(v) => v,
            Err(_) => {
                conn = None;
                continue;
            }
        };
        for (id, fields) in stream_entries(&v) {
            rep.entries += 1;
            last = id;
            for kv in fields.chunks(2) {
                if let [k, _] = kv {
                    if k == b"pelican" {
                        continue; // the creation mark
                    }
                    rep.pairs += 1;
                    let n = seen
                        .entry(rid_key(&String::from_utf8_lossy(k)))
                        .or_default();
                    *n = n.saturating_add(1);
                    if *n == 2 {
                        rep.duplicated += 1;
                    }
                }
            }
        }
    }
    rep
}

/// A plain connection whose response timeout outlasts a blocking read.
pub async fn raw_conn(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let cfg = AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
}

/// The entries of an XREAD reply (RESP2 or RESP3), as (id, flat fields).
pub fn stream_entries(v: &Value) -> Vec<(String, Vec<Vec<u8>>)> {
    fn arr(v: &Value) -> &[Value] {
        match v {
            Value::Array(a) => a,
            _ => &[],
        }
    }
    fn bytes(v: &Value) -> Vec<u8> {
        match v {
            Value::BulkString(b) => b.clone(),
            Value::SimpleString(s) => s.as_bytes().to_vec(),
            Value::Int(i) => i.to_string().into_bytes(),
            _ => Vec::new(),
        }
    }
    let streams: Vec<&Value> = match v {
        Value::Map(m) => m.iter().map(|(_, e)| e).collect(),
        Value::Array(a) => a.iter().filter_map(|s| arr(s).get(1)).collect(),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for entries in streams {
        for e in arr(entries) {
            let parts = arr(e);
            let Some(id) = parts.first() else { continue };
            let fields = parts.get(1).map(arr).unwrap_or(&[]);
            out.push((
                String::from_utf8_lossy(&bytes(id)).into_owned(),
                fields.iter().map(bytes).collect(),
            ));
        }
    }
    out
}
