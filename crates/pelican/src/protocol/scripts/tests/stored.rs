//! Stored bodies: the script transitions of a large body (docs/PROTOCOL.md, "Stored
//! bodies"), against a real redis-server.

use super::*;
use crate::protocol::stored;

/// A large body is stored by a SET before the submit call and never passes through a
/// script: the new entry carries `bref` and its body moves to `body:<sid>`; a duplicate's
/// staged body is deleted; the body goes with its entry when it is completed, moves with
/// it to the dead letters and back on requeue; a submission whose staged body is missing
/// is refused, not queued (its entry is taken back), unless it joins one in flight.
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
    assert_eq!(
        submit("p2", "big", "sp2:3", false).await,
        SubmitAnswer::Joined,
        "a join needs no body: its missing staged body does not refuse it"
    );

    // delivered; the reader's MGET finds the body at the entry's key
    let mut entries = f.deliver_entries().await;
    let at = stored::stored_bodies(&entries);
    assert_eq!(at, [0], "one stored body");
    let bodies: Value = f.query(&stored::mget_bodies(&f.keys, &entries, &at)).await;
    stored::attach_bodies(&mut entries, &at, bodies);
    let req =
        entry::Request::from_entry(entries.remove(0), 1 << 20, &mut Default::default()).unwrap();
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
                deadline_ms: deadline(now),
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
    .call(&f.scripts, [&*did])
    .invoke(&mut f.conn.clone())
    .await
    .unwrap();
    let new_sid = requeued[0].1.clone().expect("requeued");
    assert!(!exists(f.keys.dead_body(&did)).await);
    let again: Vec<u8> = f.query(redis::cmd("GET").arg(f.keys.body(&new_sid))).await;
    assert_eq!(again, body);
}

/// A stored answer (docs/PROTOCOL.md, "Stored answers"): complete.lua records and pushes
/// the outcome that names it, never its bytes; a later outcome for the same entry loses
/// and its own answer is deleted (the winner's stays); an outcome whose answer did not
/// arrive changes nothing and says so; dedup off, the same holds with the XACK gate.
/// A submission whose staged body is missing does not expire the entry in flight past its
/// deadline: it is refused and the entry stays, for a submission that brings its body.
#[tokio::test]
async fn a_missing_body_leaves_an_expired_entry_for_the_next_submission() {
    let f = fixture().await;
    let now = crate::clock::now_ms();
    let body = vec![b'x'; 10_000];
    let SubmitAnswer::Queued(old) = f
        .submit_staged("p1", "big", now, Some(("sp1:1", Some(body.as_slice()))))
        .await
    else {
        panic!("queued")
    };
    let later = deadline(now) + 1;
    assert_eq!(
        f.submit_staged("p2", "big", later, Some(("sp2:1", None)))
            .await,
        SubmitAnswer::BodyMissing
    );
    let Some(IndexValue::Pending(p)) = f.index("big").await else {
        panic!("still in flight")
    };
    assert_eq!(p.sid, old, "the expired entry stays");
    let SubmitAnswer::Queued(new) = f
        .submit_staged("p2", "big", later, Some(("sp2:2", Some(body.as_slice()))))
        .await
    else {
        panic!("with its body, the submission starts afresh")
    };
    assert_ne!(new, old);
    let v: Value = f
        .query(redis::cmd("XRANGE").arg(&f.keys.stream).arg("-").arg("+"))
        .await;
    let ids: Vec<String> = parse_entries(&v).iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, [new], "the expired entry went, the new one is queued");
}

#[tokio::test]
async fn a_stored_answer_is_named_by_its_outcome_and_a_losers_is_deleted() {
    let f = fixture().await;
    let now = crate::clock::now_ms();
    f.reply_stream("p1").await;
    let exists = |key: String| {
        let f = &f;
        async move { f.query::<bool>(redis::cmd("EXISTS").arg(key)).await }
    };
    let answer = vec![b'a'; 50_000];
    let set = |name: &'static str| {
        let (f, answer) = (&f, answer.clone());
        async move {
            let () = f
                .query(
                    redis::cmd("SET")
                        .arg(f.keys.body(name))
                        .arg(answer)
                        .arg("PX")
                        .arg(TTL_MS + 60_000),
                )
                .await;
        }
    };
    let stored = |name: &str| {
        Outcome::Stored {
            len: 50_000,
            name: name.into(),
        }
        .encode()
    };
    for indexed in [true, false] {
        let (sid, rid) = if indexed {
            let SubmitAnswer::Queued(sid) = f.submit("p1", "r", now).await else {
                panic!("queued")
            };
            (sid, "r")
        } else {
            (f.add_entry("*", "plain", "p1").await, "plain")
        };
        assert_eq!(f.deliver().await, vec![sid.clone()]);
        let complete = |outcome: Vec<u8>| {
            let (f, sid) = (&f, sid.clone());
            async move {
                f.complete_all(
                    now,
                    [CompleteEntry {
                        sid: &sid,
                        rid,
                        from: "p1",
                        deadline_ms: deadline(now),
                        indexed,
                        stored_body: false,
                        small: false,
                        outcome: &outcome,
                    }],
                )
                .await
            }
        };
        let (first, second, missing) = if indexed {
            ("a1.t.1", "a1.t.2", "a1.t.3")
        } else {
            ("a2.t.1", "a2.t.2", "a2.t.3")
        };
        // its SET did not arrive: nothing is done, the entry stays pending
        assert_eq!(
            complete(stored(missing)).await,
            vec![Completed::AnswerMissing],
            "indexed {indexed}"
        );
        let pending: Value = f
            .query(
                redis::cmd("XPENDING")
                    .arg(&f.keys.stream)
                    .arg(&f.keys.group),
            )
            .await;
        assert_eq!(entry::array(&pending).first().and_then(entry::int), Some(1));
        if indexed {
            assert!(matches!(f.index(rid).await, Some(IndexValue::Pending(_))));
        }

        set(first).await;
        assert_eq!(complete(stored(first)).await, vec![Completed::Recorded]);
        set(second).await;
        assert_eq!(
            complete(stored(second)).await,
            vec![Completed::Dropped],
            "indexed {indexed}: first outcome wins"
        );
        assert!(
            exists(f.keys.body(first)).await,
            "the winner's answer stays"
        );
        assert!(
            !exists(f.keys.body(second)).await,
            "indexed {indexed}: the loser's answer is deleted"
        );
        let pushed: Vec<(String, Vec<u8>)> = f.replies("p1").await;
        assert_eq!(
            pushed.last(),
            Some(&(rid.to_string(), stored(first))),
            "the reply names the answer"
        );
        if indexed {
            assert_eq!(
                f.index(rid).await,
                Some(IndexValue::Done(Outcome::decode(&stored(first)).unwrap()))
            );
            assert_eq!(
                f.submit("p2", rid, now).await,
                SubmitAnswer::Cached(Outcome::decode(&stored(first)).unwrap()),
                "a later identical request is told where the answer is"
            );
            // a producer that found the answer gone forgets the outcome, only if it is
            // still the one that named it
            let forget = |outcome: Vec<u8>| {
                let f = &f;
                async move {
                    Forget {
                        rid,
                        outcome: &outcome,
                    }
                    .call(&f.scripts)
                    .invoke(&mut f.conn.clone())
                    .await
                    .unwrap()
                }
            };
            assert_eq!(forget(stored(second)).await, 0, "another outcome: kept");
            assert!(f.index(rid).await.is_some());
            assert_eq!(forget(stored(first)).await, 1);
            assert_eq!(f.index(rid).await, None, "forgotten");
        }
    }
}
