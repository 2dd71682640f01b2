//! `pelican bench`: the peer benchmark's workload (`../shared/peers/bullmq`) against
//! pelican, so the two can be compared line for line.
//!
//! One producer (this process) and `--workers` worker processes (children of this
//! binary, `pelican bench --serve-worker`) on a fresh queue. Payload `{"i": N, "data":
//! "<64 x>"}`, answer `{"i": N, "ok": true}`, every answer checked. Phases: warm-up
//! (1,000 requests, at most 100 in flight, not measured), throughput (20,000 requests,
//! a closed loop of 1,000 lanes: submit, await, next), latency (2,000 requests one at a
//! time). `throughput_rps` = requests / (first submission -> last answer); latencies
//! are submit -> answer, nearest-rank percentiles. Redis commands per request come
//! from INFO commandstats over the throughput phase (it counts the commands scripts
//! run); CPU and memory from /proc. At the end the workers are stopped by pid and every
//! key of the queue is deleted, and the run fails if any is left.
//!
//! With `--via-gateway` the requests go through a `pelican gateway` child process over
//! HTTP instead (`gateway`: the client), to measure what HTTP adds to the library.
//!
//! Layout: `load` (the workload and the closed loop), `workers` (the child processes),
//! `serve` (what a child runs), `server` (INFO, SCAN, the loopback rule), `sys` (/proc),
//! `histogram` (latencies in constant memory), `report` (JSON line and table).

mod gateway;
mod histogram;
mod load;
mod report;
mod serve;
mod server;
mod sys;
mod workers;

use crate::cli::BenchCodec;
use crate::cli::{BenchArgs, Global};
use crate::exit::{CliError, CliResult};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use load::{BenchProducer, Load, Phase};
pub use load::{BenchRequest, BenchResponse};
use pelican::{Admin, Producer, ProducerConfig, QueueConfig};
use report::Report;
use server::{ServerCounters, ServerDelta};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use sys::{CpuWindow, Watched};
use workers::Workers;

/// Most requests in flight during the warm-up (as in the peer benchmark).
const WARMUP_INFLIGHT: u64 = 100;
/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on each clean-up step (producer shutdown, deleting the keys).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the benchmark (or, with `--serve-worker`, one of its workers).
pub async fn run(g: &Global, args: &BenchArgs) -> CliResult {
    if args.serve_worker {
        return serve::run(g, args).await;
    }
    server::require_loopback(g.redis.as_str())?;
    let mut queue = QueueConfig::new(g.redis.as_str(), queue_name())
        .with_partitions(g.settings.partitions.unwrap_or(1));
    if let Some(n) = g.settings.max_body_bytes {
        queue = queue.with_max_body_bytes(n as usize);
    }
    if let Some(layout) = &g.settings.partition_layout {
        queue = queue.with_partition_layout(
            layout
                .parse()
                .map_err(|e: pelican::Error| CliError::usage(e.message().to_string()))?,
        );
    }
    if args.via_gateway && args.codec != BenchCodec::Json {
        return Err(CliError::usage(
            "--via-gateway sends JSON: leave --codec at json",
        ));
    }
    if args.response_bytes > 0 && args.codec != BenchCodec::Raw {
        return Err(CliError::usage(
            "--response-bytes needs --codec raw (the structs workload answers {\"i\": N, \"ok\": true})",
        ));
    }
    // The body: the payload (or the answer) and the encoding's few bytes around it.
    let body = args.payload_bytes.max(args.response_bytes) as usize + 64;
    if body > queue.max_body_bytes {
        queue = queue.with_max_body_bytes(body);
    }
    queue.validate().map_err(|e| g.error(&e))?;
    if !g.redis.as_str().contains("+cluster://") {
        crate::redis_local::require(g.redis.as_str()).await?;
    }
    let mut bench = Bench {
        g,
        args,
        queue,
        workers: None,
        gateway: None,
        load: None,
        bar: progress_bar(g.json),
    };
    if !g.json {
        eprintln!(
            "pelican bench: queue {} on {}, dedup {}; {} warm-up, {} throughput ({} in \
             flight), {} latency requests",
            bench.queue.name,
            g.redis.redacted(),
            if args.no_dedup { "off" } else { "on" },
            args.warmup,
            args.requests,
            args.inflight,
            args.latency_requests
        );
    }
    let result = tokio::select! {
        r = bench.measure() => r,
        _ = crate::process::interrupted() => Err(CliError::failure(
            "interrupted: stopped the bench workers and removed the queue's keys",
        )),
    };
    bench.bar.finish_and_clear();
    let cleaned = bench.cleanup().await;
    let mut report = result?;
    report.keys_deleted = cleaned?;
    if g.json {
        outln!("{}", report.json_line());
    } else {
        out!("{}", report.table());
    }
    Ok(())
}

