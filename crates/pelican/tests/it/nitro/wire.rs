//! The wire, both ways: what a Nitro producer and a Nitro consumer see.

use super::*;
use pelican::nitro::{Producer, TOO_MANY_RETRIES};
use pelican::ErrorKind;
use pelican_testkit::eventually_sync;
use pelican_testkit::nitro::{result_key, Answer, NitroConsumer, NitroProducer};
use std::sync::atomic::{AtomicBool, Ordering};

/// A pelican producer drives a Nitro-style consumer: results and error texts come back,
/// the answer keys are deleted once read, the entries are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pelican_producer_drives_a_nitro_consumer() {
    let env = Env::new("nitro-p2n");
    let p = Producer::<Req, Req>::connect(env.config(), producer_config())
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (url, stream, s2) = (env.url(), env.stream.clone(), stop.clone());
    let consumer = std::thread::spawn(move || {
        let mut c = NitroConsumer::new(&url, &stream, Duration::from_secs(60));
        c.serve(&s2, |msg| {
            let r: Req = serde_json::from_str(msg).map_err(|e| e.to_string())?;
            if r.i == 99 {
                return Err(format!("nitro-peer: induced error for i={}", r.i));
            }
            Ok(msg.to_string())
        })
    });
    let reqs: Vec<Req> = (0..20).map(req).collect();
    let tickets: Vec<_> = futures_util::future::join_all(reqs.iter().map(|r| p.submit(r)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (i, t) in tickets.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), req(i as u64));
    }
    let err = p.call(&req(99)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote, "{err}");
    assert_eq!(err.message(), "nitro-peer: induced error for i=99");
    stop.store(true, Ordering::SeqCst);
    let served = consumer.join().unwrap();
    assert_eq!(served.len(), 21);
    assert_eq!(p.outstanding(), 0);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    assert_eq!(env.xlen(), 0);
    p.shutdown().await.unwrap();
}

/// A Nitro producer's requests served by a pelican consumer: the result key holds the
/// JSON with Nitro's TTL, a handler failure is the error key's plain text, every entry
/// is acknowledged and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nitro_producer_served_by_a_pelican_consumer() {
    let env = Env::new("nitro-n2p");
    let url = env.url();
    let stream = env.stream.clone();
    let mut producer = blocking(move || NitroProducer::new(&url, &stream)).await;
    let ids: Vec<String> = (0..10)
        .map(|i| producer.produce(&json_of(&req(i))))
        .collect();
    let failing = producer.produce(&json_of(&req(666)));
    let w = Worker::spawn(
        env.config(),
        consumer_config(Duration::from_secs(60)),
        4,
        |r: Req, job: Job| async move {
            assert_eq!(job.delivery_count(), 1);
            if r.i == 666 {
                return Err(HandlerError::fail("the number of the beast"));
            }
            Ok(Req {
                data: format!("done {}", r.data),
                ..r
            })
        },
    )
    .await;
    // Before the producer reads it: the key as Nitro's consumer writes it.
    let key = result_key(&env.stream, &ids[0]);
    eventually_sync(Duration::from_secs(20), "the first result key", || {
        env.keys(&key).len() == 1
    });
    let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut env.conn()).unwrap();
    assert!((3590..=3600).contains(&ttl), "TTL {ttl}");
    let (answers, err) = blocking(move || {
        let a = producer.await_all(&ids, Duration::from_secs(20));
        let e = producer.await_answer(&failing, Duration::from_secs(20));
        (a, e)
    })
    .await;
    for (id, a) in &answers {
        let Answer::Result(json) = a else {
            panic!("{id}: {a:?}")
        };
        let r: Req = serde_json::from_str(json).unwrap();
        assert_eq!(r.data, "done xxxx");
    }
    assert_eq!(err, Answer::Error("the number of the beast".into()));
    assert_eq!(env.xlen(), 0);
    assert!(env.pending().is_empty());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    w.stop().await;
}

