//! The seed system's scenario matrix, written once and run in several modes: 10
//! consumers, 1 or 2 producers, some consumers killed mid-request, some that never
//! reclaim, every 50th request failed by its handler, dedup on and off.
//!
//! Every request must get its own right outcome; no request id is handled twice
//! unless a consumer died holding it (failures are cached for these runs, as results
//! are); afterwards nothing is left in Redis but cached
//! outcomes.

use crate::common::*;
use pelican::{Admin, Consumer, Delivery, ErrorKind, Producer};
use pelican_testkit::{eventually, RedisCluster, RedisServer};
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinSet;

#[derive(Debug, Clone, Copy)]
struct Scenario {
    producers: usize,
    /// Requests per producer.
    requests: u64,
    /// Consumers in all, killers included.
    consumers: usize,
    /// Consumers that answer one request, then die holding the next one.
    killed: usize,
    /// Consumers (besides the killers) that never reclaim others' work.
    non_reclaiming: usize,
    dedup: bool,
    /// Every producer submits the same requests (dedup across producers when on).
    overlap: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            producers: 1,
            requests: 100,
            consumers: 10,
            killed: 0,
            non_reclaiming: 0,
            dedup: true,
            overlap: false,
        }
    }
}

/// Deliveries a consumer holds at once. The live consumers' share (7 x 8) is less
/// than the smallest run's 100 requests, so killers always get work to die on.
const PREFETCH: usize = 8;

fn fails(r: &Req) -> bool {
    r.i % 50 == 49
}

fn fail_message(r: &Req) -> String {
    format!("request {}/{} failed on purpose", r.tag, r.i)
}

/// Answers a delivery the way every consumer of the matrix does; asserts the outcome
/// was recorded (no other consumer had answered it).
async fn answer(d: Delivery<Req, Resp>, by: &str) {
    let r = d.request().clone();
    let rid = d.job().request_id().to_string();
    let recorded = if fails(&r) {
        d.fail(fail_message(&r)).await
    } else {
        d.respond(&echo(&r, by)).await
    };
    assert!(
        recorded.expect("outcome written"),
        "the outcome of {rid} was dropped: another consumer had answered it"
    );
}

/// Where the scenario runs: one node, or a 3-master cluster; with how many partitions.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Node { partitions: u32 },
    Cluster { partitions: u32 },
}

async fn run(s: Scenario) {
    run_in(s, Mode::Node { partitions: 1 }).await
}