/// `bench-<8 hex digits>`, from the process id and the clock: a queue of its own for
/// every run, under a name as short as the queues users name. Every key of the queue
/// carries the name and Redis hashes each key's bytes on every lookup (and Lua every
/// string a script sees): the earlier `bench-<pid>-<nanos>`, 30 characters, cost 4 % more
/// of Redis' instructions per request with dedup on (an index key per request), under 1 %
/// without (docs/benchmarks/2026-12-03-a7c0e64-queue-name-and-servers.md).
fn queue_name() -> String {
    use std::hash::{Hash, Hasher};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (nanos, std::process::id()).hash(&mut h);
    format!("bench-{:08x}", h.finish() as u32)
}

fn progress_bar(json: bool) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {per_sec:>12} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// One run: what it started, so that everything is stopped and removed whatever happens.
struct Bench<'a> {
    g: &'a Global,
    args: &'a BenchArgs,
    queue: QueueConfig,
    workers: Option<Workers>,
    /// The gateway process of `--via-gateway`.
    gateway: Option<Workers>,
    load: Option<Arc<Load>>,
    bar: ProgressBar,
}

impl Bench<'_> {
    /// Starts the workers and the producer, runs the phases, checks every answer.
    async fn measure(&mut self) -> CliResult<Report> {
        let (g, args) = (self.g, self.args);
        let mut servers = server::Servers::connect(g.redis.as_str()).await?;
        let redis_pids = servers.local_pids().await;
        let exe = std::env::current_exe()
            .map_err(|e| CliError::failure(format!("cannot find this program's path: {e}")))?;
        let mut worker_args: Vec<String> = vec![
            "--redis".into(),
            g.redis.as_str().to_string(),
            "--queue".into(),
            self.queue.name.clone(),
        ];
        worker_args.extend((0..g.log).map(|_| "-v".to_string()));
        if let Some(n) = g.settings.partitions {
            worker_args.extend(["--partitions".into(), n.to_string()]);
        }
        if let Some(layout) = &g.settings.partition_layout {
            worker_args.extend(["--partition-layout".into(), layout.clone()]);
        }
        worker_args.extend([
            "--max-body-bytes".into(),
            self.queue.max_body_bytes.to_string(),
        ]);
        worker_args.extend([
            "bench".into(),
            "--serve-worker".into(),
            "--concurrency".into(),
            args.concurrency.to_string(),
            "--prefetch".into(),
            args.prefetch().to_string(),
            "--codec".into(),
            args.codec.name().into(),
            "--response-bytes".into(),
            args.response_bytes.to_string(),
        ]);
        let gateway_addr = match args.via_gateway {
            true => Some(self.start_gateway(&exe).await?),
            false => None,
        };
        let workers = self
            .workers
            .insert(Workers::start(&exe, &worker_args, args.workers as usize).await?);
        let config = ProducerConfig::default()
            .with_dedup(!args.no_dedup)
            .with_request_timeout(REQUEST_TIMEOUT);
        let producer = match args.codec {
            _ if args.via_gateway => {
                let addr = gateway_addr.as_deref().expect("started above");
                BenchProducer::Gateway(gateway::GatewayClient::new(addr, &self.queue.name))
            }
            BenchCodec::Json => BenchProducer::Json(
                Producer::connect(self.queue.clone(), config)
                    .await
                    .map_err(|e| g.error(&e))?,
            ),
            BenchCodec::Raw => BenchProducer::Raw(
                Producer::connect(self.queue.clone(), config)
                    .await
                    .map_err(|e| g.error(&e))?,
            ),
            BenchCodec::Postcard => BenchProducer::Postcard(
                Producer::connect(self.queue.clone(), config)
                    .await
                    .map_err(|e| g.error(&e))?,
            ),
        };
        let load = Arc::new(Load::new(
            producer,
            args.payload_bytes as usize,
            args.response_bytes as usize,
        ));
        self.load = Some(load.clone());
        let mut watched = vec![Watched {
            role: if args.via_gateway {
                "client"
            } else {
                "producer"
            },
            pid: Some(std::process::id()),
        }];
        if let Some(gw) = &self.gateway {
            watched.extend(gw.pids().into_iter().map(|pid| Watched {
                role: "gateway",
                pid: Some(pid),
            }));
        }
        watched.extend(workers.pids().into_iter().map(|pid| Watched {
            role: "worker",
            pid: Some(pid),
        }));
        watched.extend(
            redis_pids
                .into_iter()
                .map(|pid| Watched { role: "redis", pid }),
        );
        let phases = Phases {
            args,
            load: &load,
            bar: &self.bar,
            watched,
            json: g.json,
        };
        let gateway_died = async {
            match self.gateway.as_mut() {
                Some(gw) => gw.died().await,
                None => std::future::pending().await,
            }
        };
        let mut report = tokio::select! {
            r = phases.run(&mut servers) => r?,
            e = workers.died() => return Err(e),
            e = gateway_died => return Err(e),
        };
        report.via = if args.via_gateway {
            "gateway"
        } else {
            "library"
        };
        report.queue = self.queue.name.clone();
        report.partitions = self.queue.partitions;
        report.checked = load.checked();
        let expected = args.warmup + args.requests + args.latency_requests;
        if load.bad() > 0 || report.checked != expected {
            return Err(CliError::failure(format!(
                "{} of {expected} requests got a wrong answer or none (the first ones are \
                 shown above); run with -v for the logs",
                expected - report.checked.min(expected)
            )));
        }
        Ok(report)
    }

    /// Stops the producer and the workers, deletes the queue's keys and checks that none
    /// is left; returns how many were deleted.
    async fn cleanup(&mut self) -> CliResult<u64> {
        let mut problems = Vec::new();
        if let Some(load) = self.load.take() {
            // Lanes of an interrupted phase let go of the load once they are dropped.
            let mut load = load;
            let mut tries = 0;
            let producer = loop {
                match Arc::try_unwrap(load) {
                    Ok(l) => break Some(l.into_producer()),
                    Err(l) if tries < 100 => {
                        load = l;
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => break None,
                }
            };
            if let Some(p) = producer {
                match tokio::time::timeout(CLEANUP_TIMEOUT, p.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => problems.push(format!("stopping the producer: {e:#}")),
                    Err(_) => problems.push("stopping the producer timed out".into()),
                }
            }
        }
        if let Some(gateway) = self.gateway.take() {
            for w in gateway.stop().await {
                eprintln!("pelican bench: the gateway: {w}");
            }
        }
        if let Some(workers) = self.workers.take() {
            for w in workers.stop().await {
                eprintln!("pelican bench: {w}");
            }
        }
        let deleted = match tokio::time::timeout(CLEANUP_TIMEOUT, async {
            Admin::connect(self.queue.clone()).await?.destroy().await
        })
        .await
        {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                problems.push(format!("deleting the queue's keys: {e:#}"));
                0
            }
            Err(_) => {
                problems.push("deleting the queue's keys timed out".into());
                0
            }
        };
        let left = match server::Servers::connect(self.g.redis.as_str()).await {
            Ok(mut servers) => servers.keys_containing(&self.queue.name).await,
            Err(e) => Err(e),
        };
        match left {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => problems.push(format!(
                "{} keys of queue {} are left: {}",
                keys.len(),
                self.queue.name,
                keys.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
            )),
            Err(e) => problems.push(format!("checking for keys left behind: {e}")),
        }
        if problems.is_empty() {
            Ok(deleted)
        } else {
            Err(CliError::failure(format!(
                "cleaning up after the bench failed: {}",
                problems.join("; ")
            )))
        }
    }
}