/// An entry without a decodable `msg` gets an error key at once (Nitro's consumer keeps
/// it pending and loops on it for hours); the consumer goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_entries_get_an_error_at_once() {
    let env = Env::new("nitro-garbage");
    let runs = Runs::default();
    // Idletime 5 minutes: nothing here may wait for a takeover.
    let w = Worker::echo(
        env.config(),
        consumer_config(Duration::from_secs(300)),
        runs.clone(),
    )
    .await;
    let url = env.url();
    let stream = env.stream.clone();
    let (bad_json, no_msg, wrong_type, good, mut producer) = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let bad_json = p.produce("{not json");
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let no_msg: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("body")
            .arg("{}")
            .query(&mut c)
            .unwrap();
        let wrong_type = p.produce(r#"{"i":"one","data":"x"}"#);
        let good = p.produce(&json_of(&req(1)));
        (bad_json, no_msg, wrong_type, good, p)
    })
    .await;
    let answers = blocking(move || {
        let ids = [
            bad_json.clone(),
            no_msg.clone(),
            wrong_type.clone(),
            good.clone(),
        ];
        let a = producer.await_all(&ids, Duration::from_secs(20));
        (a, bad_json, no_msg, wrong_type, good)
    })
    .await;
    let (a, bad_json, no_msg, wrong_type, good) = answers;
    let text = |id: &String| match &a[id] {
        Answer::Error(t) => t.clone(),
        other => panic!("{id}: {other:?}"),
    };
    assert!(
        text(&bad_json).contains("cannot be decoded"),
        "{}",
        text(&bad_json)
    );
    assert!(
        text(&no_msg).contains("no 'msg' field"),
        "{}",
        text(&no_msg)
    );
    assert!(
        text(&wrong_type).contains("cannot be decoded"),
        "{}",
        text(&wrong_type)
    );
    assert_eq!(a[&good], Answer::Result(json_of(&req(1))));
    assert_eq!(runs.total(), 1, "only the good request reached the handler");
    assert_eq!(env.xlen(), 0);
    assert!(env.pending().is_empty());
    w.stop().await;
}

/// Past `max_retry_count` deliveries, an entry is answered "too many retries" without a
/// handler run; one under the limit is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_retry_limit_an_entry_gets_too_many_retries() {
    let env = Env::new("nitro-retries");
    let idle = Duration::from_millis(500);
    let url = env.url();
    let stream = env.stream.clone();
    // Two Nitro consumers take the poison entry in turn and die (their heartbeats stop):
    // delivered twice. The other entry was delivered once.
    let (poison, once, producer) = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let poison = p.produce(&json_of(&req(13)));
        let mut a = NitroConsumer::new(&url, &stream, idle);
        let m = a.consume().expect("a reads it");
        assert_eq!(m.id, poison);
        a.ack(&m.id); // dies holding it: no more heartbeats
        let once = p.produce(&json_of(&req(14)));
        let mut c = NitroConsumer::new(&url, &stream, idle);
        let m = c.consume().expect("c reads the second");
        assert_eq!(m.id, once);
        c.ack(&m.id);
        let mut b = NitroConsumer::new(&url, &stream, idle);
        let start = std::time::Instant::now();
        let m = loop {
            if let Some(m) = b.consume() {
                break m;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no takeover");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(m.id, poison, "the oldest idle entry first");
        b.ack(&m.id);
        (poison, once, p)
    })
    .await;
    let deliveries: HashMap<String, u64> = env
        .pending()
        .into_iter()
        .map(|(id, _, _, n)| (id, n))
        .collect();
    assert_eq!(deliveries[&poison], 2);
    assert_eq!(deliveries[&once], 1);
    let runs = Runs::default();
    let w = Worker::echo(
        env.config(),
        consumer_config(idle).with_max_retry_count(Some(1)),
        runs.clone(),
    )
    .await;
    let mut producer = producer;
    let a = blocking(move || producer.await_all(&[poison, once], Duration::from_secs(30))).await;
    let mut answers: Vec<&Answer> = a.values().collect();
    answers.sort_by_key(|a| matches!(a, Answer::Result(_)));
    assert_eq!(answers[0], &Answer::Error(TOO_MANY_RETRIES.into()));
    assert_eq!(answers[1], &Answer::Result(json_of(&req(14))));
    assert_eq!(runs.get(13), 0, "the poison never reached the handler");
    assert_eq!(runs.get(14), 1);
    assert!(env.pending().is_empty());
    assert_eq!(env.xlen(), 0);
    w.stop().await;
}

/// When both keys exist the error wins; both are deleted once read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_key_wins_and_both_keys_are_deleted() {
    let env = Env::new("nitro-both");
    let p = Producer::<Req, Req>::connect(env.config(), producer_config())
        .await
        .unwrap();
    // Nobody serves the stream yet: the test writes both answers, as two racing Nitro
    // consumers (one at its retry limit) can.
    let ticket = p.submit(&req(5)).await.unwrap();
    let id = ticket.entry_id().to_string();
    let mut c = env.conn();
    let _: () = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg(result_key(&env.stream, &id))
        .arg(json_of(&req(5)))
        .ignore()
        .cmd("SET")
        .arg(pelican_testkit::nitro::error_key(&env.stream, &id))
        .arg(TOO_MANY_RETRIES)
        .ignore()
        .query(&mut c)
        .unwrap();
    let err = ticket.await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert_eq!(err.message(), TOO_MANY_RETRIES);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    p.shutdown().await.unwrap();
}

