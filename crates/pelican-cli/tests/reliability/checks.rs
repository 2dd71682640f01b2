//! What must be left of a queue in Redis once its work is done (the memory check every
//! scenario ends with), and reading Redis' own figures.

#![allow(dead_code)]

use crate::common::keys;
use crate::spy::raw_conn;
use redis::aio::MultiplexedConnection;
use redis::Value;

/// `INFO` field as a number.
pub async fn info_number(conn: &mut MultiplexedConnection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no numeric {field}"))
}

/// What is left of a queue in Redis once its work is done.
#[derive(Debug, Default)]
pub struct Leftovers {
    /// Cached outcomes (`req:` keys that hold an outcome and expire within result_ttl).
    pub outcomes: u64,
    /// Stored answers (large responses beside the stream, `body:a...`) with a ttl of at
    /// most result_ttl and a minute: kept while an outcome cached with dedup names them.
    pub answers: u64,
    /// Dead letters.
    pub dead: u64,
    /// Consumers still in the group (SIGKILLed workers stay until consumer_gc_after).
    pub consumers: u64,
    /// Keys that must not be there, with why.
    pub bad: Vec<String>,
}

/// Checks that only cached outcomes and stored answers with a TTL (plus the empty request
/// stream, the janitor's lock and, if `dead_allowed`, the dead-letter stream) remain of
/// `queue`.
pub async fn leftovers(url: &str, queue: &str, dead_allowed: bool) -> Leftovers {
    let mut c = raw_conn(url).await.expect("raw connection");
    leftovers_of(&mut c, &keys(queue), dead_allowed).await
}

/// [`leftovers`] of the keys `names` (one partition of a queue) on the node `c` is
/// connected to.
pub async fn leftovers_of(
    c: &mut MultiplexedConnection,
    names: &pelican::admin::Keys,
    dead_allowed: bool,
) -> Leftovers {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(names.pattern())
            .arg("COUNT")
            .arg(1000)
            .query_async(c)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut out = Leftovers::default();
    let req = names.req("");
    let stored_answer = names.body("a");
    for chunk in keys.chunks(500) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("TYPE").arg(k).cmd("PTTL").arg(k);
        }
        let types: Vec<Value> = pipe.query_async(c).await.expect("TYPE/PTTL");
        let mut firsts = redis::pipe();
        let mut strings = Vec::new();
        for (k, tv) in chunk.iter().zip(types.chunks(2)) {
            let ty = match &tv[0] {
                Value::SimpleString(s) => s.clone(),
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            };
            let ttl = match &tv[1] {
                Value::Int(i) => *i,
                _ => -3,
            };
            if ty == "none" || ttl == 0 || ttl == -2 {
                // expired between SCAN and TYPE, or expiring now (less than 1 ms left: a
                // run longer than result_ttl checks while its first outcomes expire)
                continue;
            }
            if k.starts_with(&req) {
                if ty != "string" {
                    out.bad.push(format!("{k}: a {ty}"));
                } else if ttl <= 0 || ttl > 300_000 {
                    out.bad.push(format!("{k}: ttl {ttl} ms"));
                } else {
                    firsts.cmd("GETRANGE").arg(k).arg(0).arg(0);
                    strings.push(k.clone());
                }
            } else if k.starts_with(&stored_answer) {
                if ty == "string" && ttl > 0 && ttl <= 360_000 {
                    out.answers += 1;
                } else {
                    out.bad
                        .push(format!("{k}: a stored answer, a {ty} (ttl {ttl} ms)"));
                }
            } else if k == names.stream() {
                let len: u64 = redis::cmd("XLEN").arg(k).query_async(c).await.unwrap();
                let pend: Value = redis::cmd("XPENDING")
                    .arg(k)
                    .arg(names.group())
                    .query_async(c)
                    .await
                    .unwrap();
                let pending = match &pend {
                    Value::Array(a) => match a.first() {
                        Some(Value::Int(n)) => *n,
                        _ => -1,
                    },
                    _ => -1,
                };
                if len != 0 || pending != 0 {
                    out.bad
                        .push(format!("{k}: {len} entries, {pending} pending"));
                }
                let cs: Value = redis::cmd("XINFO")
                    .arg("CONSUMERS")
                    .arg(k)
                    .arg(names.group())
                    .query_async(c)
                    .await
                    .unwrap();
                if let Value::Array(a) = cs {
                    out.consumers = a.len() as u64;
                }
            } else if k == names.dead() {
                out.dead = redis::cmd("XLEN").arg(k).query_async(c).await.unwrap();
                if !dead_allowed {
                    out.bad.push(format!("{k}: {} dead letters", out.dead));
                }
            } else if k == names.janitor_lock() {
                if ttl <= 0 {
                    out.bad.push(format!("{k}: janitor lock without a ttl"));
                }
            } else if k == names.partitions() {
                // One small string per queue for good: its number of partitions.
            } else {
                out.bad.push(format!("{k}: a {ty} (ttl {ttl} ms)"));
            }
        }
        if !strings.is_empty() {
            let firsts: Vec<Vec<u8>> = firsts.query_async(c).await.expect("GETRANGE");
            for (k, f) in strings.iter().zip(firsts) {
                match f.first() {
                    Some(b'O' | b'A' | b'E' | b'D' | b'X') => out.outcomes += 1,
                    // read as empty: it expired after its PTTL was read, unless it is
                    // still there
                    None if !exists(c, k).await => {}
                    _ => out.bad.push(format!(
                        "{k}: not an outcome ({:?}...)",
                        String::from_utf8_lossy(&f)
                    )),
                }
            }
        }
    }
    out
}

async fn exists(c: &mut MultiplexedConnection, key: &str) -> bool {
    let n: u64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(c)
        .await
        .expect("EXISTS");
    n == 1
}

/// The memory check every scenario ends with: nothing but cached outcomes (and the
/// empty stream, the janitor lock, the record of the number of partitions and, where
/// expected, dead letters) remains.
pub async fn assert_only_outcomes_remain(url: &str, queue: &str, dead_allowed: bool) -> Leftovers {
    let l = leftovers(url, queue, dead_allowed).await;
    l.assert_clean(queue);
    l
}

impl Leftovers {
    /// Panics with the first 30 keys that must not be there, if any.
    pub fn assert_clean(&self, queue: &str) {
        assert!(
            self.bad.is_empty(),
            "keys left behind by queue {queue}:\n{}",
            self.bad
                .iter()
                .take(30)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
