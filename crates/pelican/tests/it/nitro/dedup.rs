//! Dedup on the unchanged wire: identical `msg` bodies in flight together are solved by
//! one handler run, and every entry gets its answer.

use super::*;
use pelican_testkit::eventually;
use pelican_testkit::nitro::{Answer, NitroProducer};
use std::sync::atomic::{AtomicBool, Ordering};

/// The copies that joined a job in flight: the `j` fields of every dedup job of the stream.
fn joiners(url: &str, stream: &str) -> usize {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let jobs: Vec<String> = redis::cmd("KEYS")
        .arg(dedup_jobs(stream))
        .query(&mut c)
        .unwrap();
    jobs.iter()
        .map(|job| {
            let fields: HashMap<String, String> =
                redis::cmd("HGETALL").arg(job).query(&mut c).unwrap();
            fields.values().filter(|v| *v == "j").count()
        })
        .sum()
}

/// Three Nitro producers send the same six requests (18 entries); two pelican consumers
/// with dedup run the handler six times, and every entry gets its result key. Each run
/// waits until the 12 copies have joined a job in flight, so the test takes the join path
/// (not the cache's). With the cache (on by default with dedup), a repeat after the
/// answers is answered without a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_from_several_producers_are_solved_once() {
    let env = Env::new("nitro-dedup");
    let distinct = 6u64;
    let mut producers = Vec::new();
    let mut ids: Vec<(usize, u64, String)> = Vec::new();
    for p in 0..3 {
        let (url, stream) = (env.url(), env.stream.clone());
        producers.push(blocking(move || NitroProducer::new(&url, &stream)).await);
        for i in 0..distinct {
            let id = producers[p].produce(&json_of(&req(i)));
            ids.push((p, i, id));
        }
    }
    let runs = Runs::default();
    let cfg = consumer_config(Duration::from_secs(60)).with_dedup(true);
    let mut workers = Vec::new();
    let copies = ids.len() - distinct as usize;
    // Set once every copy has joined: a job's joiners go with its answer, so the count
    // falls again as the first runs finish.
    let all_joined = Arc::new(AtomicBool::new(false));
    for _ in 0..2 {
        let r2 = runs.clone();
        let (url, stream, all_joined) = (env.url(), env.stream.clone(), all_joined.clone());
        workers.push(
            Worker::spawn(env.config(), cfg.clone(), 4, move |r: Req, _job| {
                let runs = r2.clone();
                let (url, stream, all_joined) = (url.clone(), stream.clone(), all_joined.clone());
                async move {
                    runs.hit(r.i);
                    // Every slot is free for a copy (a joined copy holds none), so all 18
                    // entries are read while the six runs wait here.
                    eventually(
                        Duration::from_secs(20),
                        "every copy to join a job in flight",
                        || {
                            let (url, stream) = (url.clone(), stream.clone());
                            let all_joined = all_joined.clone();
                            async move {
                                if !all_joined.load(Ordering::SeqCst)
                                    && blocking(move || joiners(&url, &stream)).await == copies
                                {
                                    all_joined.store(true, Ordering::SeqCst);
                                }
                                all_joined.load(Ordering::SeqCst)
                            }
                        },
                    )
                    .await;
                    Ok(Req {
                        data: format!("solved {}", r.i),
                        ..r
                    })
                }
            })
            .await,
        );
    }
    let ids2 = ids.clone();
    let (answered, mut producers) = blocking(move || {
        let mut answered = 0;
        for (p, producer) in producers.iter_mut().enumerate() {
            let mine: Vec<(u64, String)> = ids2
                .iter()
                .filter(|(q, _, _)| *q == p)
                .map(|(_, i, id)| (*i, id.clone()))
                .collect();
            let just_ids: Vec<String> = mine.iter().map(|(_, id)| id.clone()).collect();
            let a = producer.await_all(&just_ids, Duration::from_secs(60));
            for (i, id) in mine {
                let Answer::Result(json) = &a[&id] else {
                    panic!("{id}: {:?}", a[&id])
                };
                let r: Req = serde_json::from_str(json).unwrap();
                assert_eq!((r.i, r.data.as_str()), (i, format!("solved {i}").as_str()));
                answered += 1;
            }
        }
        (answered, producers)
    })
    .await;
    assert_eq!(answered, 18);
    assert_eq!(
        runs.total(),
        distinct as u32,
        "handler runs = distinct requests"
    );
    for i in 0..distinct {
        assert_eq!(runs.get(i), 1, "request {i}");
    }
    assert_eq!(env.xlen(), 0);
    assert!(env.pending().is_empty());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());

    // A repeat within the cache TTL (the default's): answered from the cache.
    let mut p0 = producers.swap_remove(0);
    let a = blocking(move || {
        let again = p0.produce(&json_of(&req(3)));
        p0.await_answer(&again, Duration::from_secs(20))
    })
    .await;
    assert_eq!(
        a,
        Answer::Result(json_of(&Req {
            i: 3,
            data: "solved 3".into()
        }))
    );
    assert_eq!(runs.total(), distinct as u32);
    eventually(Duration::from_secs(5), "the entry to be gone", || async {
        env.xlen() == 0
    })
    .await;
    for w in workers {
        w.stop().await;
    }
}

/// Without dedup every entry is its own run (the control for the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dedup_every_entry_runs() {
    let env = Env::new("nitro-nodedup");
    let (url, stream) = (env.url(), env.stream.clone());
    let mut p = blocking(move || NitroProducer::new(&url, &stream)).await;
    let ids: Vec<String> = (0..6).map(|_| p.produce(&json_of(&req(1)))).collect();
    let runs = Runs::default();
    let w = Worker::echo(
        env.config(),
        consumer_config(Duration::from_secs(60)),
        runs.clone(),
    )
    .await;
    let a = blocking(move || p.await_all(&ids, Duration::from_secs(30))).await;
    assert_eq!(a.len(), 6);
    assert_eq!(runs.total(), 6);
    w.stop().await;
}

/// With the cache switched off, dedup joins only copies in flight together: a repeat that
/// comes after the answer runs again (the control for the default cache above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cache_a_repeat_after_the_answer_runs_again() {
    let env = Env::new("nitro-nocache");
    let (url, stream) = (env.url(), env.stream.clone());
    let mut p = blocking(move || NitroProducer::new(&url, &stream)).await;
    let runs = Runs::default();
    let cfg = consumer_config(Duration::from_secs(60))
        .with_dedup(true)
        .with_dedup_cache_ttl(None);
    let w = Worker::echo(env.config(), cfg, runs.clone()).await;
    let p = blocking(move || {
        for _ in 0..2 {
            let id = p.produce(&json_of(&req(7)));
            let a = p.await_answer(&id, Duration::from_secs(20));
            assert_eq!(a, Answer::Result(json_of(&req(7))));
        }
        p
    })
    .await;
    drop(p);
    assert_eq!(runs.total(), 2);
    assert!(env
        .keys(&format!("pelican-nitro:{{{}}}:*", env.stream))
        .is_empty());
    w.stop().await;
}