impl Bench<'_> {
    /// Starts `pelican gateway` for the bench's queue on a free loopback port; its
    /// address.
    async fn start_gateway(&mut self, exe: &std::path::Path) -> CliResult<String> {
        let g = self.g;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| {
                CliError::failure(format!("cannot find a free port for the gateway: {e}"))
            })?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut args: Vec<String> = vec!["--redis".into(), g.redis.as_str().to_string()];
        args.extend((0..g.log).map(|_| "-v".to_string()));
        if let Some(n) = g.settings.partitions {
            args.extend(["--partitions".into(), n.to_string()]);
        }
        if let Some(layout) = &g.settings.partition_layout {
            args.extend(["--partition-layout".into(), layout.clone()]);
        }
        args.extend([
            "--max-body-bytes".into(),
            self.queue.max_body_bytes.to_string(),
            "gateway".into(),
            "--listen".into(),
            addr.clone(),
            "--queues".into(),
            self.queue.name.clone(),
            "--default-timeout".into(),
            REQUEST_TIMEOUT.as_millis().to_string(),
            "--max-inflight".into(),
            "1000000".into(),
            "--threads".into(),
            self.args.gateway_threads.to_string(),
        ]);
        self.gateway = Some(Workers::start_with(exe, &args, 1, "stop with Ctrl-C").await?);
        Ok(addr)
    }
}

