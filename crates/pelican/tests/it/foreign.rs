//! Keys of a queue that a foreign client wrote: a string at a request key that is
//! neither an index nor an outcome. Every script finishes all of its work or none of it,
//! and replaces what is not pelican's as if the key were absent.

use crate::common::*;
use pelican::{Producer, Submitted};
use pelican_testkit::{eventually, RedisServer};
use std::time::Duration;

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
