//! Large bodies: raw bytes (`pelican::Raw`), bodies stored beside the stream (dedup on,
//! 4 KiB or more: docs/PROTOCOL.md, "Stored bodies"), up to 16 MiB when
//! `max_body_bytes` allows it; nothing of a body is left in Redis once it is answered.

use crate::common::*;
use pelican::admin::RequestState;
use pelican::{Admin, Bytes, Consumer, ErrorKind, Producer, Raw, Submitted};
use pelican_testkit::RedisServer;
use std::sync::atomic::Ordering;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// `n` bytes that differ from one body to the next and along the body.
fn body(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// A producer of raw bodies on `q`, with the tests' short timings.
async fn raw_producer(q: &pelican::QueueConfig) -> Producer<Bytes, Bytes, Raw> {
    Producer::connect(q.clone(), fast_producer()).await.unwrap()
}

/// Stored answers are kept as long as their outcome is cached (the result ttl and a
/// minute): with dedup on, one per answer of 4 KiB or more; with dedup off none, once the
/// producer has read them (it deletes them just after).
async fn answers_left_are_the_cached_ones(
    server: &RedisServer,
    q: &pelican::QueueConfig,
    dedup: bool,
    cached: usize,
) {
    if dedup {
        let answers = stored_answers(server, q);
        assert_eq!(
            answers.len(),
            cached,
            "one stored answer per large response: {answers:?}"
        );
        let most = (q.result_ttl + Duration::from_secs(60)).as_millis() as i64;
        assert!(
            answers.iter().all(|(_, ttl)| *ttl > 0 && *ttl <= most),
            "every answer expires with its outcome: {answers:?}"
        );
    } else {
        let left = || {
            let n = stored_answers(server, q).len();
            async move { n == 0 }
        };
        pelican_testkit::eventually(Duration::from_secs(10), "read answers to be deleted", left)
            .await;
    }
}

/// Bodies from 100 bytes to 16 MiB, with dedup on (stored beside the stream from 4 KiB)
/// and off (in the entry), echoed back byte for byte: requests and responses of that
/// size both work, and no stored body outlives its request. Every other body is handed
/// over (`call_bytes`) rather than encoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_bodies_up_to_16_mib_round_trip_and_leave_no_body_behind() {
    let server = RedisServer::start();
    for dedup in [true, false] {
        let q = queue(&server, "large").with_max_body_bytes(17 * MIB);
        let consumer = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_consumer())
            .await
            .unwrap();
        let stop = consumer.stopper();
        let w = tokio::spawn(consumer.serve(4, |b: Bytes, _| async move { Ok(b) }));
        let p =
            Producer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_producer().with_dedup(dedup))
                .await
                .unwrap();
        let sizes = [100, 4095, 4096, 100_000, MIB, 16 * MIB];
        let calls = sizes.iter().enumerate().map(|(i, &n)| {
            let p = p.clone();
            async move {
                let b = body(n, i as u8);
                let r = if i % 2 == 0 {
                    p.call(&b).await
                } else {
                    p.call_bytes(body(n, i as u8)).await
                };
                (b, r)
            }
        });
        for (sent, got) in futures_util::future::join_all(calls).await {
            let got = got.unwrap_or_else(|e| panic!("{} bytes, dedup {dedup}: {e}", sent.len()));
            assert!(got == sent, "{} bytes came back changed", sent.len());
        }
        assert_eq!(
            stored_bodies(&server, &q),
            Vec::<String>::new(),
            "dedup {dedup}: answered requests keep no body"
        );
        let large = sizes.iter().filter(|&&n| n >= 4096).count();
        answers_left_are_the_cached_ones(&server, &q, dedup, large).await;
        stop.stop();
        w.await.unwrap().unwrap();
        p.shutdown().await.unwrap();
    }
}

