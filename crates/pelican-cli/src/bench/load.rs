//! The agreed workload, driven from one producer: a closed loop of `inflight` lanes,
//! each submitting one request, awaiting its answer, checking it and going on with the
//! next. The latency phase is the same loop with one lane.

use super::histogram::Histogram;
use indicatif::ProgressBar;
use pelican::{Bytes, Postcard, Producer, Raw, Result as PelicanResult};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Bad answers printed as they happen; the rest are only counted.
const SHOW_BAD: u64 = 5;
/// How often the progress bar is moved.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// The request: `{"i": N, "data": "<payload_bytes x>"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRequest {
    /// The request's index in the run. Unique across the phases of a run, so that with
    /// dedup on no request is answered from the result cache of an earlier one.
    pub i: u64,
    /// Filler.
    pub data: String,
}

/// The answer the worker gives: `{"i": N, "ok": true}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResponse {
    /// The request's index.
    pub i: u64,
    /// Always true.
    pub ok: bool,
}

/// The bench's producer, with the codec chosen.
pub enum BenchProducer {
    /// `--codec json`.
    Json(Producer<BenchRequest, BenchResponse>),
    /// `--codec raw`.
    Raw(Producer<Bytes, Bytes, Raw>),
    /// `--codec postcard`.
    Postcard(Producer<BenchRequest, BenchResponse, Postcard>),
    /// `--via-gateway`: HTTP calls to a `pelican gateway` (JSON).
    Gateway(super::gateway::GatewayClient),
}

impl BenchProducer {
    /// Stops it (see `Producer::shutdown`).
    pub async fn shutdown(self) -> PelicanResult<()> {
        match self {
            BenchProducer::Json(p) => p.shutdown().await,
            BenchProducer::Raw(p) => p.shutdown().await,
            BenchProducer::Postcard(p) => p.shutdown().await,
            // The gateway process is stopped with the workers.
            BenchProducer::Gateway(_) => Ok(()),
        }
    }
}

/// The answer to raw request `req`: its first 8 bytes (the index), a 1, and `filler`
/// x's (`--response-bytes`).
pub fn raw_answer(req: &[u8], filler: usize) -> Bytes {
    let head = req.len().min(8);
    let mut a = Vec::with_capacity(head + 1 + filler);
    a.extend_from_slice(&req[..head]);
    a.push(1);
    a.resize(head + 1 + filler, b'x');
    Bytes::from(a)
}

/// The producer side of a run: one producer, the payload, and the answers checked so far.
pub struct Load {
    producer: BenchProducer,
    data: String,
    response_bytes: usize,
    next_index: AtomicU64,
    checked: AtomicU64,
    bad: AtomicU64,
}

/// What one phase measured.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    /// Requests.
    pub requests: u64,
    /// Most requests outstanding at once.
    pub inflight: u64,
    /// First submission to last answer.
    pub wall: Duration,
    /// Submit-to-answer latencies.
    pub latencies: Histogram,
}

impl Phase {
    /// Requests per second over the wall time.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// The state one phase's lanes share.
struct Lanes {
    n: u64,
    base: u64,
    next: AtomicU64,
    done: AtomicU64,
    start: Instant,
    last_ns: AtomicU64,
    latencies: Mutex<Histogram>,
}

impl Load {
    /// A load on this producer with a payload of `payload_bytes` x's, answered (raw
    /// codec) with `response_bytes` x's.
    pub fn new(producer: BenchProducer, payload_bytes: usize, response_bytes: usize) -> Load {
        Load {
            producer,
            data: "x".repeat(payload_bytes),
            response_bytes,
            next_index: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            bad: AtomicU64::new(0),
        }
    }

    /// The producer back, to shut it down (once no lane holds the load any more).
    pub fn into_producer(self) -> BenchProducer {
        self.producer
    }

    /// Answers received and found right.
    pub fn checked(&self) -> u64 {
        self.checked.load(Ordering::Relaxed)
    }

    /// Answers that were wrong, and requests that failed.
    pub fn bad(&self) -> u64 {
        self.bad.load(Ordering::Relaxed)
    }

