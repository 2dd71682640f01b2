//! Invariant 7, bad input never stops a consumer: entries written straight into the
//! stream by a raw client, and requests the consumer cannot decode, are dead-lettered
//! with their reason; their callers, if any, get a Dead error; the consumer goes on.

use crate::common::*;
use pelican::{Admin, ErrorKind, Producer};
use pelican_testkit::{eventually, RedisServer};
use std::collections::HashMap;
use std::time::Duration;

/// The fields of a raw stream entry.
type Fields<'a> = Vec<(&'a str, &'a [u8])>;

/// Largest body the consumers of these tests accept.
const MAX_BODY: usize = 1024;

/// A consumer that counts its handler runs.
async fn counting_worker(q: &pelican::QueueConfig, runs: &Runs) -> Worker {
    let runs = runs.clone();
    Worker::spawn(q, fast_consumer(), 4, move |r: Req, job| {
        let runs = runs.clone();
        async move {
            runs.hit(job.request_id());
            Ok(echo(&r, "w"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv7_garbage_entries_are_dead_lettered_and_the_consumer_goes_on() {
    let server = RedisServer::start();
    let q = queue(&server, "inv7").with_max_body_bytes(MAX_BODY);
    let probe = Probe::new(&server, &q).await;
    let runs = Runs::default();
    let w = counting_worker(&q, &runs).await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let first = Req::new(1, "before");
    assert_eq!(p.call(&first).await.unwrap(), echo(&first, "w"));

    let dl = in_a_minute();
    let dl = dl.as_bytes();
    let good = br#"{"i":9,"tag":"x"}"#.as_slice();
    let big = format!(r#"{{"i":9,"tag":"{}"}}"#, "x".repeat(MAX_BODY));
    let dls = std::str::from_utf8(dl).unwrap();
    let head_empty_rid = format!(";p;{dls};0;0");
    let head_control = format!("g12\n;p;{dls};0;0");
    // what, the entry's fields, what the dead letter's reason must mention
    let cases: Vec<(&str, Fields, &str)> = vec![
        (
            "head of three parts",
            vec![("head", b"g10;p;123"), ("body", good)],
            "'head'",
        ),
        (
            "head not UTF-8",
            vec![("head", b"\xff;p;1;0;0"), ("body", good)],
            "'head'",
        ),
        (
            "head with an empty request id",
            vec![("head", head_empty_rid.as_bytes()), ("body", good)],
            "request id in its 'head'",
        ),
        (
            "head with a control character in its request id",
            vec![("head", head_control.as_bytes()), ("body", good)],
            "request id in its 'head'",
        ),
        (
            "head with a deadline that is not a number",
            vec![("head", b"g11;p;soon;0;0"), ("body", good)],
            "deadline in its 'head'",
        ),
        (
            "head without a body",
            vec![("head", b"g13;p;99999999999999;0;0")],
            "'body'",
        ),
        (
            "missing rid",
            vec![("deadline", dl), ("body", good)],
            "'rid'",
        ),
        (
            "empty rid",
            vec![("rid", b""), ("deadline", dl), ("body", good)],
            "'rid'",
        ),
        (
            "rid not UTF-8",
            vec![("rid", b"\xff\xfe"), ("deadline", dl), ("body", good)],
            "'rid'",
        ),
        ("unrelated fields only", vec![("hello", b"world")], "'rid'"),
        (
            "missing deadline",
            vec![("rid", b"g1"), ("body", good)],
            "'deadline'",
        ),
        (
            "deadline not a number",
            vec![("rid", b"g2"), ("deadline", b"abc"), ("body", good)],
            "'deadline'",
        ),
        (
            "negative deadline",
            vec![("rid", b"g3"), ("deadline", b"-5"), ("body", good)],
            "'deadline'",
        ),
        (
            "missing body",
            vec![("rid", b"g4"), ("deadline", dl)],
            "'body'",
        ),
        (
            "body not JSON",
            vec![("rid", b"g5"), ("deadline", dl), ("body", b"{not json")],
            "undecodable body",
        ),
        (
            "body of the wrong type",
            vec![
                ("rid", b"g6"),
                ("deadline", dl),
                ("body", br#"{"i":"abc"}"#),
            ],
            "undecodable body",
        ),
        (
            "body not UTF-8",
            vec![("rid", b"g7"), ("deadline", dl), ("body", b"\xff\xfe\x00")],
            "undecodable body",
        ),
        (
            "empty body",
            vec![("rid", b"g8"), ("deadline", dl), ("body", b"")],
            "undecodable body",
        ),
        (
            "body over max_body_bytes",
            vec![("rid", b"g9"), ("deadline", dl), ("body", big.as_bytes())],
            "exceeds max_body_bytes",
        ),
    ];
    let mut expected = HashMap::new();
    for (what, fields, reason) in &cases {
        let id = probe.xadd(fields).await;
        expected.insert(id, (*what, *reason));
    }
    let admin = Admin::connect(q.clone()).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "every garbage entry dead",
        || async { admin.dead_letters(100).await.unwrap().len() == cases.len() },
    )
    .await;
    for d in admin.dead_letters(100).await.unwrap() {
        let (what, reason) = expected
            .get(&d.entry)
            .unwrap_or_else(|| panic!("unexpected dead letter {d:?}"));
        assert!(
            d.reason.contains(reason),
            "{what}: reason {:?} should mention {reason}",
            d.reason
        );
        assert_eq!(d.deliveries, 1, "{what}");
        assert_eq!(d.consumer, w.name, "{what}");
    }
    assert!(!w.is_finished(), "the consumer stopped");
    let after = Req::new(2, "after");
    assert_eq!(p.call(&after).await.unwrap(), echo(&after, "w"));
    assert_eq!(runs.total(), 2, "only the two good requests were handled");
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    assert_eq!(probe.pending_index_keys().await, Vec::<String>::new());
    w.stop().await;
}

/// Callers whose requests the consumer cannot take get Dead errors: one speaks
/// another schema, one sends a body over the consumer's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv7_callers_of_undecodable_or_oversized_requests_get_dead() {
    let server = RedisServer::start();
    let q = queue(&server, "inv7b").with_max_body_bytes(MAX_BODY);
    let probe = Probe::new(&server, &q).await;
    let runs = Runs::default();
    let w = counting_worker(&q, &runs).await;
    let other_schema = Producer::<serde_json::Value, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let e = other_schema
        .call(&serde_json::json!({ "i": "not a number" }))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Dead, "{e}");
    assert!(e.message().contains("undecodable body"), "{e}");

    // this producer allows larger bodies than the consumer does
    let mut big_q = q.clone();
    big_q.max_body_bytes = MAX_BODY * 4;
    let big = Producer::<Req, Resp>::connect(big_q, fast_producer())
        .await
        .unwrap();
    let e = big
        .call(&Req::new(1, &"x".repeat(MAX_BODY * 2)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Dead, "{e}");
    assert!(e.message().contains("max_body_bytes"), "{e}");

    let ok = Req::new(2, "fine");
    assert_eq!(big.call(&ok).await.unwrap(), echo(&ok, "w"));
    assert_eq!(runs.total(), 1);
    let admin = Admin::connect(q.clone()).await.unwrap();
    assert_eq!(admin.dead_letters(10).await.unwrap().len(), 2);
    assert_eq!(probe.pending_index_keys().await, Vec::<String>::new());
    w.stop().await;
}

/// Raw garbage entries that name waiting producers:
/// 1. a plain (dedup off) entry whose `from` and `rid` are those of a waiting call
///    fails that call with a Dead error;
/// 2. a broken request written with its index by a foreign client, which a pelican
///    producer then joined: every waiter gets the Dead error;
/// 3. a stray entry carrying the rid of an indexed request that belongs to another
///    entry must not resolve it: the request is answered by its own entry, and the
///    stored outcome is that one (first outcome wins, nothing overwrites it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv7_garbage_entries_naming_waiting_producers() {
    let server = RedisServer::start();
    let q = queue(&server, "inv7c");
    let probe = Probe::new(&server, &q).await;
    let plain = Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_dedup(false))
        .await
        .unwrap();
    let indexed = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let dl = in_a_minute();
    let garbage = |rid: &'static str, from: &str, index: &'static str| {
        let (from, dl) = (from.to_string(), dl.clone());
        let probe = probe.clone();
        async move {
            probe
                .xadd(&[
                    ("rid", rid.as_bytes()),
                    ("from", from.as_bytes()),
                    ("index", index.as_bytes()),
                    ("deadline", dl.as_bytes()),
                    ("body", b"\x00garbage"),
                ])
                .await
        }
    };
    let req = Req::new(1, "real");
    // 1. garbage first, so the consumer meets it before the real request
    garbage("order-1", plain.id(), "0").await;
    let t1 = plain.submit_with_id("order-1", &req).await.unwrap();
    // 2. a foreign producer's broken request, with its index; a pelican caller joins
    let sid = garbage("order-2", "foreign", "1").await;
    let _: () = probe
        .query(
            redis::cmd("SET")
                .arg(probe.req("order-2"))
                .arg(format!("P{sid};{dl};foreign;"))
                .arg("PX")
                .arg(60_000),
        )
        .await;
    let t2 = indexed.submit_with_id("order-2", &req).await.unwrap();
    assert_eq!(t2.submitted(), pelican::Submitted::Joined);
    // 3. stray garbage carrying the rid of a request that another entry holds
    garbage("order-3", indexed.id(), "1").await;
    let t3 = indexed.submit_with_id("order-3", &req).await.unwrap();
    assert_eq!(t3.submitted(), pelican::Submitted::Queued);

    let runs = Runs::default();
    let w = counting_worker(&q, &runs).await;
    for (what, t) in [("plain", t1), ("joined", t2)] {
        let e = within(Duration::from_secs(5), what, t).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Dead, "{what}: {e}");
        assert!(e.message().contains("undecodable body"), "{what}: {e}");
    }
    let r3 = within(Duration::from_secs(5), "the indexed call", t3)
        .await
        .unwrap();
    assert_eq!(r3, echo(&req, "w"));
    let admin = Admin::connect(q.clone()).await.unwrap();
    let dead = admin.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 3, "{dead:?}");
    eventually(Duration::from_secs(5), "the stream drained", || async {
        probe.xlen().await == 0 && probe.pending().await == 0
    })
    .await;
    // the outcomes recorded are the first ones, and stay
    let stored = |rid: &'static str| {
        let probe = probe.clone();
        async move { probe.get(&probe.req(rid)).await.map(|v| v[0]) }
    };
    assert_eq!(stored("order-2").await, Some(b'D'));
    assert_eq!(stored("order-3").await, Some(b'O'));
    assert_eq!(
        indexed
            .submit_with_id("order-3", &req)
            .await
            .unwrap()
            .await
            .unwrap(),
        echo(&req, "w"),
        "answered from the cache"
    );
    assert_eq!(runs.total(), 2, "order-1 and order-3 ran once each");
    assert!(!w.is_finished());
    w.stop().await;
}