/// A backlog of 100 KB requests, dedup on (stored bodies) and off (bodies in the
/// entries): the consumer reads them in parts over several connections (at least two of
/// its connections last ran a read), and every request is answered with its own body and
/// run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_are_split_over_connections_and_each_request_runs_once() {
    let server = RedisServer::start();
    for dedup in [true, false] {
        let q = queue(&server, "parts");
        let p =
            Producer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_producer().with_dedup(dedup))
                .await
                .unwrap();
        // All submitted before the consumer starts: a backlog, which is what a read is
        // split for (a lone request is read whole).
        let n = 200;
        let mut tickets = Vec::new();
        for i in 0..n {
            let mut b = body(100_000, i as u8).to_vec();
            b[..4].copy_from_slice(&(i as u32).to_le_bytes());
            let b = Bytes::from(b);
            tickets.push((b.clone(), p.submit_bytes(b).await.unwrap()));
        }
        let (runs, stop, w) = counting_raw_worker(&q, 8, |b| b).await;
        for (sent, t) in tickets {
            let got = t.await.unwrap_or_else(|e| panic!("dedup {dedup}: {e}"));
            assert!(got == sent, "dedup {dedup}: a body came back changed");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            n,
            "dedup {dedup}: each run once"
        );
        let mut c = server.sync_connection();
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
        let readers = list
            .lines()
            .filter(|l| l.contains(" cmd=xreadgroup ") || l.contains(" cmd=mget "))
            .count();
        assert!(
            readers >= 2,
            "dedup {dedup}: read on one connection:\n{list}"
        );
        stop.stop();
        w.await.unwrap().unwrap();
        p.shutdown().await.unwrap();
        assert_eq!(stored_bodies(&server, &q), Vec::<String>::new());
        answers_left_are_the_cached_ones(&server, &q, dedup, n as usize).await;
    }
}

/// The default limit (4 MiB) still holds: a larger body is refused at the producer with
/// a clear error and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_default_limit_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let q = queue(&server, "toolarge");
    let p = raw_producer(&q).await;
    let Err(e) = p.submit(&body(5 * MIB, 1)).await else {
        panic!("a 5 MiB body was accepted")
    };
    assert!(e.message().contains("max_body_bytes"), "{e}");
    let Err(e) = p.submit_bytes(body(5 * MIB, 2)).await else {
        panic!("a 5 MiB body handed over was accepted")
    };
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert_eq!(stored_bodies(&server, &q), Vec::<String>::new());
}

/// Identical large requests from two producers are solved once; a consumer that took the
/// request and died leaves it to another, which reads the stored body through reclaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_body_is_solved_once_and_survives_its_consumer() {
    let server = RedisServer::start();
    let q = queue(&server, "large-dedup");
    let p1 = raw_producer(&q).await;
    let p2 = raw_producer(&q).await;
    let b = body(2 * MIB, 7);
    let t1 = p1.submit(&b).await.unwrap();
    let t2 = p2.submit(&b).await.unwrap();
    assert_eq!(t2.submitted(), pelican::Submitted::Joined);
    assert_eq!(stored_bodies(&server, &q).len(), 1, "one body for both");

    // a consumer takes it and dies without a word
    let mut dying = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_consumer())
        .await
        .unwrap();
    let d = dying.next().await.unwrap().expect("a delivery");
    assert!(*d.request() == b, "delivered with its stored body");
    std::mem::forget(d);
    drop(dying);

    let (runs, stop, w) = counting_raw_worker(&q, 2, |b| Bytes::from(b.len().to_string())).await;
    let (a, c) = tokio::join!(t1, t2);
    assert_eq!(&a.unwrap()[..], b"2097152");
    assert_eq!(&c.unwrap()[..], b"2097152");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "solved once, by the second consumer"
    );
    assert_eq!(stored_bodies(&server, &q), Vec::<String>::new());
    stop.stop();
    w.await.unwrap().unwrap();
}

/// Dead-letters the only request on `q` (its ticket `t`): with one delivery allowed, a
/// consumer takes it and dies without a word, and the next consumer buries it. What its
/// caller got.
async fn dead_letter_it(
    q: &pelican::QueueConfig,
    t: pelican::Ticket<Bytes, Raw>,
) -> pelican::Error {
    let one = || fast_consumer().with_max_deliveries(1);
    let mut dying = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), one())
        .await
        .unwrap();
    std::mem::forget(dying.next().await.unwrap().expect("a delivery"));
    drop(dying);
    let consumer = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), one())
        .await
        .unwrap();
    let stop = consumer.stopper();
    let w = tokio::spawn(consumer.serve(1, |b: Bytes, _| async move { Ok(b) }));
    let Err(e) = t.await else {
        panic!("a request nobody could answer was answered")
    };
    stop.stop();
    w.await.unwrap().unwrap();
    e
}

