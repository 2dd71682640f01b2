//! One focused test per bug the fault scenarios found, against the library in this
//! process (the scenarios themselves stay as the end-to-end regression tests):
//!
//! 1. A live consumer was told it lost the lease of a request it had just answered
//!    (renewal raced the write of the outcome): `no_lease_lost_for_answered_requests`.
//! 2. Innocent requests that shared a process with a poison request were dead-lettered
//!    with it: `innocent_requests_are_not_dead_lettered_with_poison`, and (the first
//!    fix's hole) `a_last_delivery_is_not_taken_with_work_in_hand`.
//! 3. A request key of the wrong type, written by a foreign client, aborted the whole
//!    script that met it, half-recording a batch of other requests' outcomes:
//!    `a_foreign_key_of_the_wrong_type_breaks_no_batch`.
//! 4. Request ids no producer can make (too long, control characters) were handled:
//!    `bogus_request_ids_are_dead_lettered`.
//! 5. The janitor silently deleted malformed entries it took for expired ones instead
//!    of leaving them to be dead-lettered: `the_janitor_leaves_malformed_entries_alone`.

use crate::common::*;
use pelican::{Admin, Consumer, ConsumerConfig, Delivery, ErrorKind, QueueConfig, Submitted};
use pelican_testkit::{eventually, unique_name};
use serde_json::{json, Value as Json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type JsonConsumer = Consumer<Json, Json>;

fn in_a_minute() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_millis() + 60_000).to_string()
}

async fn xadd(url: &str, q: &QueueConfig, fields: &[(&str, &[u8])]) -> String {
    let mut c = raw_conn(url).await.unwrap();
    let mut cmd = redis::cmd("XADD");
    cmd.arg(q.keys().stream()).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(&mut c).await.unwrap()
}

/// Bug 1. Renewals every 5 ms race the writes of thousands of outcomes: a request whose
/// outcome was just recorded is no longer pending, and that is not a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lease_lost_for_answered_requests() {
    let _one_at_a_time = serial().await;
    let server = server();
    let q = queue_config(&server.url(), &unique_name("reg-lease"));
    let mut c = JsonConsumer::connect(
        q.clone(),
        ConsumerConfig::default()
            .with_claim_idle(Duration::from_secs(5))
            .with_lease_interval(Duration::from_millis(5))
            .with_prefetch(64),
    )
    .await
    .unwrap();
    let lost = Arc::new(AtomicU64::new(0));
    let answering = {
        let lost = lost.clone();
        tokio::spawn(async move {
            let mut running = tokio::task::JoinSet::new();
            while let Some(mut d) = c.next().await.unwrap() {
                let lost = lost.clone();
                running.spawn(async move {
                    let req = d.take_request();
                    let job = d.job().clone();
                    assert!(d.respond(&req).await.unwrap(), "outcome recorded");
                    if job.is_lease_lost() {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                });
                while running.try_join_next().is_some() {}
            }
        })
    };
    let p = producer(q.clone(), Duration::from_secs(30)).await;
    let r = drive(
        p.clone(),
        LoadSpec::new("reg-lease", 3_000, 200, Duration::from_secs(30)),
        Progress::default(),
    )
    .await;
    answering.abort();
    assert_eq!(r.ok, 3_000, "{}", r.one_line());
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "answered requests reported as lost leases"
    );
}

/// Holds whatever the consumer delivers within a short while: the poison request and the
/// innocent ones it shares the process with.
async fn gather(c: &mut JsonConsumer) -> Vec<Delivery<Json, Json>> {
    let mut got = Vec::new();
    if let Ok(Ok(Some(d))) = tokio::time::timeout(Duration::from_secs(3), c.next()).await {
        got.push(d);
        while let Ok(Ok(Some(d))) = tokio::time::timeout(Duration::from_millis(150), c.next()).await
        {
            got.push(d);
        }
    }
    got
}

