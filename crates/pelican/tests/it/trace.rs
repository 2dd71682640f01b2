//! The entry field `tp` (the submitter's W3C trace context): carried to the consumer's
//! `Job` as it was written, never a reason to refuse an entry, and not written by a
//! producer built without the `otel` feature.

use crate::common::*;
use pelican::Consumer;
use pelican_testkit::RedisServer;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_travels_with_the_entry_and_junk_is_harmless() {
    let server = RedisServer::start();
    let q = queue(&server, "tp");
    let mut consumer = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000)
        .to_string();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // A valid traceparent, junk, and none: all three are delivered and answered.
    for (rid, value) in [
        ("with-tp", Some(tp)),
        ("junk-tp", Some("not a traceparent")),
        ("no-tp", None),
    ] {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(q.keys().stream())
            .arg("*")
            .arg("rid")
            .arg(rid)
            .arg("from")
            .arg("")
            .arg("deadline")
            .arg(&deadline)
            .arg("at")
            .arg(0)
            .arg("index")
            .arg(0);
        if let Some(v) = value {
            cmd.arg("tp").arg(v);
        }
        cmd.arg("body").arg(r#"{"i": 1}"#);
        let _: String = cmd.query_async(&mut conn).await.unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let d = tokio::time::timeout(Duration::from_secs(20), consumer.next())
            .await
            .expect("a delivery")
            .unwrap()
            .expect("not stopping");
        seen.push((
            d.job().request_id().to_string(),
            d.job().trace_parent().map(str::to_string),
        ));
        d.respond(&Resp {
            i: 1,
            by: "t".into(),
        })
        .await
        .unwrap();
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("junk-tp".to_string(), Some("not a traceparent".to_string())),
            ("no-tp".to_string(), None),
            ("with-tp".to_string(), Some(tp.to_string())),
        ]
    );
    let dead: u64 = redis::cmd("XLEN")
        .arg(q.keys().dead())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(dead, 0, "no entry was refused for its tp");

    // A producer built without `otel` writes no tp (the default build stays lean).
    #[cfg(not(feature = "otel"))]
    {
        let p = pelican::Producer::<Req, Resp>::connect(q.clone(), fast_producer())
            .await
            .unwrap();
        let ticket = p.submit(&Req::new(7, "lean")).await.unwrap();
        let d = tokio::time::timeout(Duration::from_secs(20), consumer.next())
            .await
            .expect("a delivery")
            .unwrap()
            .expect("not stopping");
        assert_eq!(d.job().trace_parent(), None);
        d.respond(&Resp {
            i: 7,
            by: "t".into(),
        })
        .await
        .unwrap();
        assert_eq!(ticket.await.unwrap().i, 7);
        p.shutdown().await.unwrap();
    }
    consumer.shutdown().await.unwrap();
}