/// A stored body goes with its request to the dead letters (listed with its size and first
/// bytes) and back to the queue on requeue; a purge deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_body_goes_to_the_dead_letters_and_back() {
    let server = RedisServer::start();
    let q = queue(&server, "large-dead");
    let p = raw_producer(&q).await;
    let b = Bytes::from(vec![b'z'; 50_000]);
    let t = p.submit(&b).await.unwrap();
    let one = || fast_consumer().with_max_deliveries(1);
    let e = dead_letter_it(&q, t).await;
    assert_eq!(e.kind(), ErrorKind::Dead, "{e}");

    let admin = pelican::Admin::connect(q.clone()).await.unwrap();
    let dead = admin.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].body_len, 50_000);
    assert!(
        dead[0].body_preview.starts_with("zzzz"),
        "{:?}",
        dead[0].body_preview
    );
    assert_eq!(stored_bodies(&server, &q).len(), 1, "kept with its letter");

    let requeued = admin
        .requeue(&[dead[0].id.clone()], std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert!(requeued[0].1.is_some(), "{requeued:?}");
    let mut consumer = Consumer::<Bytes, Bytes, Raw>::connect(q.clone(), one())
        .await
        .unwrap();
    let d = consumer
        .next()
        .await
        .unwrap()
        .expect("the requeued request");
    assert!(*d.request() == b, "requeued with its body");
    assert!(d.respond(&Bytes::from_static(b"ok")).await.unwrap());
    assert_eq!(
        stored_bodies(&server, &q),
        Vec::<String>::new(),
        "answered: gone"
    );
    consumer.shutdown().await.unwrap();

    // and a purge takes a dead letter's body with it
    let t = p.submit(&Bytes::from(vec![b'y'; 60_000])).await.unwrap();
    assert_eq!(dead_letter_it(&q, t).await.kind(), ErrorKind::Dead);
    assert_eq!(stored_bodies(&server, &q).len(), 1);
    assert_eq!(admin.purge_dead().await.unwrap(), 1);
    assert_eq!(
        stored_bodies(&server, &q),
        Vec::<String>::new(),
        "purged with its letter"
    );
}

/// A 100 KB answer to a small request: the request, then `x` up to 100 KB.
fn large_answer(req: Bytes) -> Bytes {
    let mut a = vec![b'x'; 100_000];
    a[..req.len()].copy_from_slice(&req);
    a.into()
}

/// Large answers (docs/PROTOCOL.md, "Stored answers"): a 100 KB response to a small
/// request reaches both producers joined on it and a later identical request answered
/// from the cache, byte for byte, solved once; `inspect` shows its first bytes; and when
/// the answer is gone from Redis (evicted), the request is solved again: its waiter gets
/// the answer, not an error or a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_reach_every_waiter_and_the_cache_and_a_lost_one_is_solved_again() {
    install_counters();
    let server = RedisServer::start();
    let q = queue(&server, "answers");
    let p1 = raw_producer(&q).await;
    let p2 = raw_producer(&q).await;
    let req = Bytes::from_static(b"render frame 7");
    // Both submitted before the worker starts: joined on one entry.
    let t1 = p1.submit_bytes(req.clone()).await.unwrap();
    let t2 = p2.submit_bytes(req.clone()).await.unwrap();
    assert_eq!(t2.submitted(), Submitted::Joined);
    let rid = t1.request_id().to_string();
    let (runs, stop, w) = counting_raw_worker(&q, 2, large_answer).await;
    let want = large_answer(req.clone());
    assert!(t1.await.unwrap() == want, "the first waiter's answer");
    assert!(t2.await.unwrap() == want, "the joined waiter's answer");

    let t3 = p1.submit_bytes(req.clone()).await.unwrap();
    assert_eq!(t3.submitted(), Submitted::Cached);
    assert!(t3.await.unwrap() == want, "the cached answer");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "solved once");

    let admin = Admin::connect(q.clone()).await.unwrap();
    let info = admin.inspect(&rid).await.unwrap().expect("known");
    assert_eq!(info.state, RequestState::Ok);
    assert_eq!(
        info.outcome_preview.as_deref(),
        Some(std::str::from_utf8(&want[..200]).unwrap())
    );

    let answers = stored_answers(&server, &q);
    assert_eq!(answers.len(), 1, "one stored answer: {answers:?}");
    let mut c = server.sync_connection();
    let () = redis::cmd("DEL").arg(&answers[0].0).query(&mut c).unwrap();
    // Gone from Redis (evicted, say): the next identical request is solved again, not
    // answered with what is not there.
    assert!(
        p2.call_bytes(req.clone()).await.unwrap() == want,
        "solved again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "solved a second time");
    assert_eq!(
        resubmitted(&q.name, "answer_gone"),
        1,
        "counted, with its reason"
    );
    assert_eq!(stored_answers(&server, &q).len(), 1, "the new answer");
    stop.stop();
    w.await.unwrap().unwrap();
    p1.shutdown().await.unwrap();
    p2.shutdown().await.unwrap();
}

