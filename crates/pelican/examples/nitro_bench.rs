//! Throughput and latency of the Nitro wire format, with where the time goes.
//!
//! `cargo build --release -p pelican-cli && cargo run --release -p pelican --features nitro --example nitro_bench`
//!
//! Starts its own redis-server (pelican-testkit) and runs four pairings on fresh streams:
//! a producer (pelican's `nitro::Producer`, or a Nitro-style producer written from the
//! spec's traces) against workers (`pelican nitro worker` processes, or Nitro-style
//! consumers in a child process: `XPENDING` + `XREADGROUP COUNT 1` per message, a
//! heartbeat thread per message, `SET NX` + `XACK` + `XDEL`). Payload `{"i":N,"data":"<64
//! x>"}`, echoed. Throughput: a closed loop of `--inflight` requests; latency: one at a
//! time. Per request: Redis commands (INFO commandstats, scripts' commands included),
//! Redis CPU, and the CPU of the producer and the worker processes.
//!
//! Environment: PELICAN_BIN (default target/release/pelican), N (requests, 5000),
//! INFLIGHT (100), LAT (latency requests, 300), NITRO_THREADS (consumer threads, 8).

use pelican::nitro::{Producer, ProducerConfig, StreamConfig};
use pelican_testkit::nitro::{Answer, NitroConsumer, NitroProducer};
use pelican_testkit::RedisServer;
use serde_json::Value;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn body(i: usize) -> String {
    format!(r#"{{"i":{i},"data":"{}"}}"#, "x".repeat(64))
}

/// utime + stime of a process, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Redis' view: commands by name, and its CPU seconds.
fn redis_counters(server: &RedisServer) -> (HashMap<String, u64>, f64) {
    let mut c = server.sync_connection();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    let mut calls = HashMap::new();
    for line in stats.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, kv) = rest.split_once(':').unwrap();
            let n = kv
                .split(',')
                .find_map(|p| p.strip_prefix("calls="))
                .unwrap()
                .parse()
                .unwrap();
            calls.insert(name.to_string(), n);
        }
    }
    let cpu: String = redis::cmd("INFO").arg("cpu").query(&mut c).unwrap();
    let secs: f64 = cpu
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .map(|l| l.split_once(':').unwrap().1.trim().parse::<f64>().unwrap())
        .sum();
    (calls, secs)
}

struct Phase {
    requests: usize,
    secs: f64,
    cmds: HashMap<String, u64>,
    redis_cpu: f64,
    producer_cpu: f64,
    worker_cpu: f64,
}

struct Outcome {
    name: &'static str,
    tp: Phase,
    lat: Vec<f64>,
}

/// The workers of a pairing: processes whose CPU is counted.
struct Workers(Vec<Child>);

