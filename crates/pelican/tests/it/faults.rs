//! Invariant 9 (dropped connections): producers and consumers talk to Redis through a
//! proxy that cuts every connection mid-run. Nothing panics, nothing hangs, requests
//! complete.

use crate::common::*;
use pelican::{Bytes, Consumer, ErrorKind, Producer, QueueConfig, Raw};
use pelican_testkit::{Proxy, RedisServer};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinSet;

/// `queue` reached through `proxy`.
fn via(proxy: &Proxy, queue: &QueueConfig) -> QueueConfig {
    let mut q = queue.clone();
    q.url = proxy.url();
    q
}

async fn workers(q: &QueueConfig, runs: &Runs) -> Vec<Worker> {
    let mut workers = Vec::new();
    for _ in 0..3 {
        let runs = runs.clone();
        workers.push(
            Worker::spawn(q, fast_consumer(), 8, move |r: Req, job| {
                let runs = runs.clone();
                async move {
                    runs.hit(job.request_id());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(echo(&r, "w"))
                }
            })
            .await,
        );
    }
    workers
}

/// 100 requests in flight while every connection (consumers' reads, scripts, the
/// producer's reply reader) is cut three times: every one gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_complete_across_dropped_connections() {
    logs();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let direct = queue(&server, "faults");
    let probe = Probe::new(&server, &direct).await;
    let q = via(&proxy, &direct);
    let runs = Runs::default();
    let workers = workers(&q, &runs).await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let mut tickets = JoinSet::new();
    for i in 0..100 {
        let t = p.submit(&Req::new(i, "cut")).await.unwrap();
        tickets.spawn(async move { (i, t.await) });
    }
    // Each cut comes while work is in flight: after a quarter, half and three quarters
    // of the requests have started.
    for started in [25, 50, 75] {
        let runs = runs.clone();
        pelican_testkit::eventually(Duration::from_secs(20), "requests to start", move || {
            let runs = runs.clone();
            async move { runs.total() >= started }
        })
        .await;
        proxy.cut_all();
    }
    within(
        Duration::from_secs(30),
        "every request across the cuts",
        async {
            while let Some(r) = tickets.join_next().await {
                let (i, out) = r.unwrap();
                let resp = out.unwrap_or_else(|e| panic!("request {i}: {e}"));
                assert_eq!(resp.i, i);
            }
        },
    )
    .await;
    assert_eq!(runs.snapshot().len(), 100);
    for w in workers {
        w.stop().await;
    }
    assert_eq!(probe.xlen().await, 0);
    assert_eq!(probe.pending().await, 0);
    assert_eq!(probe.pending_index_keys().await, Vec::<String>::new());
}

