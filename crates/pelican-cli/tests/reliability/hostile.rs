//! Fault 5: hostile input from a foreign client, a plain Redis connection writing to the
//! queue's keys while two worker processes serve it and this process keeps normal
//! requests flowing. 10,000 hostile writes:
//!
//! - request entries with missing fields, fields of the wrong type, invalid UTF-8,
//!   bodies that are not JSON, bogus request ids, bodies over `max_body_bytes`, request
//!   keys of the wrong type: each is dead-lettered with a reason that names the fault;
//! - well-formed entries forged in a producer's name: handled, and their outcomes
//!   ignored by that producer, which never asked;
//! - forged entries on the producer's reply stream (random or malformed request ids and
//!   outcomes): ignored; they resolve nothing and disturb nothing.
//!
//! The consumers never stop, the normal requests are all answered with their own
//! responses, and nothing but outcomes and dead letters remains. A second test checks
//! the maximum body size on both sides, with a clear error.

use crate::common::*;
use pelican::{Consumer, ConsumerConfig, ErrorKind, Producer, ProducerConfig};
use pelican_testkit::{eventually, unique_name};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Hostile writes in all (request entries, forged replies and wrong-type keys).
const HOSTILE: usize = 10_000;
/// Of which forged reply entries.
const FORGED_REPLIES: usize = 1_000;
/// Of which bodies over the default max_body_bytes (4 MiB each).
const ENORMOUS: usize = 3;
const WORKERS: usize = 2;
const CONCURRENCY: u32 = 32;
const NORMAL: u64 = 3_000;

/// One kind of hostile request entry: its fields, and what its dead letter's reason
/// must say (`None`: well-formed, handled like any request).
struct Kind {
    name: &'static str,
    reason: Option<&'static str>,
    /// Also write the request key `req:<rid>` as a hash (the wrong type) first.
    wrong_type_key: bool,
    fields: fn(&Ctx, usize) -> Fields,
}

/// The fields of a raw stream entry, names and values as bytes.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

struct Ctx {
    producer: String,
    in_a_minute: String,
}

fn f(k: &str, v: impl AsRef<[u8]>) -> (Vec<u8>, Vec<u8>) {
    (k.as_bytes().to_vec(), v.as_ref().to_vec())
}

fn rid(i: usize) -> String {
    format!("hostile-{i}")
}

const GOOD_BODY: &str = r#"{"i":1,"run":"foreign"}"#;

