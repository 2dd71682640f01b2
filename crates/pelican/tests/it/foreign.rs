//! Keys of a queue that a foreign client wrote: a request key of another type, or a
//! string there that is neither an index nor an outcome; a janitor lock that never
//! expires. Every script finishes all of its work or none of it, and replaces what is
//! not pelican's as if the key were absent.

use crate::common::*;
use pelican::{Admin, Producer, Submitted};
use pelican_testkit::{eventually, RedisServer};
use std::time::Duration;

/// requeue.lua read the request key with `redis.call('GET')` after its XADD: a key of
/// another type aborted the script with the entry added and the dead letter kept, so
/// the next requeue queued the request a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_over_a_request_key_of_another_type_queues_once() {
    let server = RedisServer::start();
    let q = queue(&server, "requeue-wrongtype");
    let probe = Probe::new(&server, &q).await;
    let admin = Admin::connect(q.clone()).await.unwrap();
    let w = Worker::spawn(&q, fast_consumer(), 1, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let dl = in_a_minute();
    probe
        .xadd(&[
            ("rid", b"r1"),
            ("from", b"gone"),
            ("index", b"1"),
            ("deadline", dl.as_bytes()),
            ("body", b"not json"),
        ])
        .await;
    eventually(Duration::from_secs(10), "the dead letter", || async {
        admin.dead_letters(10).await.unwrap().len() == 1
    })
    .await;
    w.stop().await;
    let letter = admin.dead_letters(10).await.unwrap().remove(0);
    let key = probe.req("r1");
    let _: i64 = probe.query(redis::cmd("DEL").arg(&key)).await;
    let _: i64 = probe
        .query(redis::cmd("HSET").arg(&key).arg("foreign").arg("hash"))
        .await;
    assert_eq!(probe.xlen().await, 0);

    let ids = [letter.id.clone()];
    let first = admin.requeue(&ids, Duration::from_secs(60)).await;
    let second = admin.requeue(&ids, Duration::from_secs(60)).await;
    assert_eq!(probe.xlen().await, 1, "queued exactly once");
    assert!(admin.dead_letters(10).await.unwrap().is_empty());
    let first = first.expect("the first requeue succeeds");
    let sid = first[0].1.clone().expect("requeued");
    assert_eq!(second.unwrap(), vec![(letter.id, None)], "no letter left");
    // The foreign hash was replaced by the new entry's index.
    let index = probe.get(&key).await.expect("an index");
    assert!(
        index.starts_with(format!("P{sid};").as_bytes()),
        "{index:?}"
    );
}

/// The janitor's lock was `SET NX PX`: a lock key that never expires (a foreign
/// client's, of any type) stopped every janitor run for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_takes_over_a_lock_that_never_expires() {
    let server = RedisServer::start();
    let q = queue(&server, "janitor-lock");
    let probe = Probe::new(&server, &q).await;
    let admin = Admin::connect(q.clone()).await.unwrap();
    let lock = q.keys().janitor_lock().to_string();
    let _: i64 = probe
        .query(redis::cmd("HSET").arg(&lock).arg("foreign").arg("hash"))
        .await;
    assert!(
        admin.janitor().await.unwrap().ran,
        "ran over the foreign key"
    );
    let pttl: i64 = probe.query(redis::cmd("PTTL").arg(&lock)).await;
    assert!(pttl > 0, "the lock expires: {pttl}");
    assert!(!admin.janitor().await.unwrap().ran, "and locks again");
    // A string without expiry is no lock of ours either.
    let () = probe.query(redis::cmd("SET").arg(&lock).arg("x")).await;
    assert!(admin.janitor().await.unwrap().ran);
}

/// A request key holding a string that is neither a pending index nor an outcome:
/// submit.lua joined one that began with `P` (the request was never queued, its caller
/// waited for its timeout) and returned any other as a cached outcome (an error);
/// complete.lua put such a value back and dropped the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_string_at_a_request_key_is_replaced() {
    let server = RedisServer::start();
    let q = queue(&server, "foreign-string");
    let probe = Probe::new(&server, &q).await;
    let gate = Gate::default();
    let runs = Runs::default();
    let (g, r) = (gate.clone(), runs.clone());
    let w = Worker::spawn(&q, fast_consumer(), 4, move |req: Req, job| {
        let (gate, runs) = (g.clone(), r.clone());
        async move {
            runs.hit(job.request_id());
            if req.tag == "held" {
                gate.wait().await;
            }
            Ok(echo(&req, "w"))
        }
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let limit = Duration::from_secs(10);

    // Submissions over foreign strings are queued.
    for (rid, junk) in [
        ("p-junk", "Pjunk"),
        ("p-bad-deadline", "P1-0;soon;x;"),
        ("junk", "junk"),
    ] {
        let () = probe
            .query(redis::cmd("SET").arg(probe.req(rid)).arg(junk))
            .await;
        let req = Req::new(1, rid);
        let t = p.submit_with_id(rid, &req).await.expect("submitted");
        assert_eq!(t.submitted(), Submitted::Queued, "{rid}");
        assert_eq!(within(limit, rid, t).await.unwrap(), echo(&req, "w"));
    }

    // An outcome recorded over a foreign string reaches its caller.
    let req = Req::new(2, "held");
    let t = p.submit_with_id("held", &req).await.unwrap();
    eventually(limit, "the handler started", || async {
        runs.get("held") == 1
    })
    .await;
    let () = probe
        .query(redis::cmd("SET").arg(probe.req("held")).arg("Pjunk"))
        .await;
    gate.open();
    assert_eq!(
        within(limit, "the answer", t).await.unwrap(),
        echo(&req, "w")
    );
    assert_eq!(runs.get("held"), 1);
    w.stop().await;
}
