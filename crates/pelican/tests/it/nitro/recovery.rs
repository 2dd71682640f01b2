//! Losses and stops: the stream deleted under running processes, a graceful stop
//! handing work back, consumers that are long gone.

use super::*;
use crate::common::Gate;
use pelican::nitro::Producer;
use pelican_testkit::nitro::{Answer, NitroConsumer, NitroProducer};
use pelican_testkit::{eventually, eventually_sync};

/// The stream is deleted under a running consumer and producer (a FLUSH, a restart
/// without persistence): a Nitro producer's XADD makes it again without the group, and
/// the consumer re-creates the group (NOGROUP) and serves it; the pelican producer's
/// next request re-creates stream and group itself; a request in flight when the stream
/// went is submitted again and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_is_recovered() {
    let env = Env::new("nitro-lost");
    let runs = Runs::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (r2, g2) = (runs.clone(), gate.clone());
    let w = Worker::spawn(
        env.config(),
        consumer_config(Duration::from_secs(60)),
        4,
        move |r: Req, _job| {
            let (runs, gate) = (r2.clone(), g2.clone());
            async move {
                runs.hit(r.i);
                if r.i == 7 {
                    gate.acquire().await.unwrap().forget();
                }
                Ok(r)
            }
        },
    )
    .await;
    let p = Producer::<Req, Req>::connect(
        env.config(),
        producer_config().with_verify_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    assert_eq!(p.call(&req(1)).await.unwrap(), req(1));

    // 1. Deleted under a running Nitro producer, which writes first (no NOMKSTREAM: the
    //    stream comes back without its group; Nitro creates groups only at start).
    let (url, stream) = (env.url(), env.stream.clone());
    let mut nitro = blocking(move || NitroProducer::new(&url, &stream)).await;
    let _: i64 = redis::cmd("DEL")
        .arg(&env.stream)
        .query(&mut env.conn())
        .unwrap();
    let a = blocking(move || {
        let id = nitro.produce(&json_of(&req(2)));
        nitro.await_answer(&id, Duration::from_secs(30))
    })
    .await;
    assert_eq!(a, Answer::Result(json_of(&req(2))));

    // 2. Deleted; the pelican producer writes first.
    let _: i64 = redis::cmd("DEL")
        .arg(&env.stream)
        .query(&mut env.conn())
        .unwrap();
    assert_eq!(p.call(&req(3)).await.unwrap(), req(3));

    // 3. Deleted while a request is in work: it is lost with the stream; the producer
    //    notices, submits it again, and the new entry is answered.
    let ticket = p.submit(&req(7)).await.unwrap();
    let first = ticket.entry_id().to_string();
    eventually(
        Duration::from_secs(20),
        "the consumer to hold the request",
        || async { runs.get(7) == 1 },
    )
    .await;
    let _: i64 = redis::cmd("DEL")
        .arg(&env.stream)
        .query(&mut env.conn())
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the request to be submitted again",
        || async { runs.get(7) == 2 },
    )
    .await;
    gate.add_permits(2);
    assert_eq!(ticket.await.unwrap(), req(7));
    let key = format!("result-key:{}.{first}", env.stream);
    assert!(
        env.keys(&key).is_empty(),
        "the lost entry's late answer left a key"
    );
    eventually_sync(Duration::from_secs(20), "nothing pending", || {
        env.pending().is_empty()
    });
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// A graceful stop hands the work in hand back at once: a Nitro consumer takes it over
/// right away (not after the idletime), and the hand-back did not count a delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_work_back_at_once() {
    let env = Env::new("nitro-handback");
    // A minute: a takeover within the test can only come from the hand-back.
    let idle = Duration::from_secs(60);
    let (url, stream) = (env.url(), env.stream.clone());
    let (ids, mut producer) = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let ids: Vec<String> = (0..3).map(|i| p.produce(&json_of(&req(i)))).collect();
        (ids, p)
    })
    .await;
    let w = Worker::spawn(
        env.config(),
        consumer_config(idle).with_shutdown_timeout(Duration::from_millis(300)),
        3,
        |_r: Req, _job: Job| async move {
            // Never done: the stop's timeout cancels it.
            std::future::pending::<Result<Req, HandlerError>>().await
        },
    )
    .await;
    let name = w.name.clone();
    eventually(
        Duration::from_secs(20),
        "pelican to hold all three",
        || async {
            env.pending()
                .iter()
                .filter(|(_, o, _, _)| *o == name)
                .count()
                == 3
        },
    )
    .await;
    w.stop().await;
    for (id, owner, idle_ms, deliveries) in env.pending() {
        assert_eq!(owner, name, "{id}");
        assert!(idle_ms >= 60_000, "{id} handed back with idle {idle_ms}");
        assert_eq!(deliveries, 1, "{id}: the hand-back counted a delivery");
    }
    let (url, stream) = (env.url(), env.stream.clone());
    let taken = blocking(move || {
        let mut c = NitroConsumer::new(&url, &stream, idle);
        let mut taken = Vec::new();
        for _ in 0..3 {
            let m = c.consume().expect("an idle entry, at once");
            assert!(c.set_result(&m.id, m.msg.as_deref().unwrap()));
            c.ack(&m.id);
            taken.push(m.id);
        }
        taken
    })
    .await;
    assert_eq!(taken, ids);
    let a = blocking(move || producer.await_all(&ids, Duration::from_secs(20))).await;
    assert_eq!(a.len(), 3);
    assert!(env.pending().is_empty());

    // With nothing in hand, a stop leaves the group.
    let w = Worker::echo(env.config(), consumer_config(idle), Runs::default()).await;
    let name = w.name.clone();
    eventually(
        Duration::from_secs(20),
        "the consumer to register",
        || async { env.consumers().iter().any(|(n, _)| *n == name) },
    )
    .await;
    w.stop().await;
    assert!(
        !env.consumers().iter().any(|(n, _)| *n == name),
        "{:?}",
        env.consumers()
    );
}

