//! Fault 8, memory. Every scenario ends with the short check (`assert_only_outcomes_remain`:
//! nothing of a queue remains but cached outcomes with a TTL, the empty stream, the
//! janitor's lock and expected dead letters). This test runs the queue steadily and
//! samples, after every slice of requests: Redis `used_memory`, the cached outcomes,
//! the request stream's own memory (`MEMORY USAGE`), the group's consumers, and the
//! RSS of this process (the producer) and of every worker process.
//!
//! Outcomes are kept for `result_ttl` (5 minutes, the workers' default), so Redis holds
//! the last 5 minutes' outcomes by design; what must stay flat is everything else: the
//! stream, the consumers, the memory per cached outcome, and the processes' RSS. The
//! long variant (`PELICAN_SOAK=1`, 1,000,000 requests) then waits for the outcomes to
//! expire and checks that `used_memory` is back where it started.

use crate::common::*;
use pelican_testkit::{eventually, unique_name};
use serde_json::json;
use std::time::{Duration, Instant};

/// One sample.
#[derive(Debug, Clone)]
struct Sample {
    requests: u64,
    used_memory: u64,
    outcomes: u64,
    stream_bytes: u64,
    consumers: u64,
    producer_rss_kib: u64,
    workers_rss_kib: Vec<u64>,
}

impl Sample {
    fn json(&self) -> serde_json::Value {
        json!({
            "requests": self.requests,
            "used_memory": self.used_memory,
            "cached_outcomes": self.outcomes,
            "stream_bytes": self.stream_bytes,
            "consumers": self.consumers,
            "producer_rss_kib": self.producer_rss_kib,
            "workers_rss_kib": self.workers_rss_kib,
        })
    }
}

async fn sample(url: &str, queue: &str, requests: u64, fleet: &Fleet) -> Sample {
    let mut c = raw_conn(url).await.expect("raw connection");
    let names = keys(queue);
    let stream = names.stream();
    let used_memory = info_number(&mut c, "memory", "used_memory").await;
    // One queue per server: every key but the stream, the janitor lock and the dead
    // letters is a cached outcome (the producer's reply stream is one more).
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
    let stream_bytes = stream_bytes(&mut c, queue).await;
    let consumers: redis::Value = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(names.group())
        .query_async(&mut c)
        .await
        .unwrap();
    let consumers = match consumers {
        redis::Value::Array(a) => a.len() as u64,
        _ => 0,
    };
    Sample {
        requests,
        used_memory,
        outcomes: dbsize.saturating_sub(3),
        stream_bytes,
        consumers,
        producer_rss_kib: rss_kib(std::process::id()),
        workers_rss_kib: fleet.rss_kib(),
    }
}

/// The request stream's memory once its deleted entries are trimmed: an empty stream
/// with its consumer group.
const TRIMMED_STREAM_BYTES: u64 = 4096;

