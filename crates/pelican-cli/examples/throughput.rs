//! A quick throughput probe: `throughput worker URL QUEUE` in one process,
//! `throughput producer URL QUEUE N INFLIGHT [nodedup]` in another.
//! (`pelican bench` is the real benchmark; this is for profiling the library alone.)
//! A development probe that lives with the benchmark; build it with
//! `cargo build --release -p pelican-cli --example throughput` (BENCHMARKS.md).

use pelican::{Consumer, ConsumerConfig, Producer, ProducerConfig, QueueConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize, Deserialize)]
struct Req {
    i: u64,
    data: String,
}

#[derive(Serialize, Deserialize)]
struct Resp {
    i: u64,
    ok: bool,
}

thread_local! {
    static LAT: std::cell::RefCell<Vec<(u128, u128)>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> pelican::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let q = QueueConfig::new(args[2].clone(), args[3].clone());
    match args[1].as_str() {
        "worker" => {
            let c = Consumer::<Req, Resp>::connect(
                q,
                ConsumerConfig::default().with_prefetch(
                    std::env::var("PREFETCH")
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(64),
                ),
            )
            .await?;
            c.serve(64, |r: Req, _| async move { Ok(Resp { i: r.i, ok: true }) })
                .await
        }
        "acks" => {
            let p = Producer::<Req, Resp>::connect(q, ProducerConfig::default()).await?;
            let mut v = Vec::new();
            let mut keep = Vec::new();
            for i in 0..2000u64 {
                let t0 = Instant::now();
                let t = p
                    .submit(&Req {
                        i,
                        data: String::new(),
                    })
                    .await?;
                v.push(t0.elapsed().as_micros());
                keep.push(t);
            }
            v.sort();
            println!("ack p50 {}us p99 {}us", v[1000], v[1980]);
            Ok(())
        }
        _ => {
            let n: u64 = args[4].parse().unwrap();
            let inflight: u64 = args[5].parse().unwrap();
            let dedup = args.get(6).map(|s| s != "nodedup").unwrap_or(true);
            let p = Producer::<Req, Resp>::connect(q, ProducerConfig::default().with_dedup(dedup))
                .await?;
            let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
            // a fresh salt per run: no request is answered from an earlier run's cache
            let salt = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let t0 = Instant::now();
            let mut lanes = Vec::new();
            for _ in 0..inflight {
                let p = p.clone();
                let next = next.clone();
                lanes.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        let t0 = Instant::now();
                        let data = format!("{salt}{}", "x".repeat(64));
                        let t = p.submit(&Req { i, data }).await.expect("submit");
                        let t1 = t0.elapsed();
                        let r = t.await.expect("call");
                        if inflight == 1 {
                            LAT.with(|l| {
                                l.borrow_mut()
                                    .push((t1.as_micros(), t0.elapsed().as_micros()))
                            });
                        }
                        assert!(r.ok && r.i == i);
                    }
                }));
            }
            for l in lanes {
                l.await.unwrap();
            }
            let secs = t0.elapsed().as_secs_f64();
            LAT.with(|l| {
                let mut v = l.borrow_mut();
                if !v.is_empty() {
                    let mut acks: Vec<u128> = v.iter().map(|x| x.0).collect();
                    v.sort_by_key(|x| x.1);
                    acks.sort();
                    let n = v.len();
                    println!(
                        "seq p50 {}us p90 {}us p99 {}us; ack p50 {}us",
                        v[n / 2].1,
                        v[n * 9 / 10].1,
                        v[n * 99 / 100].1,
                        acks[n / 2]
                    );
                }
            });
            println!("{n} requests in {secs:.3}s = {:.0} req/s", n as f64 / secs);
            Ok(())
        }
    }
}