/// Consumers that own nothing and have been idle long (Nitro's per-start UUIDs, its
/// producers' reaper names) are removed; one that owns an entry is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_consumers_are_removed() {
    let env = Env::new("nitro-gc");
    let (url, stream) = (env.url(), env.stream.clone());
    let holder = blocking(move || {
        let mut p = NitroProducer::new(&url, &stream);
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        for name in ["a1b2c3d4-0000-4000-8000-000000000001", "reaper-uuid"] {
            let _: i64 = redis::cmd("XGROUP")
                .arg("CREATECONSUMER")
                .arg(&stream)
                .arg(&stream)
                .arg(name)
                .query(&mut c)
                .unwrap();
        }
        p.produce(&json_of(&req(1)));
        let mut holder = NitroConsumer::new(&url, &stream, Duration::from_secs(600));
        let m = holder.consume().unwrap();
        holder.ack(&m.id); // dead, holding it
        holder.name().to_string()
    })
    .await;
    let w = Worker::echo(
        env.config(),
        consumer_config(Duration::from_secs(600))
            .with_consumer_gc_after(Duration::from_millis(300)),
        Runs::default(),
    )
    .await;
    let me = w.name.clone();
    eventually(
        Duration::from_secs(30),
        "the empty consumers to be removed",
        || async {
            let names: Vec<String> = env.consumers().into_iter().map(|(n, _)| n).collect();
            names.len() == 2 && names.contains(&holder) && names.contains(&me)
        },
    )
    .await;
    w.stop().await;
}

/// Redis restarts without persistence under a running consumer and producer: every
/// connection drops, the stream, the group and the scripts are gone. The consumer
/// reconnects and re-creates the group, the producer submits its lost requests again,
/// and every caller gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_without_persistence_loses_no_caller() {
    let mut env = Env::new("nitro-restart");
    let runs = Runs::default();
    // Handlers hold their requests until Redis has restarted: work is under way across
    // the restart.
    let restarted = Gate::default();
    let (r2, g2) = (runs.clone(), restarted.clone());
    let w = Worker::spawn(
        env.config(),
        consumer_config(Duration::from_secs(60)),
        4,
        move |r: Req, _job| {
            let (runs, restarted) = (r2.clone(), g2.clone());
            async move {
                runs.hit(r.i);
                restarted.wait().await;
                Ok(r)
            }
        },
    )
    .await;
    let p = Producer::<Req, Req>::connect(
        env.config(),
        producer_config().with_verify_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let reqs: Vec<Req> = (0..10).map(req).collect();
    let mut tickets = Vec::new();
    for r in &reqs {
        tickets.push(p.submit(r).await.unwrap());
    }
    eventually(Duration::from_secs(20), "work to be under way", || async {
        runs.total() >= 1
    })
    .await;
    env.server.restart();
    restarted.open();
    for (t, r) in tickets.into_iter().zip(&reqs) {
        let got = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(&got, r);
    }
    assert!(runs.total() >= 10);
    // And the stream works as before.
    assert_eq!(p.call(&req(42)).await.unwrap(), req(42));
    w.stop().await;
    p.shutdown().await.unwrap();
}