    /// Runs `n` requests with at most `inflight` outstanding; moves `bar` along.
    pub async fn closed_loop(self: &Arc<Self>, n: u64, inflight: u64, bar: &ProgressBar) -> Phase {
        if let BenchProducer::Gateway(gw) = &self.producer {
            // One connection per lane, open before the clock starts.
            if let Err(e) = gw.open(inflight.clamp(1, n.max(1)) as usize).await {
                eprintln!("pelican bench: {e}");
                self.bad.fetch_add(1, Ordering::Relaxed);
            }
        }
        let lanes = Arc::new(Lanes {
            n,
            base: self.next_index.fetch_add(n, Ordering::Relaxed),
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            start: Instant::now(),
            last_ns: AtomicU64::new(0),
            latencies: Mutex::new(Histogram::default()),
        });
        let ticker = (!bar.is_hidden()).then(|| {
            let (bar, lanes) = (bar.clone(), lanes.clone());
            tokio::spawn(async move {
                loop {
                    bar.set_position(lanes.done.load(Ordering::Relaxed));
                    tokio::time::sleep(PROGRESS_TICK).await;
                }
            })
        });
        let mut set = JoinSet::new();
        for _ in 0..inflight.clamp(1, n.max(1)) {
            set.spawn(lane(self.clone(), lanes.clone()));
        }
        while let Some(r) = set.join_next().await {
            if let Err(e) = r {
                // A lane cannot panic by design; if one did, its requests are missing.
                eprintln!("pelican bench: a load lane failed: {e}");
                self.bad.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(t) = ticker {
            t.abort();
        }
        bar.set_position(n);
        let latencies = std::mem::take(&mut *lanes.latencies.lock().unwrap());
        Phase {
            requests: n,
            inflight: inflight.min(n),
            wall: Duration::from_nanos(lanes.last_ns.load(Ordering::Relaxed)),
            latencies,
        }
    }

    /// Submits request `i` and awaits its answer: whether it was right (or why not), and
    /// the time from submission to answer (building the request is not timed).
    async fn call(&self, i: u64) -> (Result<(), String>, Duration) {
        let structs = |r: PelicanResult<BenchResponse>| match r {
            Ok(r) if r.i == i && r.ok => Ok(()),
            Ok(r) => Err(format!("wrong answer {r:?}")),
            Err(e) => Err(format!("failed: {e:#}")),
        };
        let req = || BenchRequest {
            i,
            data: self.data.clone(),
        };
        match &self.producer {
            BenchProducer::Json(p) => {
                let req = req();
                let t0 = Instant::now();
                let r = p.call(&req).await;
                (structs(r), t0.elapsed())
            }
            BenchProducer::Postcard(p) => {
                let req = req();
                let t0 = Instant::now();
                let r = p.call(&req).await;
                (structs(r), t0.elapsed())
            }
            BenchProducer::Gateway(gw) => {
                let body = serde_json::to_vec(&req()).expect("a struct of a number and a string");
                let t0 = Instant::now();
                let r = gw.call(&body).await;
                let took = t0.elapsed();
                let r = match r {
                    Ok((200, b)) => match serde_json::from_slice::<BenchResponse>(&b) {
                        Ok(r) if r.i == i && r.ok => Ok(()),
                        Ok(r) => Err(format!("wrong answer {r:?}")),
                        Err(e) => Err(format!("an answer that is not one ({e})")),
                    },
                    Ok((status, b)) => {
                        Err(format!("status {status}: {}", String::from_utf8_lossy(&b)))
                    }
                    Err(e) => Err(e),
                };
                (r, took)
            }
            BenchProducer::Raw(p) => {
                // Filled, not copied from `data`: a fill only writes (a copy of 100 KB
                // was 15 % of the producer process's time at that size).
                let mut req = Vec::with_capacity(8 + self.data.len());
                req.extend_from_slice(&i.to_le_bytes());
                req.resize(8 + self.data.len(), b'x');
                let want = raw_answer(&req, self.response_bytes);
                let t0 = Instant::now();
                let r = p.call_bytes(Bytes::from(req)).await;
                let took = t0.elapsed();
                let r = match r {
                    Ok(r) if r == want => Ok(()),
                    Ok(r) => Err(format!("wrong answer {r:?}")),
                    Err(e) => Err(format!("failed: {e:#}")),
                };
                (r, took)
            }
        }
    }

    fn check(&self, i: u64, answer: Result<(), String>) {
        let why = match answer {
            Ok(()) => {
                self.checked.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(why) => why,
        };
        if self.bad.fetch_add(1, Ordering::Relaxed) < SHOW_BAD {
            eprintln!("pelican bench: request i={i}: {why}");
        }
    }
}

/// One lane: submit, await, check, next, until the phase's requests are taken.
async fn lane(load: Arc<Load>, lanes: Arc<Lanes>) {
    loop {
        let j = lanes.next.fetch_add(1, Ordering::Relaxed);
        if j >= lanes.n {
            return;
        }
        let i = lanes.base + j;
        let (answer, took) = load.call(i).await;
        let t1 = Instant::now();
        lanes.latencies.lock().unwrap().record(took);
        let since_start = u64::try_from((t1 - lanes.start).as_nanos()).unwrap_or(u64::MAX);
        lanes.last_ns.fetch_max(since_start, Ordering::Relaxed);
        lanes.done.fetch_add(1, Ordering::Relaxed);
        load.check(i, answer);
    }
}