async fn stream_bytes(c: &mut redis::aio::MultiplexedConnection, queue: &str) -> u64 {
    let v: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(keys(queue).stream())
        .arg("SAMPLES")
        .arg(0)
        .query_async(c)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// `later` is at most 10 % (plus `slack`) above `base`.
fn flat(what: &str, base: u64, later: u64, slack: u64, samples: &[Sample]) {
    assert!(
        later <= base + base / 10 + slack,
        "{what} grew from {base} to {later}: {:#?}",
        samples
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_under_steady_load() {
    let _one_at_a_time = serial().await;
    let long = soak();
    let (n, slices) = if long { (1_000_000, 20) } else { (12_000, 6) };
    let server = server();
    let url = server.url();
    let queue = unique_name("memory");
    let spec = WorkerSpec::new(&url, &queue)
        .handler("sleep:1")
        .concurrency(128)
        .without_per_rid_log();
    let mut fleet = Fleet::start(spec, 4).await;
    let timeout = Duration::from_secs(120);
    let p = producer(queue_config(&url, &queue), timeout).await;
    let mut raw = raw_conn(&url).await.unwrap();
    let baseline = info_number(&mut raw, "memory", "used_memory").await;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut total = LoadReport::default();
    let per_slice = n / slices;
    for s in 0..slices {
        let r = drive(
            p.clone(),
            LoadSpec::new(&format!("memory-{s}"), per_slice, 500, timeout),
            Progress::default(),
        )
        .await;
        total.requests += r.requests;
        total.ok += r.ok;
        total.hung += r.hung;
        total.wrong += r.wrong + r.resolved_twice;
        for (k, v) in r.errors {
            *total.errors.entry(k).or_default() += v;
        }
        // The janitor (every second) trims what the slice deleted from the stream.
        eventually(
            Duration::from_secs(15),
            "the janitor trimming the request stream",
            || async {
                let mut c = raw_conn(&url).await.unwrap();
                stream_bytes(&mut c, &queue).await <= TRIMMED_STREAM_BYTES
            },
        )
        .await;
        let x = sample(&url, &queue, per_slice * (s + 1), &fleet).await;
        eprintln!("memory: {}", x.json());
        samples.push(x);
    }
    let duration = started.elapsed();
    let after_expiry = if long {
        // The outcomes expire (result_ttl, 5 minutes): used_memory must come back.
        let deadline = Instant::now() + Duration::from_secs(400);
        loop {
            let x = sample(&url, &queue, n, &fleet).await;
            if x.outcomes == 0 || Instant::now() > deadline {
                eprintln!("memory: after expiry {}", x.json());
                break Some(x);
            }
            // waiting out result_ttl, polled
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    } else {
        None
    };
    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let left = assert_only_outcomes_remain(&url, &queue, false).await;

    let last = samples.last().unwrap();
    let per_outcome = |x: &Sample| (x.used_memory.saturating_sub(baseline)) / x.outcomes.max(1);
    let mut s = Summary::new(
        "memory under steady load (Redis used_memory, process RSS)",
        "4 workers x 128, handler sleep:1, 500 in flight",
    );
    s.duration = duration;
    s.requests = total.requests;
    s.lost = total.lost();
    s.hung = total.hung;
    s.duplicates = total.wrong;
    s.reruns = fleet.log.lock().unwrap().redelivered;
    s.set("baseline_used_memory", baseline)
        .set(
            "samples",
            samples.iter().map(Sample::json).collect::<Vec<_>>(),
        )
        .set("bytes_per_cached_outcome", per_outcome(last))
        .set("cached_outcomes_left", left.outcomes);
    if let Some(x) = &after_expiry {
        s.set("after_expiry", x.json());
    }
    s.emit();

    assert_eq!(total.ok, total.requests, "{}", total.one_line());
    assert_eq!(total.hung + total.wrong + total.lost(), 0);
    // The stream is drained and trimmed after every slice (awaited above).
    // No consumer is left behind: the four workers, always.
    assert!(samples.iter().all(|x| x.consumers == 4), "{samples:#?}");
    // Redis memory beyond the baseline is the cached outcomes and nothing else: the
    // memory per cached outcome does not grow.
    flat(
        "Redis memory per cached outcome",
        per_outcome(&samples[1]),
        per_outcome(last),
        16,
        &samples,
    );
    // The processes' RSS, after the first slice warmed them up.
    flat(
        "the producer's RSS (KiB)",
        samples[1].producer_rss_kib,
        last.producer_rss_kib,
        16 * 1024,
        &samples,
    );
    for (w, rss) in last.workers_rss_kib.iter().enumerate() {
        flat(
            &format!("worker {w}'s RSS (KiB)"),
            samples[1].workers_rss_kib[w],
            *rss,
            8 * 1024,
            &samples,
        );
    }
    if let Some(x) = after_expiry {
        assert_eq!(x.outcomes, 0, "outcomes did not expire: {}", x.json());
        flat(
            "used_memory after expiry",
            baseline,
            x.used_memory,
            1 << 20,
            &samples,
        );
    }
}