impl Workers {
    fn cpu(&self) -> f64 {
        self.0.iter().map(|c| cpu_secs(c.id())).sum()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn pelican_workers(bin: &str, url: &str, stream: &str) -> Workers {
    let child = Command::new(bin)
        .args(["--redis", url, "nitro", "worker", "--stream", stream])
        .args(["--concurrency", "64", "--prefetch", "128"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pelican nitro worker (set PELICAN_BIN)");
    Workers(vec![child])
}

fn nitro_workers(url: &str, stream: &str) -> Workers {
    let me = std::env::current_exe().unwrap();
    let child = Command::new(me)
        .args(["nitro-consumers", url, stream])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Workers(vec![child])
}

/// The child: Nitro-style consumers, one per thread, as valnode's workers.
fn run_nitro_consumers(url: &str, stream: &str) {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..env_n("NITRO_THREADS", 8))
        .map(|_| {
            let (url, stream, stop) = (url.to_string(), stream.to_string(), stop.clone());
            std::thread::spawn(move || {
                let mut c = NitroConsumer::new(&url, &stream, Duration::from_secs(300));
                c.serve(&stop, |msg| Ok(msg.to_string()));
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Waits until the workers answer (they registered and read).
fn warm_up_pelican(rt: &tokio::runtime::Runtime, p: &Producer<Value, Value>, n: usize) {
    rt.block_on(async {
        for i in 0..n {
            let v: Value = serde_json::from_str(&body(i)).unwrap();
            let r = tokio::time::timeout(Duration::from_secs(30), p.call(&v)).await;
            assert!(matches!(r, Ok(Ok(_))), "warm-up: {r:?}");
        }
    });
}

fn measure<F: FnOnce()>(server: &RedisServer, workers: &Workers, requests: usize, f: F) -> Phase {
    let me = std::process::id();
    let (c0, r0) = redis_counters(server);
    let (p0, w0) = (cpu_secs(me), workers.cpu());
    let t0 = Instant::now();
    f();
    let secs = t0.elapsed().as_secs_f64();
    let (c1, r1) = redis_counters(server);
    let mut cmds = HashMap::new();
    for (k, v) in c1 {
        let d = v - c0.get(&k).copied().unwrap_or(0);
        if d > 0 && k != "info" {
            cmds.insert(k, d);
        }
    }
    Phase {
        requests,
        secs,
        cmds,
        redis_cpu: r1 - r0,
        producer_cpu: cpu_secs(me) - p0,
        worker_cpu: workers.cpu() - w0,
    }
}

/// pelican's producer: a closed loop of `inflight`, then one at a time.
fn with_pelican_producer(
    name: &'static str,
    server: &RedisServer,
    stream: &str,
    workers: Workers,
    poll: Duration,
) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = ProducerConfig::default()
        .with_request_timeout(Duration::from_secs(120))
        .with_poll_interval(poll);
    let p = rt
        .block_on(Producer::<Value, Value>::connect(
            StreamConfig::new(server.url(), stream),
            cfg,
        ))
        .unwrap();
    warm_up_pelican(&rt, &p, 200);
    let (n, inflight) = (env_n("N", 5000), env_n("INFLIGHT", 100));
    let tp = measure(server, &workers, n, || {
        rt.block_on(async {
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let lanes: Vec<_> = (0..inflight)
                .map(|_| {
                    let (p, next) = (p.clone(), next.clone());
                    async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                return;
                            }
                            let v: Value = serde_json::from_str(&body(i)).unwrap();
                            let r = p.call(&v).await.unwrap();
                            assert_eq!(r["i"], i);
                        }
                    }
                })
                .collect();
            futures_util::future::join_all(lanes).await;
        })
    });
    let mut lat = Vec::new();
    rt.block_on(async {
        for i in 0..env_n("LAT", 300) {
            let v: Value = serde_json::from_str(&body(i)).unwrap();
            let t = Instant::now();
            p.call(&v).await.unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    });
    drop(workers);
    Outcome { name, tp, lat }
}

/// A Nitro-style producer: XADD one at a time; every `interval`, GET error key, GET
/// result key per outstanding request, one round trip each, DEL what was found.
fn with_nitro_producer(
    name: &'static str,
    server: &RedisServer,
    stream: &str,
    workers: Workers,
    interval: Duration,
) -> Outcome {
    let mut p = NitroProducer::new(&server.url(), stream);
    for i in 0..50 {
        let id = p.produce(&body(i));
        p.await_answer(&id, Duration::from_secs(30));
    }
    let (n, inflight) = (env_n("N", 5000) / 2, env_n("INFLIGHT", 100));
    let tp = measure(server, &workers, n, || {
        let mut out: Vec<(String, usize)> = Vec::new();
        let (mut sent, mut done) = (0, 0);
        while done < n {
            while out.len() < inflight && sent < n {
                out.push((p.produce(&body(sent)), sent));
                sent += 1;
            }
            std::thread::sleep(interval);
            out.retain(|(id, i)| match p.check(id) {
                Some(Answer::Result(j)) => {
                    assert!(j.contains(&format!(r#""i":{i},"#)));
                    done += 1;
                    false
                }
                Some(a) => panic!("{a:?}"),
                None => true,
            });
        }
    });
    let mut lat = Vec::new();
    for i in 0..env_n("LAT", 300) {
        let t = Instant::now();
        let id = p.produce(&body(i));
        loop {
            std::thread::sleep(interval);
            if p.check(&id).is_some() {
                break;
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    drop(workers);
    Outcome { name, tp, lat }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn report(mut o: Outcome) {
    let t = &o.tp;
    let n = t.requests as f64;
    let total: u64 = t.cmds.values().sum();
    let mut top: Vec<(&String, &u64)> = t.cmds.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = top
        .iter()
        .take(6)
        .map(|(k, v)| format!("{k} {:.2}", **v as f64 / n))
        .collect();
    println!(
        "{:<44} {:>8.0} req/s  lat p50 {:>6.2} ms p99 {:>6.2} ms | cmds/req {:>5.2} ({}) | µs/req: redis {:>5.1} producer {:>5.1} workers {:>5.1}",
        o.name,
        n / t.secs,
        pct(&mut o.lat, 0.5),
        pct(&mut o.lat, 0.99),
        total as f64 / n,
        top.join(", "),
        t.redis_cpu / n * 1e6,
        t.producer_cpu / n * 1e6,
        t.worker_cpu / n * 1e6,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("nitro-consumers") {
        return run_nitro_consumers(&args[2], &args[3]);
    }
    let bin = std::env::var("PELICAN_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/pelican").to_string()
    });
    let server = RedisServer::start();
    let url = server.url();
    println!(
        "N={} INFLIGHT={} LAT={} NITRO_THREADS={} (one redis-server, loopback)",
        env_n("N", 5000),
        env_n("INFLIGHT", 100),
        env_n("LAT", 300),
        env_n("NITRO_THREADS", 8)
    );
    let poll = Duration::from_millis(10);
    let s = "bench-a";
    report(with_pelican_producer(
        "pelican producer -> pelican nitro worker",
        &server,
        s,
        pelican_workers(&bin, &url, s),
        poll,
    ));
    let s = "bench-a1";
    report(with_pelican_producer(
        "  same, poll every 1 ms",
        &server,
        s,
        pelican_workers(&bin, &url, s),
        Duration::from_millis(1),
    ));
    let s = "bench-b";
    report(with_nitro_producer(
        "Nitro-style producer (5 ms) -> pelican worker",
        &server,
        s,
        pelican_workers(&bin, &url, s),
        Duration::from_millis(5),
    ));
    let s = "bench-c";
    report(with_pelican_producer(
        "pelican producer -> Nitro-style consumers",
        &server,
        s,
        nitro_workers(&url, s),
        poll,
    ));
    let s = "bench-d";
    report(with_nitro_producer(
        "Nitro-style producer (5 ms) -> Nitro-style",
        &server,
        s,
        nitro_workers(&url, s),
        Duration::from_millis(5),
    ));
}