/// The measured part of a run: warm-up, throughput, latency.
struct Phases<'a> {
    args: &'a BenchArgs,
    load: &'a Arc<Load>,
    bar: &'a ProgressBar,
    watched: Vec<Watched>,
    json: bool,
}

impl Phases<'_> {
    async fn run(&self, servers: &mut server::Servers) -> CliResult<Report> {
        let args = self.args;
        if args.warmup > 0 {
            let w = self
                .phase("warm-up", args.warmup, args.inflight.min(WARMUP_INFLIGHT))
                .await;
            self.diagnose("warmup", &w);
        }
        let rss_start = self.rss();
        let before: Vec<ServerCounters> = servers.counters().await?;
        let window = CpuWindow::start(&self.watched);
        let tp = self.phase("throughput", args.requests, args.inflight).await;
        let cpu = window.stop();
        let after = servers.counters().await?;
        let rss_end = self.rss();
        let rss_peak = self.memory(sys::peak_rss_kb);
        self.diagnose("throughput", &tp);
        if self.json {
            eprintln!("throughput CPU (% of one core): {}", cpu.line());
        }
        let deltas: Vec<ServerDelta> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| ServerDelta::between(b, a))
            .collect();
        let lat = if args.latency_requests > 0 {
            self.phase("latency", args.latency_requests, 1).await
        } else {
            Phase::default()
        };
        self.diagnose("latency", &lat);
        Ok(Report {
            dedup: !args.no_dedup,
            warmup: args.warmup,
            workers: args.workers,
            concurrency: args.concurrency,
            prefetch: args.prefetch(),
            payload_bytes: args.payload_bytes,
            response_bytes: args.response_bytes,
            codec: args.codec.name(),
            tp,
            lat,
            server: ServerDelta::sum(&deltas),
            nodes: if deltas.len() > 1 {
                servers
                    .nodes
                    .iter()
                    .map(|(addr, _)| addr.clone())
                    .zip(deltas)
                    .collect()
            } else {
                Vec::new()
            },
            cpu,
            rss_start,
            rss_end,
            rss_peak,
            ..Report::default()
        })
    }

    async fn phase(&self, name: &str, n: u64, inflight: u64) -> Phase {
        self.bar.reset();
        self.bar.set_prefix(name.to_string());
        self.bar.set_length(n);
        self.bar.set_position(0);
        self.load.closed_loop(n, inflight, self.bar).await
    }

    /// Resident memory per role (the workers summed up).
    fn rss(&self) -> Vec<(&'static str, Option<u64>)> {
        self.memory(sys::rss_kb)
    }

    /// A memory figure (kB, by pid) per role, the workers summed up.
    fn memory(&self, of: fn(u32) -> Option<u64>) -> Vec<(&'static str, Option<u64>)> {
        let mut out: Vec<(&'static str, Option<u64>)> = Vec::new();
        for w in self.watched.iter().filter(|w| w.role != "redis") {
            sys::add(&mut out, w.role, w.pid.and_then(of));
        }
        out
    }

    /// With --json, the peer's diagnostics on stderr (the table has them otherwise).
    fn diagnose(&self, name: &str, p: &Phase) {
        if !self.json || p.requests == 0 {
            return;
        }
        let h = &p.latencies;
        eprintln!(
            "{name}: {} req in {:.3} ms = {:.1} req/s; p50={:.3} p90={:.3} p99={:.3} max={:.3} \
             mean={:.3} ms",
            p.requests,
            p.wall.as_secs_f64() * 1000.0,
            p.rate(),
            h.quantile_ms(0.5),
            h.quantile_ms(0.9),
            h.quantile_ms(0.99),
            h.max_ms(),
            h.mean_ms()
        );
    }
}