/// A request without an answer fails after `request_timeout` (by the Redis clock) with
/// Nitro's timeout text, and is withdrawn from the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_times_out_and_is_withdrawn() {
    let env = Env::new("nitro-timeout");
    let p = Producer::<Req, Req>::connect(
        env.config(),
        producer_config().with_request_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let err = p.call(&req(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        err.message().contains(pelican::nitro::TIMEOUT_TEXT),
        "{err}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(env.xlen(), 0, "withdrawn");
    p.shutdown().await.unwrap();
}

/// A Nitro consumer that died between its SET and its XACK left the result key: a
/// pelican consumer that takes the entry over keeps that key (SET NX) and still
/// acknowledges and deletes the entry (Nitro's re-doer would leave it pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_by_a_dead_nitro_consumer_is_kept_and_the_entry_finished() {
    let env = Env::new("nitro-halfdone");
    let idle = Duration::from_millis(600);
    let (url, stream) = (env.url(), env.stream.clone());
    let (id, producer) = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let id = p.produce(&json_of(&req(8)));
        let mut c = NitroConsumer::new(&url, &stream, idle);
        let m = c.consume().unwrap();
        // SET, then the process dies: no XACK, no XDEL, no more heartbeats.
        let mut raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(result_key(&stream, &m.id))
            .arg(r#"{"i":8,"data":"first"}"#)
            .arg("EX")
            .arg(3600)
            .arg("NX")
            .query(&mut raw)
            .unwrap();
        c.ack(&m.id);
        (id, p)
    })
    .await;
    let runs = Runs::default();
    let w = Worker::echo(env.config(), consumer_config(idle), runs.clone()).await;
    pelican_testkit::eventually(
        Duration::from_secs(20),
        "the entry to be finished",
        || async { env.xlen() == 0 && env.pending().is_empty() },
    )
    .await;
    assert_eq!(runs.get(8), 1);
    let mut producer = producer;
    let a = blocking(move || producer.await_answer(&id, Duration::from_secs(5))).await;
    assert_eq!(a, Answer::Result(r#"{"i":8,"data":"first"}"#.into()));
    w.stop().await;
}

/// The producer's housekeeping trims entries Nitro consumers acknowledged but did not
/// delete (a crash between XACK and XDEL), never an undelivered or pending one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn housekeeping_trims_acknowledged_leftovers_only() {
    let env = Env::new("nitro-trim");
    let (url, stream) = (env.url(), env.stream.clone());
    let waiting = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let mut c = NitroConsumer::new(&url, &stream, Duration::from_secs(60));
        let mut raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        for i in 0..2 {
            p.produce(&json_of(&req(i)));
            let m = c.consume().unwrap();
            c.ack(&m.id);
            let _: i64 = redis::cmd("XACK")
                .arg(&stream)
                .arg(&stream)
                .arg(&m.id)
                .query(&mut raw)
                .unwrap();
        }
        p.produce(&json_of(&req(2)))
    })
    .await;
    assert_eq!(env.xlen(), 3);
    let p = Producer::<Req, Req>::connect(
        env.config(),
        producer_config().with_trim_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    // One request of its own in flight, undelivered: it must stay too.
    let ticket = p.submit(&req(3)).await.unwrap();
    pelican_testkit::eventually(
        Duration::from_secs(20),
        "the leftovers to be trimmed",
        || async { env.xlen() == 2 },
    )
    .await;
    let ids: Vec<String> = {
        let r: redis::Value = redis::cmd("XRANGE")
            .arg(&env.stream)
            .arg("-")
            .arg("+")
            .query(&mut env.conn())
            .unwrap();
        let redis::Value::Array(es) = r else { panic!() };
        es.iter()
            .map(|e| {
                let redis::Value::Array(p) = e else { panic!() };
                let redis::Value::BulkString(b) = &p[0] else {
                    panic!()
                };
                String::from_utf8_lossy(b).into_owned()
            })
            .collect()
    };
    assert_eq!(ids[0], waiting, "the undelivered entry stays");
    assert_eq!(ids[1], ticket.entry_id());
    drop(ticket);
    p.shutdown().await.unwrap();
}