/// Over a Unix socket the own connections are the client library's, not lean ones: the
/// writer sends a stored answer's SET and its `complete.lua` call as one pipeline, the
/// producer sends stored bodies the same way and fetches answers on its shared
/// connection. 100 KB requests answered with 100 KB, dedup on and off, byte for byte,
/// nothing left behind but the cached answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_and_answers_over_a_unix_socket() {
    let sock =
        std::env::temp_dir().join(format!("{}.sock", pelican_testkit::unique_name("pelican")));
    let server = RedisServer::builder()
        .arg("--unixsocket")
        .arg(sock.display().to_string())
        .arg("--unixsocketperm")
        .arg("700")
        .start();
    for dedup in [true, false] {
        let tcp = queue(&server, "unix");
        let q = pelican::QueueConfig::new(format!("unix://{}", sock.display()), tcp.name.clone())
            .with_janitor_interval(Duration::from_millis(200));
        let p =
            Producer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_producer().with_dedup(dedup))
                .await
                .unwrap();
        let (runs, stop, w) = counting_raw_worker(&q, 4, |b| {
            let mut a = b.to_vec();
            a.reverse();
            a.into()
        })
        .await;
        let calls = (0..20u8).map(|i| {
            let p = p.clone();
            async move {
                let b = body(100_000, i);
                (b.clone(), p.call_bytes(b).await)
            }
        });
        for (sent, got) in futures_util::future::join_all(calls).await {
            let got = got.unwrap_or_else(|e| panic!("dedup {dedup}: {e}"));
            let mut want = sent.to_vec();
            want.reverse();
            assert!(got == want, "dedup {dedup}: an answer came back changed");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 20, "dedup {dedup}");
        stop.stop();
        w.await.unwrap().unwrap();
        p.shutdown().await.unwrap();
        assert_eq!(stored_bodies(&server, &tcp), Vec::<String>::new());
        answers_left_are_the_cached_ones(&server, &tcp, dedup, 20).await;
    }
    let _ = std::fs::remove_file(&sock);
}

/// The README's least-privilege ACL line covers stored bodies and answers: 100 KB
/// requests answered with 100 KB, dedup on and off, as a user with only those rules, and
/// nothing pelican does denied in the ACL log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_and_answers_as_the_readmes_acl_user() {
    let readme = include_str!("../../../../README.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER pelican on >CHANGE-ME "))
        .expect("README.md shows the ACL line");
    let server = RedisServer::start();
    let mut setuser: Vec<&str> = line.split_whitespace().collect();
    setuser[4] = ">s3cret";
    assert_eq!(server.cli(&setuser).trim(), "OK");
    for dedup in [true, false] {
        let mut q = queue(&server, "acl-large");
        q.url = format!("redis://pelican:s3cret@127.0.0.1:{}", server.port());
        let p =
            Producer::<Bytes, Bytes, Raw>::connect(q.clone(), fast_producer().with_dedup(dedup))
                .await
                .unwrap();
        let (_, stop, w) = counting_raw_worker(&q, 4, |b| b).await;
        for i in 0..10u8 {
            let b = body(100_000, i);
            let got = p
                .call_bytes(b.clone())
                .await
                .unwrap_or_else(|e| panic!("dedup {dedup}: {e:#}"));
            assert!(got == b, "dedup {dedup}: an answer came back changed");
        }
        stop.stop();
        w.await.unwrap().unwrap();
        p.shutdown().await.unwrap();
    }
    // Redis 7.2 and later (and Valkey) deny the client library's greeting
    // (`client|setinfo`), whose answer it ignores; the README says so. Nothing else.
    let log = server.cli(&["ACL", "LOG"]);
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    let denied: Vec<&str> = lines
        .windows(2)
        .filter(|w| w[0] == "object")
        .map(|w| w[1])
        .filter(|o| *o != "client|setinfo")
        .collect();
    assert!(denied.is_empty(), "denied {denied:?}: {log}");
}