/// 200 requests of 100 KB, dedup on (stored bodies) and off (bodies in the entries), while
/// every connection is cut twice: the consumer reads them in parts over several
/// connections (docs/PROTOCOL.md, "Connections and tasks"), and a cut in the middle of
/// a split read or fetch loses nothing. Every caller gets its own body back, and no entry,
/// pending delivery, index or stored body is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_in_parts_lose_nothing_across_dropped_connections() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    for dedup in [true, false] {
        let direct = queue(&server, "faults-large");
        let probe = Probe::new(&server, &direct).await;
        let q = via(&proxy, &direct);
        let p =
            Producer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_producer().with_dedup(dedup))
                .await
                .unwrap();
        // All submitted before the consumer starts: a backlog, which is what a read is
        // split for.
        let mut calls = JoinSet::new();
        for i in 0..200u32 {
            let mut b = vec![b'x'; 100_000];
            b[..4].copy_from_slice(&i.to_le_bytes());
            let b = Bytes::from(b);
            let t = p.submit_bytes(b.clone()).await.unwrap();
            calls.spawn(async move { (b, t.await) });
        }
        let (runs, stop, w) = counting_raw_worker(&q, 8, |b| b).await;
        for started in [40, 120] {
            let runs = runs.clone();
            pelican_testkit::eventually(Duration::from_secs(20), "requests to start", move || {
                let runs = runs.clone();
                async move { runs.load(Ordering::SeqCst) >= started }
            })
            .await;
            proxy.cut_all();
        }
        within(
            Duration::from_secs(60),
            "every request across the cuts",
            async {
                while let Some(r) = calls.join_next().await {
                    let (sent, got) = r.unwrap();
                    let got = got.unwrap_or_else(|e| panic!("dedup {dedup}: {e}"));
                    assert!(got == sent, "dedup {dedup}: a body came back changed");
                }
            },
        )
        .await;
        stop.stop();
        w.await.unwrap().unwrap();
        p.shutdown().await.unwrap();
        assert_eq!(probe.xlen().await, 0, "dedup {dedup}");
        assert_eq!(probe.pending().await, 0, "dedup {dedup}");
        assert_eq!(probe.pending_index_keys().await, Vec::<String>::new());
        assert_eq!(
            stored_bodies(&server, &direct),
            Vec::<String>::new(),
            "dedup {dedup}: no stored body left"
        );
        // Answers: the cached ones (dedup on), and any whose write or delete a cut broke
        // off; every one expires.
        let answers = stored_answers(&server, &direct);
        assert!(
            answers.iter().all(|(_, ttl)| *ttl > 0),
            "dedup {dedup}: every stored answer expires: {answers:?}"
        );
    }
}

/// A call made right after the connections were cut (nothing in flight, so the
/// client only learns of it when it sends) succeeds, or fails only with a typed Redis
/// error and the same call made again succeeds. With dedup on, the producer itself sends
/// the submission again (it is idempotent), also when the first one goes unanswered: the
/// client library's multiplexed connection can leave a command sent as its connection
/// closes waiting for the command timeout (`conn::retry`), and a reconnection can take up
/// to the connect timeout (5 s), so a call may take that long, bounded by the timeouts
/// (4 s for commands here). Consumers shut down cleanly right after a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_dropped_connections_succeed() {
    logs();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let q = via(&proxy, &queue(&server, "faults2")).with_command_timeout(Duration::from_secs(4));
    let runs = Runs::default();
    let workers = workers(&q, &runs).await;
    let dedup = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let plain = Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_dedup(false))
        .await
        .unwrap();
    // Calls `p` until it answers `req`; any failure on the way is a typed Redis error.
    async fn until_answered(p: &Producer<Req, Resp>, req: &Req) {
        within(Duration::from_secs(30), "an answer", async {
            loop {
                match p.call(req).await {
                    Ok(got) => break assert_eq!(got, echo(req, "w")),
                    Err(e) => assert_eq!(e.kind(), ErrorKind::Redis, "{e}"),
                }
            }
        })
        .await;
    }
    for i in 0..5 {
        proxy.cut_all();
        until_answered(&dedup, &Req::new(i, "after a cut")).await;
        proxy.cut_all();
        until_answered(&plain, &Req::new(100 + i, "plain after a cut")).await;
    }
    // A graceful shutdown right after a cut still succeeds.
    proxy.cut_all();
    for w in workers {
        w.stop().await;
    }
    dedup.shutdown().await.unwrap();
    plain.shutdown().await.unwrap();
}

