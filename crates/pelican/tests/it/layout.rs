//! A request entry's layout (docs/PROTOCOL.md, "Entries"): producers write a `head`
//! (`<rid>;<from>;<deadline>;<at>;<index>`) and a `body`, with dedup and without; an
//! entry in the layout before `head` (`rid`, `from`, `deadline`, `at` and `index` apart),
//! as a producer of an earlier build writes it, is still served, and alike.

use crate::common::*;
use pelican::admin::EntryHead;
use pelican::{Consumer, Producer};
use pelican_testkit::RedisServer;
use std::time::{Duration, UNIX_EPOCH};

/// An XRANGE reply: entries of id and fields.
type Entries = Vec<(String, Vec<(String, Vec<u8>)>)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_write_a_head_and_entries_of_the_earlier_layout_are_served_alike() {
    let server = RedisServer::start();
    let q = queue(&server, "layout");
    let probe = Probe::new(&server, &q).await;
    let mut consumer = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let timeout = Duration::from_secs(20);

    // What a producer writes: the head and the body, nothing else; the head's parts as
    // the producer knows them.
    for (i, dedup) in [(1, false), (2, true)] {
        let p = Producer::<Req, Resp>::connect(
            q.clone(),
            fast_producer()
                .with_request_timeout(timeout)
                .with_dedup(dedup),
        )
        .await
        .unwrap();
        let before = now_ms();
        let ticket = p.submit(&Req::new(i, "layout")).await.unwrap();
        let after = now_ms();
        let d = within(timeout, "the delivery", consumer.next())
            .await
            .unwrap()
            .expect("not stopping");
        let entry: Entries = probe
            .query(
                redis::cmd("XRANGE")
                    .arg(probe.stream())
                    .arg(d.job().entry_id())
                    .arg(d.job().entry_id()),
            )
            .await;
        let fields = &entry[0].1;
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["head", "body"], "dedup {dedup}: the entry's fields");
        let head = std::str::from_utf8(&fields[0].1).unwrap();
        let h = EntryHead::parse(head).expect("five parts");
        assert_eq!(h.rid, ticket.request_id(), "dedup {dedup}");
        assert_eq!(h.from, p.id(), "dedup {dedup}");
        assert_eq!(h.index, if dedup { "1" } else { "0" }, "dedup {dedup}");
        let at: u64 = h.at.parse().unwrap();
        assert!((before..=after).contains(&at), "dedup {dedup}: at {at}");
        let deadline: u64 = h.deadline.parse().unwrap();
        let t = timeout.as_millis() as u64;
        assert!(
            (before + t..=after + t).contains(&deadline),
            "dedup {dedup}: deadline {deadline}"
        );
        // The consumer read the same parts.
        assert_eq!(d.job().request_id(), ticket.request_id());
        assert_eq!(
            d.job().deadline(),
            UNIX_EPOCH + Duration::from_millis(deadline)
        );
        assert_eq!(
            d.job().submitted_at(),
            UNIX_EPOCH + Duration::from_millis(at)
        );
        let r = d.request().clone();
        d.respond(&echo(&r, "layout")).await.unwrap();
        assert_eq!(
            ticket.await.unwrap(),
            echo(&Req::new(i, "layout"), "layout")
        );
        p.shutdown().await.unwrap();
    }

    // The same request by hand in both layouts (a request id holding `;` in the head:
    // the other parts are taken from the right).
    let deadline = now_ms() + 60_000;
    let dl = deadline.to_string();
    let body = serde_json::to_vec(&Req::new(3, "by hand")).unwrap();
    probe
        .xadd(&[
            ("rid", b"old;layout"),
            ("from", b""),
            ("deadline", dl.as_bytes()),
            ("at", b"1796207331130"),
            ("index", b"0"),
            ("body", &body),
        ])
        .await;
    let head = format!("new;layout;;{dl};1796207331130;0");
    probe
        .xadd(&[("head", head.as_bytes()), ("body", &body)])
        .await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = within(timeout, "the delivery", consumer.next())
            .await
            .unwrap()
            .expect("not stopping");
        seen.push((
            d.job().request_id().to_string(),
            d.job().deadline(),
            d.job().submitted_at(),
            d.request().clone(),
        ));
        let r = d.request().clone();
        assert!(d.respond(&echo(&r, "layout")).await.unwrap(), "recorded");
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    let req = Req::new(3, "by hand");
    let when = |ms| UNIX_EPOCH + Duration::from_millis(ms);
    assert_eq!(
        seen,
        [
            (
                "new;layout".to_string(),
                when(deadline),
                when(1_796_207_331_130),
                req.clone()
            ),
            (
                "old;layout".to_string(),
                when(deadline),
                when(1_796_207_331_130),
                req
            ),
        ]
    );
    let dead: u64 = probe.query(redis::cmd("XLEN").arg(probe.dead())).await;
    assert_eq!(dead, 0, "neither layout was refused");
    consumer.shutdown().await.unwrap();
}