/// Bug 2. A process that crashes on a poison request takes the requests it holds along,
/// and each crash counts one of their deliveries. Consumer generations here "crash" (hold
/// everything unanswered and vanish) whenever they hold the poison request, and answer
/// everything otherwise. With max_deliveries 3 the innocent ones used to be reclaimed
/// together with the poison each time and dead-lettered with it; their last delivery is
/// now made alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn innocent_requests_are_not_dead_lettered_with_poison() {
    let _one_at_a_time = serial().await;
    let server = server();
    let q = queue_config(&server.url(), &unique_name("reg-poison"));
    let cfg = crash_test_consumer(3, 8);
    let p = producer(q.clone(), Duration::from_secs(60)).await;
    let mut tickets = Vec::new();
    for i in 0..8 {
        let body = if i == 3 {
            json!({ "i": i, "poison": true })
        } else {
            json!({ "i": i })
        };
        tickets.push((i, p.submit(&body).await.unwrap()));
    }
    // Generations until one finds nothing left to take.
    let started = Instant::now();
    let mut crashes = 0;
    let mut answered = 0;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not done after 60 s"
        );
        let mut c = JsonConsumer::connect(q.clone(), cfg.clone()).await.unwrap();
        let mut took = 0;
        loop {
            let held = gather(&mut c).await;
            if held.is_empty() {
                break;
            }
            took += held.len();
            if held.iter().any(|d| d.request()["poison"] == json!(true)) {
                // the process dies with everything it holds
                std::mem::forget(held);
                crashes += 1;
                break;
            }
            for d in held {
                let req = d.request().clone();
                assert!(d.respond(&req).await.unwrap());
                answered += 1;
            }
        }
        drop(c);
        if took == 0 {
            break;
        }
    }
    assert_eq!(crashes, 3, "the poison request was delivered 3 times");
    for (i, t) in tickets {
        let r = tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("resolved");
        if i == 3 {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::Dead);
        } else {
            assert_eq!(
                r.unwrap(),
                json!({ "i": i }),
                "an innocent request was not answered"
            );
        }
    }
    assert_eq!(answered, 7);
    let dead = Admin::connect(q.clone())
        .await
        .unwrap()
        .dead_letters(10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "only the poison request is dead: {dead:?}");
}

/// Bug 2, second part. The first fix claimed a request for its last delivery and then
/// waited for the consumer's work in hand to finish before running it; a crash caused by
/// that work (a poison request in hand) used up the last delivery of the innocent one.
/// Now only a consumer with nothing in hand takes a last delivery: here X holds a poison
/// request when the innocent one's last delivery comes due, leaves it alone, and dies;
/// the next consumer answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_delivery_is_not_taken_with_work_in_hand() {
    let _one_at_a_time = serial().await;
    let server = server();
    let q = queue_config(&server.url(), &unique_name("reg-drain"));
    let cfg = crash_test_consumer(2, 4);
    let p = producer(q.clone(), Duration::from_secs(60)).await;
    // A takes the innocent request (and keeps its lease while it lives).
    let innocent = p.submit(&json!({ "i": 1 })).await.unwrap();
    // (prefetch 1: A reads nothing more)
    let mut a = JsonConsumer::connect(q.clone(), cfg.clone().with_prefetch(1))
        .await
        .unwrap();
    let held_by_a = tokio::time::timeout(Duration::from_secs(5), a.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // X takes a poison request and is still on it when A dies: the innocent request,
    // one delivery used and one left, comes due while X holds the poison one.
    let poison = p.submit(&json!({ "i": 2, "poison": true })).await.unwrap();
    let mut x = JsonConsumer::connect(q.clone(), cfg.clone()).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), x.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(d.request()["poison"], json!(true));
    let (entry, a_name) = (held_by_a.job().entry_id().to_string(), a.name().to_string());
    std::mem::forget(held_by_a);
    drop(a);
    // The innocent request comes due (claim_idle after A's last lease renewal) and stays
    // due through three of X's reclaim scans (every claim_idle / 2): X, with the poison
    // request in hand, must leave it where it is.
    let (url, stream) = (server.url(), q.keys().stream().to_string());
    eventually(
        Duration::from_secs(10),
        "the innocent request due for three reclaim scans",
        || async {
            let (owner, idle, _) = pending_entry(&url, &stream, &entry).await;
            idle >= 300 + 3 * 150 || owner != a_name
        },
    )
    .await;
    let (owner, _, deliveries) = pending_entry(&url, &stream, &entry).await;
    assert_eq!(
        owner, a_name,
        "a consumer with work in hand took a last delivery"
    );
    assert_eq!(deliveries, 1);
    // X dies of the poison request, with whatever it holds.
    std::mem::forget(d);
    drop(x);
    // Y answers everything it gets.
    let mut y = JsonConsumer::connect(q.clone(), cfg.clone()).await.unwrap();
    let stop = y.stopper();
    let serving = tokio::spawn(async move {
        while let Some(d) = y.next().await.unwrap() {
            let req = d.request().clone();
            let _ = d.respond(&req).await;
        }
    });
    let got = tokio::time::timeout(Duration::from_secs(10), innocent)
        .await
        .expect("the innocent request resolved");
    assert_eq!(
        got.unwrap(),
        json!({ "i": 1 }),
        "the innocent request lost its last delivery"
    );
    drop(poison);
    stop.stop();
    serving.abort();
}

