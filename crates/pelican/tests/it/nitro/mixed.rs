//! pelican and Nitro's processes in one stream and one group (a rolling migration).

use super::*;
use pelican::nitro::Producer;
use pelican_testkit::nitro::{result_key, Answer, NitroConsumer, NitroProducer};
use pelican_testkit::{eventually, eventually_sync};
use std::sync::atomic::{AtomicBool, Ordering};

/// A Nitro-style consumer and a pelican consumer share one group; requests come from a
/// Nitro-style producer and a pelican producer. Each consumer serves some, every request
/// gets its own answer once, nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_nitro_and_pelican_consumers() {
    let env = Env::new("nitro-mixed");
    let runs = Runs::default();
    let r2 = runs.clone();
    // Slow and narrow, so that the Nitro consumer gets its share.
    let w = Worker::spawn(
        env.config(),
        consumer_config(Duration::from_secs(60)).with_prefetch(2),
        2,
        move |r: Req, _job| {
            let runs = r2.clone();
            async move {
                runs.hit(r.i);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(Req {
                    data: "pelican".into(),
                    ..r
                })
            }
        },
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (url, stream, s2) = (env.url(), env.stream.clone(), stop.clone());
    let nitro = std::thread::spawn(move || {
        let mut c = NitroConsumer::new(&url, &stream, Duration::from_secs(60));
        c.serve(&s2, |msg| {
            let mut r: Req = serde_json::from_str(msg).map_err(|e| e.to_string())?;
            r.data = "nitro".into();
            Ok(serde_json::to_string(&r).unwrap())
        })
    });
    let p = Producer::<Req, Req>::connect(env.config(), producer_config())
        .await
        .unwrap();
    let (url, stream) = (env.url(), env.stream.clone());
    let raw = std::thread::spawn(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let ids: Vec<String> = (0..40).map(|i| p.produce(&json_of(&req(i)))).collect();
        p.await_all(&ids, Duration::from_secs(60))
            .into_values()
            .map(|a| match a {
                Answer::Result(j) => serde_json::from_str::<Req>(&j).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>()
    });
    let reqs: Vec<Req> = (100..140).map(req).collect();
    let ours = futures_util::future::join_all(reqs.iter().map(|r| p.call(r))).await;
    let mut by = HashMap::<String, u32>::new();
    for (i, r) in ours.into_iter().enumerate() {
        let r = r.unwrap();
        assert_eq!(r.i, 100 + i as u64);
        *by.entry(r.data).or_default() += 1;
    }
    let theirs = tokio::task::spawn_blocking(move || raw.join().unwrap())
        .await
        .unwrap();
    let mut seen: Vec<u64> = theirs.iter().map(|r| r.i).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
    for r in theirs {
        *by.entry(r.data).or_default() += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let nitro_served = tokio::task::spawn_blocking(move || nitro.join().unwrap())
        .await
        .unwrap();
    assert_eq!(by.values().sum::<u32>(), 80);
    assert!(by.get("nitro").copied().unwrap_or(0) > 0, "{by:?}");
    assert!(by.get("pelican").copied().unwrap_or(0) > 0, "{by:?}");
    assert_eq!(by["nitro"] as usize, nitro_served.len());
    assert_eq!(
        by["pelican"],
        runs.total(),
        "one run per request pelican answered"
    );
    assert_eq!(env.xlen(), 0);
    assert!(env.pending().is_empty());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// A Nitro consumer takes over an entry a pelican consumer is working on (as Nitro's
/// heartbeat does after a stall: XCLAIM JUSTID with min-idle 0). pelican's heartbeat
/// does not take it back and tells the handler; whichever answers first writes the one
/// result key, the other's answer leaves nothing behind, the entry is acknowledged and
/// deleted. Both orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_racing_a_takeover_leaves_one_result() {
    for nitro_first in [true, false] {
        race(nitro_first).await;
    }
}

async fn race(nitro_first: bool) {
    let env = Env::new("nitro-race");
    // Long: nothing but the explicit steal may take the entry over.
    let idle = Duration::from_secs(3);
    let gate = Arc::new(tokio::sync::Notify::new());
    let lost = Arc::new(AtomicBool::new(false));
    let (g2, l2) = (gate.clone(), lost.clone());
    // Concurrency 1: the marker request after the raced one is handled, and its answer
    // written, only after the raced one's answer was written.
    let w = Worker::spawn(
        env.config(),
        consumer_config(idle),
        1,
        move |r: Req, job: Job| {
            let (gate, lost) = (g2.clone(), l2.clone());
            async move {
                if r.i == 1 {
                    job.lease_lost().cancelled().await;
                    lost.store(true, Ordering::SeqCst);
                    gate.notified().await;
                }
                Ok(Req {
                    data: "pelican".into(),
                    ..r
                })
            }
        },
    )
    .await;
    let (url, stream) = (env.url(), env.stream.clone());
    let mut producer = blocking(move || NitroProducer::new(&url, &stream)).await;
    let raced = producer.produce(&json_of(&req(1)));
    eventually(
        Duration::from_secs(20),
        "pelican to hold the entry",
        || async {
            env.pending()
                .iter()
                .any(|(id, owner, _, _)| *id == raced && *owner == w.name)
        },
    )
    .await;
    let (url, stream, id) = (env.url(), env.stream.clone(), raced.clone());
    let mut nitro = blocking(move || {
        let mut c = NitroConsumer::new(&url, &stream, idle);
        c.steal(&id);
        c
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "the handler to learn it lost the entry",
        || async { lost.load(Ordering::SeqCst) },
    )
    .await;
    // The heartbeat that noticed the loss checked the owner and left the entry alone.
    let nitro_name = nitro.name().to_string();
    let owner = env
        .pending()
        .into_iter()
        .find(|(id, ..)| *id == raced)
        .unwrap()
        .1;
    assert_eq!(owner, nitro_name, "pelican's heartbeat took the entry back");
    let key = result_key(&env.stream, &raced);
    if nitro_first {
        let id = raced.clone();
        let (n, wrote) = blocking(move || {
            let wrote = nitro.set_result(&id, r#"{"i":1,"data":"nitro"}"#);
            nitro.ack(&id);
            (nitro, wrote)
        })
        .await;
        nitro = n;
        assert!(wrote);
        // The Nitro producer reads and deletes the answer before pelican's comes.
        let a = blocking({
            let id = raced.clone();
            move || {
                let a = producer.await_answer(&id, Duration::from_secs(20));
                (a, producer)
            }
        })
        .await;
        producer = a.1;
        assert_eq!(a.0, Answer::Result(r#"{"i":1,"data":"nitro"}"#.into()));
        gate.notify_one();
        let marker = producer.produce(&json_of(&req(2)));
        let m = blocking(move || {
            let a = producer.await_answer(&marker, Duration::from_secs(20));
            (a, producer)
        })
        .await;
        drop(m.1);
        assert_eq!(m.0, Answer::Result(r#"{"i":2,"data":"pelican"}"#.into()));
        assert!(
            env.keys(&key).is_empty(),
            "pelican's late answer left an orphan result key"
        );
    } else {
        gate.notify_one();
        eventually_sync(Duration::from_secs(20), "pelican's answer", || {
            env.keys(&key).len() == 1
        });
        assert_eq!(env.xlen(), 0, "pelican acknowledged and deleted the entry");
        let id = raced.clone();
        let (n, wrote) = blocking(move || {
            let wrote = nitro.set_result(&id, r#"{"i":1,"data":"nitro"}"#);
            nitro.ack(&id);
            (nitro, wrote)
        })
        .await;
        nitro = n;
        assert!(!wrote, "Nitro's SET NX found pelican's key (ErrAlreadySet)");
        let id = raced.clone();
        let a = blocking(move || {
            let a = producer.await_answer(&id, Duration::from_secs(20));
            (a, producer)
        })
        .await;
        assert_eq!(a.0, Answer::Result(r#"{"i":1,"data":"pelican"}"#.into()));
    }
    drop(nitro);
    assert_eq!(env.xlen(), 0);
    assert!(env.pending().is_empty());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    w.stop().await;
}
