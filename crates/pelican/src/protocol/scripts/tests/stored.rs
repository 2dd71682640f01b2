//! Stored bodies: the script transitions of a large body (docs/PROTOCOL.md, "Stored
//! bodies"), against a real redis-server.

use super::*;

/// A large body is stored by a SET before the submit call and never passes through a
/// script: the new entry carries `bref` and its body moves to `body:<sid>`; a duplicate's
/// staged body is deleted; the body goes with its entry when it is completed, moves with
/// it to the dead letters and back on requeue; a submission whose staged body is missing
/// is refused, not queued.
#[tokio::test]
async fn stored_bodies_move_with_their_entries_and_leave_nothing_behind() {
    let f = fixture().await;
    let now = crate::clock::now_ms();
    f.reply_stream("p1").await;
    let body = vec![b'x'; 10_000];
    let submit = |producer: &'static str, rid: &'static str, stage: &'static str, store: bool| {
        let (f, body) = (&f, body.clone());
        async move {
            let stored = store.then_some(body.as_slice());
            f.submit_staged(producer, rid, now, Some((stage, stored)))
                .await
        }
    };
    let exists = |key: String| {
        let f = &f;
        async move { f.query::<bool>(redis::cmd("EXISTS").arg(key)).await }
    };

    let SubmitAnswer::Queued(sid) = submit("p1", "big", "sp1:1", true).await else {
        panic!("queued")
    };
    assert!(
        !exists(f.keys.body("sp1:1")).await,
        "the staged body was renamed"
    );
    let stored: Vec<u8> = f.query(redis::cmd("GET").arg(f.keys.body(&sid))).await;
    assert_eq!(stored, body);
    let v: Value = f
        .query(redis::cmd("XRANGE").arg(&f.keys.stream).arg(&sid).arg(&sid))
        .await;
    let e = parse_entries(&v).remove(0);
    assert_eq!(e.get("bref"), Some(&b"1"[..]));
    assert_eq!(e.get("body"), None, "the body is not in the stream");

    assert_eq!(
        submit("p2", "big", "sp2:1", true).await,
        SubmitAnswer::Joined
    );
    assert!(
        !exists(f.keys.body("sp2:1")).await,
        "a duplicate's staged body is deleted"
    );
    assert_eq!(
        submit("p2", "other", "sp2:2", false).await,
        SubmitAnswer::BodyMissing
    );
    assert_eq!(f.index("other").await, None, "refused, not queued");

    // delivered; the reader's MGET finds the body at the entry's key
    let mut entries = f.deliver_entries().await;
    let at = entry::stored_bodies(&entries);
    assert_eq!(at, [0], "one stored body");
    let bodies: Value = f.query(&entry::mget_bodies(&f.keys, &entries, &at)).await;
    entry::attach_bodies(&mut entries, &at, bodies);
    let req = entry::Request::from_entry(entries.remove(0), 1 << 20).unwrap();
    assert!(req.stored_body && req.indexed);
    assert_eq!(req.body, body);

    let ok = Outcome::Ok(b"{}".to_vec()).encode();
    let done = f
        .complete(
            now,
            [CompleteEntry {
                sid: &sid,
                rid: "big",
                from: "p1",
                indexed: true,
                stored_body: true,
                small: false,
                outcome: &ok,
            }],
        )
        .await;
    assert_eq!(done, vec![true]);
    assert!(
        !exists(f.keys.body(&sid)).await,
        "completed: its body is gone"
    );

    // dead-lettered: the body moves with the letter, and back on requeue
    let SubmitAnswer::Queued(sid) = submit("p1", "doomed", "sp1:2", true).await else {
        panic!("queued")
    };
    assert_eq!(f.deliver().await, vec![sid.clone()]);
    let buried = Reject {
        consumer: "c",
        sid: &sid,
        reason: "test",
        deliveries: 1,
        now_ms: now,
        result_ttl_ms: TTL_MS,
        reply_maxlen: 100,
        dead_maxlen: 100,
        max_body_bytes: 1 << 20,
    }
    .call(&f.scripts)
    .invoke(&mut f.conn.clone())
    .await
    .unwrap();
    assert!(buried);
    assert!(!exists(f.keys.body(&sid)).await);
    let v: Value = f
        .query(redis::cmd("XRANGE").arg(&f.keys.dead).arg("-").arg("+"))
        .await;
    let did = parse_entries(&v).remove(0).id;
    let dead_body: Vec<u8> = f.query(redis::cmd("GET").arg(f.keys.dead_body(&did))).await;
    assert_eq!(dead_body, body);
    let ttl: i64 = f
        .query(redis::cmd("PTTL").arg(f.keys.dead_body(&did)))
        .await;
    assert!(
        ttl > 86_400_000,
        "a dead letter's body is kept for days: {ttl}"
    );
    let requeued = Requeue {
        now_ms: now,
        deadline_ms: now + 30_000,
        result_ttl_ms: TTL_MS,
    }
    .call(&f.scripts, [did.as_str()])
    .invoke(&mut f.conn.clone())
    .await
    .unwrap();
    let new_sid = requeued[0].1.clone().expect("requeued");
    assert!(!exists(f.keys.dead_body(&did)).await);
    let again: Vec<u8> = f.query(redis::cmd("GET").arg(f.keys.body(&new_sid))).await;
    assert_eq!(again, body);
}