async fn run_in(s: Scenario, mode: Mode) {
    assert!(
        s.killed + s.non_reclaiming < s.consumers,
        "someone must reclaim"
    );
    let (target, partitions) = match mode {
        Mode::Node { partitions } => (Target::Node(RedisServer::start()), partitions),
        Mode::Cluster { partitions } => (Target::Cluster(RedisCluster::start(3)), partitions),
    };
    // Failures answer later copies too (the default failure_ttl of 0 runs a copy that
    // arrives after its failure again, by design): with overlapping producers, the second
    // copy of a failing request may be submitted after the first copy failed.
    let q = target.queue("matrix", partitions);
    let ttl = q.result_ttl;
    let q = q.with_failure_ttl(ttl);
    let probe = Probe::on(&target, &q).await;
    let cfg = fast_consumer()
        .with_claim_idle(Duration::from_millis(800))
        .with_prefetch(PREFETCH);
    let runs = Runs::default();
    let died = Runs::default();
    let gate = Gate::default();

    // Killers first, so they are reading before the others hold their share.
    let mut killers = JoinSet::new();
    for k in 0..s.killed {
        let name = format!("killer-{k}");
        let mut c = Consumer::<Req, Resp>::connect(q.clone(), cfg.clone().with_name(&name))
            .await
            .unwrap();
        let (runs, died) = (runs.clone(), died.clone());
        killers.spawn(async move {
            let mut answered = 0;
            while let Some(d) = c.next().await.unwrap() {
                let rid = d.job().request_id().to_string();
                runs.hit(&rid);
                if answered == 1 {
                    died.hit(&rid);
                    die(c, d);
                    return;
                }
                answer(d, &name).await;
                answered += 1;
            }
        });
    }
    // The live consumers' handlers wait until every killer has died, so the killers
    // are sure to get work while the others hold theirs.
    let mut workers = Vec::new();
    for k in 0..s.consumers - s.killed {
        let name = format!("worker-{k}");
        let reclaim = k >= s.non_reclaiming;
        let (runs, gate, by) = (runs.clone(), gate.clone(), name.clone());
        let w = Worker::spawn(
            &q,
            cfg.clone().with_name(&name).with_reclaim(reclaim),
            4,
            move |r: Req, job| {
                let (runs, gate, by) = (runs.clone(), gate.clone(), by.clone());
                async move {
                    gate.wait().await;
                    runs.hit(job.request_id());
                    // a little work, so handlers overlap
                    tokio::time::sleep(Duration::from_millis(r.i % 4)).await;
                    if fails(&r) {
                        Err(pelican::HandlerError::fail(fail_message(&r)))
                    } else {
                        Ok(echo(&r, &by))
                    }
                }
            },
        )
        .await;
        workers.push(w);
    }

    let mut producers = Vec::new();
    for _ in 0..s.producers {
        let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_dedup(s.dedup))
            .await
            .unwrap();
        producers.push(p);
    }
    let added_before = probe.entries_added().await;
    let mut calls = JoinSet::new();
    for (pi, p) in producers.iter().enumerate() {
        for i in 0..s.requests {
            let tag = if s.overlap {
                "shared".to_string()
            } else {
                format!("p{pi}")
            };
            let p = p.clone();
            calls.spawn(async move {
                let req = Req::new(i, &tag);
                let out = p.call(&req).await;
                (pi, req, out)
            });
        }
    }

    let killed = s.killed as u32;
    eventually(Duration::from_secs(10), "every killer has died", || {
        let died = died.clone();
        async move { died.total() == killed }
    })
    .await;
    gate.open();

    let mut answers: HashMap<(String, u64), Vec<String>> = HashMap::new();
    let all = within(Duration::from_secs(30), "every call resolving", async {
        let mut v = Vec::new();
        while let Some(r) = calls.join_next().await {
            v.push(r.expect("call task"));
        }
        v
    })
    .await;
    assert_eq!(all.len(), s.producers * s.requests as usize);
    for (pi, req, out) in all {
        if fails(&req) {
            let e = out.expect_err("every 50th request fails");
            assert_eq!(e.kind(), ErrorKind::Remote, "producer {pi}, {req:?}: {e}");
            assert_eq!(e.message(), fail_message(&req));
        } else {
            let resp = out.unwrap_or_else(|e| panic!("producer {pi}, {req:?}: {e}"));
            assert_eq!(
                resp.i, req.i,
                "producer {pi} got another request's response"
            );
            answers
                .entry((req.tag.clone(), req.i))
                .or_default()
                .push(resp.by);
        }
    }
    if s.overlap && s.dedup {
        for (req, by) in &answers {
            assert!(
                by.windows(2).all(|w| w[0] == w[1]),
                "{req:?} was answered differently: {by:?}"
            );
        }
    }

    // One handler run per request id, plus one per consumer that died holding it.
    let distinct = if s.overlap && s.dedup {
        s.requests as usize
    } else {
        s.producers * s.requests as usize
    };
    let runs = runs.snapshot();
    let died = died.snapshot();
    assert_eq!(runs.len(), distinct, "request ids handled");
    for (rid, n) in &runs {
        let deaths = died.get(rid).copied().unwrap_or(0);
        assert_eq!(
            *n,
            1 + deaths,
            "{rid} was handled {n} times; consumers died holding it {deaths} times"
        );
    }
    let added = probe.entries_added().await - added_before;
    assert_eq!(added, distinct as u64, "stream entries added");

    // all at once: each shutdown waits for its blocking read to end
    for w in &workers {
        w.stopper().stop();
    }
    for w in workers {
        w.stop().await;
    }
    while let Some(k) = killers.join_next().await {
        k.expect("killer task");
    }
    let admin = Admin::connect(q.clone()).await.unwrap();
    assert!(admin.dead_letters(10).await.unwrap().is_empty());
    eventually(
        Duration::from_secs(5),
        "the janitor has run and the stream is empty",
        || {
            let (admin, probe) = (&admin, &probe);
            async move { admin.janitor().await.unwrap().ran && probe.xlen().await == 0 }
        },
    )
    .await;
    assert_eq!(probe.pending().await, 0, "entries still pending");
    let ids: Vec<String> = producers.iter().map(|p| p.id().to_string()).collect();
    let live: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(probe.leftovers(&live).await, Vec::<String>::new());
    for p in producers {
        p.shutdown().await.unwrap();
    }
    assert_eq!(
        probe.leftovers(&[]).await,
        Vec::<String>::new(),
        "reply streams must go with their producers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_producer() {
    run(Scenario::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_producer_without_dedup() {
    run(Scenario {
        dedup: false,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_producer_killed_consumers() {
    run(Scenario {
        killed: 3,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_producer_killed_and_non_reclaiming_consumers() {
    run(Scenario {
        killed: 3,
        non_reclaiming: 4,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_killed_consumers() {
    run(Scenario {
        producers: 2,
        requests: 200,
        killed: 3,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_killed_and_non_reclaiming_consumers() {
    run(Scenario {
        producers: 2,
        requests: 200,
        killed: 3,
        non_reclaiming: 4,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_killed_and_non_reclaiming_consumers_without_dedup() {
    run(Scenario {
        producers: 2,
        requests: 200,
        killed: 3,
        non_reclaiming: 4,
        dedup: false,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_same_requests_killed_consumers() {
    run(Scenario {
        producers: 2,
        requests: 100,
        killed: 3,
        non_reclaiming: 2,
        overlap: true,
        ..Scenario::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_same_requests_without_dedup() {
    run(Scenario {
        producers: 2,
        requests: 100,
        killed: 3,
        overlap: true,
        dedup: false,
        ..Scenario::default()
    })
    .await;
}

// The same scenario over partitions: on one node (P > 1 costs nothing in correctness),
// and spread over a 3-master Redis Cluster (P = 6: two partitions per master on average).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_on_one_node_killed_and_non_reclaiming_consumers() {
    run_in(
        Scenario {
            killed: 2,
            non_reclaiming: 3,
            ..Scenario::default()
        },
        Mode::Node { partitions: 4 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_killed_and_non_reclaiming_consumers() {
    run_in(
        Scenario {
            killed: 2,
            non_reclaiming: 3,
            ..Scenario::default()
        },
        Mode::Cluster { partitions: 6 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_two_producers_same_requests_killed_consumers() {
    run_in(
        Scenario {
            producers: 2,
            requests: 200,
            killed: 2,
            overlap: true,
            ..Scenario::default()
        },
        Mode::Cluster { partitions: 6 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_two_producers_without_dedup() {
    run_in(
        Scenario {
            producers: 2,
            requests: 200,
            killed: 2,
            non_reclaiming: 3,
            dedup: false,
            ..Scenario::default()
        },
        Mode::Cluster { partitions: 6 },
    )
    .await;
}