/// Bug 3. A foreign client writes a hash where a request key lives: the consumer's
/// completion batch, a dead-lettering, and a producer's submission batch that meet it
/// must still record every other request's outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_of_the_wrong_type_breaks_no_batch() {
    let _one_at_a_time = serial().await;
    let server = server();
    let url = server.url();
    let q = queue_config(&url, &unique_name("reg-wrongtype"));
    let mut raw = raw_conn(&url).await.unwrap();
    for rid in ["foreign-ok", "foreign-bad", "mine"] {
        let () = redis::cmd("HSET")
            .arg(q.keys().req(rid))
            .arg("foreign")
            .arg("hash")
            .query_async(&mut raw)
            .await
            .map(|_: i64| ())
            .unwrap();
    }
    let dl = in_a_minute();
    let p = producer(q.clone(), Duration::from_secs(30)).await;
    for (rid, body) in [
        ("foreign-ok", &b"{\"i\":1}"[..]),
        ("foreign-bad", &b"nope"[..]),
    ] {
        xadd(
            &url,
            &q,
            &[
                ("rid", rid.as_bytes()),
                ("from", p.id().as_bytes()),
                ("index", b"1"),
                ("deadline", dl.as_bytes()),
                ("body", body),
            ],
        )
        .await;
    }
    // A submission batch that meets the foreign key: queued over it.
    let t = p.submit_with_id("mine", &json!({"i": 2})).await.unwrap();
    assert_eq!(t.submitted(), Submitted::Queued);
    let c = JsonConsumer::connect(q.clone(), ConsumerConfig::default().with_prefetch(64))
        .await
        .unwrap();
    let stop = c.stopper();
    let served = tokio::spawn(c.serve(64, |req: Json, _| async move { Ok(req) }));
    let r = drive(
        p.clone(),
        LoadSpec::new("reg-wrongtype", 500, 100, Duration::from_secs(30)),
        Progress::default(),
    )
    .await;
    assert_eq!(r.ok, 500, "{}", r.one_line());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap(),
        json!({"i": 2})
    );
    eventually(Duration::from_secs(10), "the stream drained", || async {
        let mut c = raw_conn(&url).await.unwrap();
        let n: u64 = redis::cmd("XLEN")
            .arg(q.keys().stream())
            .query_async(&mut c)
            .await
            .unwrap();
        n == 0
    })
    .await;
    stop.stop();
    served.await.unwrap().unwrap();
    p.shutdown().await.unwrap();
    let dead = Admin::connect(q.clone())
        .await
        .unwrap()
        .dead_letters(10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.contains("undecodable body"), "{dead:?}");
    // The foreign hashes were replaced by outcomes: nothing else is left.
    assert_only_outcomes_remain(&url, &q.name, true).await;
}