/// Redis forgets pelican's function library (FUNCTION FLUSH, as after a restart without
/// persistence): the next submission and the next outcome write load it again, and calls
/// go on; so does the next reclaim scan (on the reader's own connection), which takes
/// over a request whose consumer died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_on_after_the_scripts_are_flushed() {
    logs();
    let server = RedisServer::start();
    let q = queue(&server, "flush");
    let probe = Probe::new(&server, &q).await;
    let w = Worker::spawn(&q, fast_consumer(), 4, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for round in 0..3u64 {
        let req = Req::new(round, "flush");
        let out = within(Duration::from_secs(10), "a call", p.call(&req)).await;
        assert_eq!(out.unwrap(), echo(&req, "w"), "round {round}");
        let libraries: Vec<redis::Value> = probe.query(redis::cmd("FUNCTION").arg("LIST")).await;
        assert_eq!(libraries.len(), 1, "round {round}: loaded again");
        let _: () = probe.query(redis::cmd("FUNCTION").arg("FLUSH")).await;
    }
    w.stop().await;

    let mut dier = Consumer::<Req, Resp>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let req = Req::new(10, "reclaimed after a flush");
    let ticket = p.submit(&req).await.unwrap();
    let d = within(Duration::from_secs(5), "a delivery", dier.next())
        .await
        .unwrap()
        .unwrap();
    die(dier, d);
    let _: () = probe.query(redis::cmd("FUNCTION").arg("FLUSH")).await;
    let w = Worker::spawn(&q, fast_consumer(), 4, |r: Req, _| async move {
        Ok(echo(&r, "w"))
    })
    .await;
    let out = within(
        Duration::from_secs(10),
        "the reclaimed request's answer",
        ticket,
    )
    .await;
    assert_eq!(out.unwrap(), echo(&req, "w"));
    w.stop().await;
}

/// Without dedup, a submission whose reply is cut off after Redis queued it fails its
/// call (it is not sent again: it could be queued twice), and the request runs all the
/// same. Its large answer is pushed to a producer that no longer waits for it, the only
/// one that could read it: the producer deletes it, as it deletes every answer it reads
/// (before, it stayed for the result ttl and a minute; the failover scenario of the
/// reliability suite left one that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_to_a_call_cut_off_after_its_request_was_queued_is_deleted() {
    logs();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let direct = queue(&server, "cut-queued");
    let probe = Probe::new(&server, &direct).await;
    // The worker reads directly; the producer goes through the proxy. A 5 KB answer is
    // stored beside the stream.
    let (w, runs, gate) = Worker::gated(&direct, fast_consumer(), "a".repeat(5000)).await;
    let p = Producer::<Req, Resp>::connect(via(&proxy, &direct), fast_producer().with_dedup(false))
        .await
        .unwrap();
    let replies = direct.keys().reply(p.id());
    // A second each way through the proxy: the submission reaches Redis, and the
    // connection is cut while its reply is on the way back.
    proxy.set_latency(Duration::from_secs(1));
    let call = tokio::spawn({
        let p = p.clone();
        async move { p.call(&Req::new(1, "cut off")).await }
    });
    pelican_testkit::eventually(Duration::from_secs(10), "the request to be run", || {
        let n = runs.total();
        async move { n == 1 }
    })
    .await;
    proxy.cut_all();
    proxy.set_latency(Duration::ZERO);
    let e = within(Duration::from_secs(10), "the call to fail", call)
        .await
        .expect("call task")
        .expect_err("its reply was cut off");
    assert_eq!(e.kind(), ErrorKind::Redis, "{e:#}");
    gate.open();
    // The outcome is recorded, naming its stored answer, and pushed to the producer.
    pelican_testkit::eventually(Duration::from_secs(10), "the outcome pushed", || {
        let probe = &probe;
        let replies = &replies;
        async move {
            let entries: Vec<(String, Vec<Vec<u8>>)> = probe
                .query(redis::cmd("XRANGE").arg(replies).arg("-").arg("+"))
                .await;
            // pairs of request id and outcome; `A<length>:<name>` names a stored answer
            entries
                .iter()
                .flat_map(|(_, pairs)| pairs.iter().skip(1).step_by(2))
                .any(|outcome| outcome.first() == Some(&b'A'))
        }
    })
    .await;
    pelican_testkit::eventually(Duration::from_secs(10), "the unread answer deleted", || {
        let left = stored_answers(&server, &direct);
        async move { left.is_empty() }
    })
    .await;
    assert_eq!(runs.total(), 1);
    w.stop().await;
    p.shutdown().await.unwrap();
}