/// A request entry with a valid rid and deadline, and `body`.
fn plain(c: &Ctx, i: usize, body: impl AsRef<[u8]>) -> Fields {
    vec![
        f("rid", rid(i)),
        f("deadline", &c.in_a_minute),
        f("body", body),
    ]
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            name: "missing rid",
            reason: Some("no valid 'rid'"),
            wrong_type_key: false,
            fields: |c, _| vec![f("deadline", &c.in_a_minute), f("body", GOOD_BODY)],
        },
        Kind {
            name: "empty rid",
            reason: Some("no valid 'rid'"),
            wrong_type_key: false,
            fields: |c, _| {
                vec![
                    f("rid", ""),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "rid not UTF-8",
            reason: Some("no valid 'rid'"),
            wrong_type_key: false,
            fields: |c, _| {
                vec![
                    f("rid", b"\xff\xfe\xfd"),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "rid of 300 bytes",
            reason: Some("invalid 'rid'"),
            wrong_type_key: false,
            fields: |c, i| {
                vec![
                    f("rid", format!("{}-{}", rid(i), "r".repeat(300))),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "rid with control characters",
            reason: Some("invalid 'rid'"),
            wrong_type_key: false,
            fields: |c, i| {
                vec![
                    f("rid", format!("{}\n\r\0", rid(i))),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "missing deadline",
            reason: Some("'deadline'"),
            wrong_type_key: false,
            fields: |_, i| vec![f("rid", rid(i)), f("body", GOOD_BODY)],
        },
        Kind {
            name: "deadline not a number",
            reason: Some("'deadline'"),
            wrong_type_key: false,
            fields: |_, i| {
                vec![
                    f("rid", rid(i)),
                    f("deadline", "soon"),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "negative deadline",
            reason: Some("'deadline'"),
            wrong_type_key: false,
            fields: |_, i| vec![f("rid", rid(i)), f("deadline", "-5"), f("body", GOOD_BODY)],
        },
        Kind {
            name: "deadline beyond u64",
            reason: Some("'deadline'"),
            wrong_type_key: false,
            fields: |_, i| {
                vec![
                    f("rid", rid(i)),
                    f("deadline", "99999999999999999999999"),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "missing body",
            reason: Some("'body'"),
            wrong_type_key: false,
            fields: |c, i| vec![f("rid", rid(i)), f("deadline", &c.in_a_minute)],
        },
        Kind {
            name: "body not JSON",
            reason: Some("undecodable body"),
            wrong_type_key: false,
            fields: |c, i| plain(c, i, "{not json"),
        },
        Kind {
            name: "body not UTF-8",
            reason: Some("undecodable body"),
            wrong_type_key: false,
            fields: |c, i| plain(c, i, b"\"\xff\xfe\""),
        },
        Kind {
            name: "empty body",
            reason: Some("undecodable body"),
            wrong_type_key: false,
            fields: |c, i| plain(c, i, ""),
        },
        Kind {
            name: "JSON with trailing garbage",
            reason: Some("undecodable body"),
            wrong_type_key: false,
            fields: |c, i| plain(c, i, r#"{"i":1} x"#),
        },
        Kind {
            name: "unrelated fields only",
            reason: Some("no valid 'rid'"),
            wrong_type_key: false,
            fields: |_, _| vec![f("hello", "world"), f("x", "\u{0}")],
        },
        Kind {
            name: "indexed, in a producer's name, body not JSON",
            reason: Some("undecodable body"),
            wrong_type_key: false,
            fields: |c, i| {
                vec![
                    f("rid", rid(i)),
                    f("from", &c.producer),
                    f("index", "1"),
                    f("deadline", &c.in_a_minute),
                    f("body", "\u{0}garbage"),
                ]
            },
        },
        Kind {
            name: "request key of the wrong type, body not JSON",
            reason: Some("undecodable body"),
            wrong_type_key: true,
            fields: |c, i| {
                vec![
                    f("rid", rid(i)),
                    f("from", &c.producer),
                    f("index", "1"),
                    f("deadline", &c.in_a_minute),
                    f("body", "nope"),
                ]
            },
        },
        Kind {
            name: "request key of the wrong type, well-formed",
            reason: None,
            wrong_type_key: true,
            fields: |c, i| {
                vec![
                    f("rid", rid(i)),
                    f("from", &c.producer),
                    f("index", "1"),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
        Kind {
            name: "well-formed, in a producer's name, never asked for",
            reason: None,
            wrong_type_key: false,
            fields: |c, i| {
                vec![
                    f("rid", rid(i)),
                    f("from", &c.producer),
                    f("index", "0"),
                    f("deadline", &c.in_a_minute),
                    f("body", GOOD_BODY),
                ]
            },
        },
    ]
}

/// A forged reply entry: random or malformed request ids and outcomes.
fn forged_reply(i: usize) -> Fields {
    match i % 5 {
        0 => vec![f(&format!("forged-{i}"), r#"O{"i":0,"run":"hostile"}"#)],
        1 => vec![f(&format!("forged-{i}"), "Zbogus tag")],
        2 => vec![(b"\xff\xfe".to_vec(), b"E".to_vec())],
        3 => vec![f("", ""), f(&format!("forged-{i}"), "")],
        _ => (0..20)
            .map(|j| f(&format!("forged-{i}-{j}"), "Dpoisoned"))
            .collect(),
    }
}

fn in_a_minute() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_millis() + 60_000).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_writes_never_stop_the_consumers() {
    let _one_at_a_time = serial().await;
    let server = server();
    let url = server.url();
    let queue = unique_name("hostile");
    let names = keys(&queue);
    let spec = WorkerSpec::new(&url, &queue)
        .handler("sleep:5")
        .concurrency(CONCURRENCY);
    let mut fleet = Fleet::start(spec, WORKERS).await;
    let pids = fleet.pids();
    let timeout = Duration::from_secs(60);
    let p = producer(queue_config(&url, &queue), timeout).await;
    let progress = Progress::default();
    let load = tokio::spawn(drive(
        p.clone(),
        LoadSpec::new("hostile", NORMAL, 100, timeout),
        progress.clone(),
    ));

    // The foreign client: pipelined writes in batches, while the load runs.
    let started = Instant::now();
    let ctx = Ctx {
        producer: p.id().to_string(),
        in_a_minute: in_a_minute(),
    };
    let kinds = kinds();
    let entries = HOSTILE - FORGED_REPLIES - ENORMOUS;
    let mut expected: BTreeMap<&str, (Option<&str>, u64)> = BTreeMap::new();
    let mut raw = raw_conn(&url).await.expect("raw connection");
    let mut wrong_type_keys = 0;
    let mut writes = 0;
    for chunk in (0..entries).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let k = &kinds[i % kinds.len()];
            if k.wrong_type_key {
                pipe.cmd("HSET")
                    .arg(names.req(&rid(i)))
                    .arg("foreign")
                    .arg("hash")
                    .ignore();
                wrong_type_keys += 1;
            }
            let mut cmd = redis::cmd("XADD");
            cmd.arg(names.stream()).arg("*");
            for (name, value) in (k.fields)(&ctx, i) {
                cmd.arg(name).arg(value);
            }
            pipe.add_command(cmd).ignore();
            expected.entry(k.name).or_insert((k.reason, 0)).1 += 1;
            writes += 1;
        }
        let () = pipe.query_async(&mut raw).await.expect("hostile writes");
    }
    for i in 0..ENORMOUS {
        let body = vec![b'x'; pelican::config::DEFAULT_MAX_BODY_BYTES + 1];
        let () = redis::cmd("XADD")
            .arg(names.stream())
            .arg("*")
            .arg("rid")
            .arg(rid(entries + i))
            .arg("deadline")
            .arg(&ctx.in_a_minute)
            .arg("body")
            .arg(body)
            .query_async(&mut raw)
            .await
            .map(|_: String| ())
            .expect("enormous entry");
        expected
            .entry("body over max_body_bytes")
            .or_insert((Some("exceeds max_body_bytes"), 0))
            .1 += 1;
        writes += 1;
    }
    let reply_key = names.reply(p.id());
    let mut pipe = redis::pipe();
    for i in 0..FORGED_REPLIES {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&reply_key).arg("*");
        for (k, v) in forged_reply(i) {
            cmd.arg(k).arg(v);
        }
        pipe.add_command(cmd).ignore();
        writes += 1;
    }
    let () = pipe.query_async(&mut raw).await.expect("forged replies");
    assert_eq!(writes, HOSTILE);
    let bad: u64 = expected
        .values()
        .filter(|(r, _)| r.is_some())
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "hostile: {writes} hostile writes ({bad} bad entries, {FORGED_REPLIES} forged replies, {wrong_type_keys} keys of the wrong type) in {:?}",
        started.elapsed()
    );

    let report = load.await.expect("load task");
    eprintln!("hostile: {}", report.one_line());
    // Every bad entry ends in the dead-letter stream, the stream drains.
    let (dead_key, stream_key) = (names.dead(), names.stream());
    let drained_by = Instant::now() + Duration::from_secs(20);
    let mut c = raw_conn(&url).await.unwrap();
    loop {
        let dead: u64 = redis::cmd("XLEN")
            .arg(dead_key)
            .query_async(&mut c)
            .await
            .unwrap();
        let len: u64 = redis::cmd("XLEN")
            .arg(stream_key)
            .query_async(&mut c)
            .await
            .unwrap();
        if dead >= bad && len == 0 {
            break;
        }
        if Instant::now() > drained_by {
            eprintln!("hostile: after 120 s: {dead} of {bad} dead-lettered, {len} entries left");
            break;
        }
        if Instant::now() > drained_by + Duration::from_secs(1000) {
            let pending: redis::Value = redis::cmd("XPENDING")
                .arg(stream_key)
                .arg("pelican")
                .query_async(&mut c)
                .await
                .unwrap();
            panic!(
                "after 120 s: {dead} of {bad} dead-lettered, {len} entries left, pending {pending:?}\n{}",
                fleet.stderr_tails()
            );
        }
        // polling Redis for the condition
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let duration = started.elapsed();
    // The producer read past every forged reply: its reply stream was trimmed past them.
    eventually(
        Duration::from_secs(10),
        "the producer reading past the forged replies",
        || {
            let (url, key) = (url.clone(), reply_key.clone());
            async move {
                let mut c = raw_conn(&url).await.unwrap();
                let len: u64 = redis::cmd("XLEN")
                    .arg(&key)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                // XTRIM MINID keeps the entry read last
                len <= 1
            }
        },
    )
    .await;
    // A normal request after the storm is answered at once.
    let after = tokio::time::timeout(
        Duration::from_secs(10),
        p.call(&json!({"i": 0, "run": "after"})),
    )
    .await
    .expect("a call after the hostile writes")
    .expect("answered");
    assert_eq!(after, json!({"i": 0, "run": "after"}));

    // Dead letters by kind: the marker is the request id, or the reason alone.
    let reasons = dead_reasons(&url, dead_key).await;
    let alive = fleet.all_alive() && fleet.pids() == pids;
    let panics = fleet.panics();
    let runs = fleet.log.lock().unwrap().runs;
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let left = assert_only_outcomes_remain(&url, &queue, true).await;

    // Dead letters by the expected reason they carry, and those that carry none.
    let mut by_reason: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (reason, n) in expected.values() {
        if let Some(r) = reason {
            by_reason.entry(r.to_string()).or_default().0 += n;
        }
    }
    for r in &reasons {
        let key = by_reason
            .keys()
            .find(|k| r.contains(k.as_str()))
            .cloned()
            .unwrap_or_else(|| format!("unexpected: {r}"));
        by_reason.entry(key).or_default().1 += 1;
    }
    eprintln!("hostile: dead letters by reason (expected, got): {by_reason:#?}");
    let mut s = Summary::new(
        "hostile writes by a foreign client (10,000)",
        &format!(
            "{WORKERS} workers x {CONCURRENCY}, handler sleep:5; {NORMAL} normal requests, 100 in flight, during {HOSTILE} hostile writes"
        ),
    );
    s.account(duration, NORMAL + 1, &report, 0);
    s.reruns = fleet.log.lock().unwrap().redelivered;
    s.set("bad_entries", bad)
        .set("dead_letters", reasons.len() as u64)
        .set("forged_replies", FORGED_REPLIES as u64)
        .set("handler_runs", runs)
        .set("cached_outcomes_left", left.outcomes);
    s.emit();

    assert!(alive, "a worker stopped:\n{}", fleet.stderr_tails());
    assert_eq!(panics, 0);
    assert_eq!(report.ok, NORMAL, "{}", report.one_line());
    assert_eq!(report.lost() + report.hung + report.resolved_twice, 0);
    assert_eq!(reasons.len() as u64, bad, "dead letters: {by_reason:#?}");
    for (reason, (want, got)) in &by_reason {
        assert_eq!(got, want, "dead letters saying {reason:?}: {by_reason:#?}");
    }
    // Handled: the normal requests, the call after, and the well-formed foreign ones.
    let well_formed: u64 = expected
        .values()
        .filter(|(r, _)| r.is_none())
        .map(|(_, n)| n)
        .sum();
    assert_eq!(runs, NORMAL + 1 + well_formed);
}

/// The `reason` of every dead letter.
async fn dead_reasons(url: &str, key: &str) -> Vec<String> {
    let mut c = raw_conn(url).await.unwrap();
    let mut out = Vec::new();
    let mut start = "-".to_string();
    loop {
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .unwrap();
        let entries = stream_entries_of_range(&v);
        if entries.is_empty() {
            break;
        }
        for (id, fields) in &entries {
            start = format!("({id}");
            let reason = fields
                .chunks(2)
                .find(|kv| kv[0] == b"reason")
                .map(|kv| String::from_utf8_lossy(&kv[1]).into_owned())
                .unwrap_or_default();
            out.push(reason);
        }
    }
    out
}

/// XRANGE's reply as (id, flat fields).
fn stream_entries_of_range(v: &redis::Value) -> Vec<(String, Vec<Vec<u8>>)> {
    // An XRANGE reply has the shape of one stream's part of an XREAD reply.
    let wrapped = redis::Value::Array(vec![redis::Value::Array(vec![
        redis::Value::BulkString(b"k".to_vec()),
        v.clone(),
    ])]);
    stream_entries(&wrapped)
}

/// The maximum body size holds on both sides, configurably, with a clear error: a
/// producer refuses a request over it (`TooLarge`), a consumer dead-letters an entry
/// over it that a foreign client wrote, and a response over it reaches the caller as a
/// remote error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_body_size_is_enforced_on_both_sides() {
    let _one_at_a_time = serial().await;
    let server = server();
    let url = server.url();
    let max = 1024;
    let q = queue_config(&url, &unique_name("maxbody")).with_max_body_bytes(max);
    let p = Producer::<Json, Json>::connect(
        q.clone(),
        ProducerConfig::default().with_request_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let big = json!({ "pad": "x".repeat(max) });
    let e = p.submit(&big).await.err().expect("too large");
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(e.message().contains("max_body_bytes is 1024"), "{e}");

    let c = Consumer::<Json, Json>::connect(
        q.clone(),
        ConsumerConfig::default().with_claim_idle(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let stop = c.stopper();
    let served = tokio::spawn(c.serve(4, move |req: Json, _| async move {
        // asked for a big answer: more than max_body_bytes
        match req["grow"].as_u64() {
            Some(n) => Ok(json!({ "pad": "y".repeat(n as usize) })),
            None => Ok(req),
        }
    }));
    let e = p.call(&json!({ "grow": max * 2 })).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(
        e.message().contains("response body is") && e.message().contains("max_body_bytes is 1024"),
        "{e}"
    );
    // A raw entry over the limit is dead-lettered, saying so.
    let mut raw = raw_conn(&url).await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(q.keys().stream())
        .arg("*")
        .arg("rid")
        .arg("too-big")
        .arg("deadline")
        .arg(in_a_minute())
        .arg("body")
        .arg("z".repeat(max + 1))
        .query_async(&mut raw)
        .await
        .unwrap();
    let admin = pelican::Admin::connect(q.clone()).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the oversized entry dead",
        || async { admin.dead_letters(10).await.unwrap().len() == 1 },
    )
    .await;
    let d = &admin.dead_letters(10).await.unwrap()[0];
    assert!(
        d.reason
            .contains("body of 1025 bytes exceeds max_body_bytes 1024"),
        "{d:?}"
    );
    assert_eq!(d.body_len, max + 1);
    // And the queue goes on.
    assert_eq!(p.call(&json!({"ok": 1})).await.unwrap(), json!({"ok": 1}));
    stop.stop();
    served.await.unwrap().unwrap();
    p.shutdown().await.unwrap();
    assert_only_outcomes_remain(&url, &q.name, true).await;
}