/// Bug 4. Request ids a producer cannot make are refused by the consumer, with the
/// reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_request_ids_are_dead_lettered() {
    let _one_at_a_time = serial().await;
    let server = server();
    let url = server.url();
    let q = queue_config(&url, &unique_name("reg-rid"));
    let dl = in_a_minute();
    let long = "x".repeat(257);
    for rid in [long.as_str(), "a\nb", "tab\there", "nul\0"] {
        xadd(
            &url,
            &q,
            &[
                ("rid", rid.as_bytes()),
                ("deadline", dl.as_bytes()),
                ("body", b"{}"),
            ],
        )
        .await;
    }
    let c = JsonConsumer::connect(q.clone(), ConsumerConfig::default())
        .await
        .unwrap();
    let stop = c.stopper();
    let runs = Arc::new(AtomicU64::new(0));
    let served = {
        let runs = runs.clone();
        tokio::spawn(c.serve(4, move |req: Json, _| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(req)
            }
        }))
    };
    let admin = Admin::connect(q.clone()).await.unwrap();
    eventually(Duration::from_secs(10), "four dead letters", || async {
        admin.dead_letters(10).await.unwrap().len() == 4
    })
    .await;
    for d in admin.dead_letters(10).await.unwrap() {
        assert!(d.reason.contains("invalid 'rid'"), "{d:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    stop.stop();
    served.await.unwrap().unwrap();
}

/// Bug 5. Undelivered entries whose deadline field is no number of milliseconds (or that
/// have no rid or body) are malformed, not expired: the janitor leaves them, and a
/// consumer dead-letters them with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_leaves_malformed_entries_alone() {
    let _one_at_a_time = serial().await;
    let server = server();
    let url = server.url();
    let q = queue_config(&url, &unique_name("reg-janitor"));
    let admin = Admin::connect(q.clone()).await.unwrap();
    // The group exists before the entries, as in a running queue.
    drop(
        JsonConsumer::connect(q.clone(), ConsumerConfig::default())
            .await
            .unwrap(),
    );
    let past = "1000";
    xadd(
        &url,
        &q,
        &[("rid", b"neg"), ("deadline", b"-5"), ("body", b"{}")],
    )
    .await;
    xadd(
        &url,
        &q,
        &[("rid", b"frac"), ("deadline", b"1.5"), ("body", b"{}")],
    )
    .await;
    xadd(&url, &q, &[("deadline", past.as_bytes()), ("body", b"{}")]).await;
    xadd(
        &url,
        &q,
        &[("rid", b"nobody"), ("deadline", past.as_bytes())],
    )
    .await;
    // A well-formed expired entry is still expired by the janitor.
    xadd(
        &url,
        &q,
        &[
            ("rid", b"old"),
            ("deadline", past.as_bytes()),
            ("body", b"{}"),
        ],
    )
    .await;
    let report = admin.janitor().await.unwrap();
    assert!(report.ran);
    assert_eq!(report.expired, 1, "{report:?}");
    let c = JsonConsumer::connect(q.clone(), ConsumerConfig::default())
        .await
        .unwrap();
    let stop = c.stopper();
    let served = tokio::spawn(c.serve(4, |req: Json, _| async move { Ok(req) }));
    eventually(Duration::from_secs(10), "four dead letters", || async {
        admin.dead_letters(10).await.unwrap().len() == 4
    })
    .await;
    stop.stop();
    served.await.unwrap().unwrap();
}

/// Owner, idle ms and delivery count of one pending entry of the group.
async fn pending_entry(url: &str, stream: &str, id: &str) -> (String, u64, u64) {
    let mut c = raw_conn(url).await.unwrap();
    let v: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg("pelican")
        .arg(id)
        .arg(id)
        .arg(1)
        .query_async(&mut c)
        .await
        .unwrap();
    let (_, owner, idle, deliveries) = v.into_iter().next().expect("the entry is pending");
    (owner, idle, deliveries)
}

/// The consumers of the poison scenarios: claim_idle 300 ms (reclaim scans every
/// 150 ms), short blocks.
fn crash_test_consumer(max_deliveries: u32, prefetch: usize) -> ConsumerConfig {
    ConsumerConfig::default()
        .with_claim_idle(Duration::from_millis(300))
        .with_block(Duration::from_millis(100))
        .with_max_deliveries(max_deliveries)
        .with_prefetch(prefetch)
}
