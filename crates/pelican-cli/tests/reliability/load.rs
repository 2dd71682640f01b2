//! This test process as the producer: a load of requests kept in flight, every caller
//! awaited with a deadline and accounted for (answered with its own response, a typed
//! error, or hung).

#![allow(dead_code)]

use crate::common::HANG_SLACK;
use pelican::{Producer, ProducerConfig, QueueConfig};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The test's producer: JSON in, JSON out, like the workers.
pub type JsonProducer = Producer<Json, Json>;

/// The queue as the test's producer sees it.
pub fn queue_config(url: &str, queue: &str) -> QueueConfig {
    QueueConfig::new(url, queue).with_janitor_interval(Duration::from_secs(1))
}

pub async fn producer(q: QueueConfig, request_timeout: Duration) -> JsonProducer {
    producer_with(q, request_timeout, true).await
}

/// [`producer`], dedup on or off.
pub async fn producer_with(q: QueueConfig, request_timeout: Duration, dedup: bool) -> JsonProducer {
    Producer::connect(
        q,
        ProducerConfig::default()
            .with_request_timeout(request_timeout)
            .with_sweep_interval(Duration::from_secs(3))
            .with_dedup(dedup),
    )
    .await
    .expect("the test's producer connects")
}

/// Answers received so far, shared with whoever injects faults by progress.
#[derive(Clone, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A load: `n` requests `{"i": i, "run": run, ...}`, `in_flight` at a time.
#[derive(Clone)]
pub struct LoadSpec {
    pub n: u64,
    pub in_flight: usize,
    pub run: String,
    /// The producer's request timeout; a caller still waiting `HANG_SLACK` after it
    /// counts as hung.
    pub request_timeout: Duration,
    /// Requests that carry `"poison": true`.
    pub poison: fn(u64) -> bool,
    /// Bytes of padding in the requests `padded` says.
    pub pad: usize,
    /// Which requests carry `pad` (all unless said).
    pub padded: fn(u64) -> bool,
    /// Once set, no more requests are submitted (the ones in flight are awaited).
    pub stop: Arc<AtomicBool>,
}

impl LoadSpec {
    pub fn new(run: &str, n: u64, in_flight: usize, request_timeout: Duration) -> LoadSpec {
        LoadSpec {
            n,
            in_flight,
            run: run.to_string(),
            request_timeout,
            poison: |_| false,
            pad: 0,
            padded: |_| true,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn body(&self, i: u64) -> Json {
        let mut b = json!({ "i": i, "run": self.run });
        if (self.poison)(i) {
            b["poison"] = json!(true);
        }
        if self.pad > 0 && (self.padded)(i) {
            b["pad"] = json!("x".repeat(self.pad));
        }
        b
    }
}

/// What became of every caller of a load.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub requests: u64,
    /// Answered with its own response (`i` echoed).
    pub ok: u64,
    /// Answered with a response that is not its own.
    pub wrong: u64,
    /// Still waiting `HANG_SLACK` after its timeout (or a submit that never returned).
    pub hung: u64,
    /// Typed errors of normal requests, by kind.
    pub errors: BTreeMap<String, u64>,
    /// Poison requests answered `Dead`.
    pub poison_dead: u64,
    /// Poison requests that ended otherwise, by outcome.
    pub poison_other: BTreeMap<String, u64>,
    /// Submissions that failed with a retryable error and were submitted again, as the
    /// documented contract says a caller may (`Error::is_retryable`).
    pub submit_retries: u64,
    /// Callers that resolved more than once (must be impossible).
    pub resolved_twice: u64,
    pub duration: Duration,
    pub max_latency: Duration,
    /// Request ids of the poison requests.
    pub poison_rids: Vec<String>,
}

impl LoadReport {
    /// Normal requests that were not answered with their own response.
    pub fn lost(&self) -> u64 {
        self.errors.values().sum::<u64>() + self.wrong
    }

    pub fn one_line(&self) -> String {
        format!(
            "{} requests in {:.1}s: ok {}, wrong {}, hung {}, errors {:?}, poison dead {}, poison other {:?}, submit retries {}, max latency {:.1}s",
            self.requests,
            self.duration.as_secs_f64(),
            self.ok,
            self.wrong,
            self.hung,
            self.errors,
            self.poison_dead,
            self.poison_other,
            self.submit_retries,
            self.max_latency.as_secs_f64()
        )
    }
}

pub enum Fate {
    Ok,
    Wrong,
    Hung,
    Error(String),
}

/// What became of one caller.
pub struct One {
    pub fate: Fate,
    pub retries: u64,
    pub latency: Duration,
    pub rid: Option<String>,
}

/// Submits request `i` of `spec` (again while the submit fails with a retryable error)
/// and awaits its answer with a deadline.
pub async fn one(p: &JsonProducer, spec: &LoadSpec, i: u64) -> One {
    let body = spec.body(i);
    let started = Instant::now();
    let mut retries = 0;
    let mut backoff = Duration::from_millis(50);
    // A caller that cannot even submit within its timeout gives up then.
    let give_up = started + spec.request_timeout;
    let ticket = loop {
        match tokio::time::timeout(spec.request_timeout + HANG_SLACK, p.submit(&body)).await {
            Err(_) => {
                return One {
                    fate: Fate::Hung,
                    retries,
                    latency: started.elapsed(),
                    rid: None,
                }
            }
            Ok(Ok(t)) => break t,
            Ok(Err(e)) if e.is_retryable() && Instant::now() + backoff < give_up => {
                retries += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Ok(Err(e)) => {
                return One {
                    fate: Fate::Error(format!("submit: {:?}", e.kind())),
                    retries,
                    latency: started.elapsed(),
                    rid: None,
                }
            }
        }
    };
    let rid = ticket.request_id().to_string();
    let fate = match tokio::time::timeout(spec.request_timeout + HANG_SLACK, ticket).await {
        Err(_) => Fate::Hung,
        Ok(Ok(v)) if v["i"].as_u64() == Some(i) && v["run"] == json!(spec.run) => Fate::Ok,
        Ok(Ok(_)) => Fate::Wrong,
        Ok(Err(e)) => Fate::Error(format!("{:?}", e.kind())),
    };
    One {
        fate,
        retries,
        latency: started.elapsed(),
        rid: Some(rid),
    }
}

/// Runs a load to its end: every request is submitted and awaited with a deadline.
pub async fn drive(p: JsonProducer, spec: LoadSpec, progress: Progress) -> LoadReport {
    let started = Instant::now();
    let spec = Arc::new(spec);
    let limit = Arc::new(Semaphore::new(spec.in_flight));
    let resolutions: Arc<Vec<AtomicU8>> = Arc::new((0..spec.n).map(|_| AtomicU8::new(0)).collect());
    let report = Arc::new(Mutex::new(LoadReport {
        requests: spec.n,
        ..LoadReport::default()
    }));
    let mut tasks = JoinSet::new();
    let mut submitted = 0;
    for i in 0..spec.n {
        let permit = limit.clone().acquire_owned().await.expect("never closed");
        if spec.stop.load(Ordering::SeqCst) {
            break;
        }
        submitted += 1;
        let (p, spec, report, progress, resolutions) = (
            p.clone(),
            spec.clone(),
            report.clone(),
            progress.clone(),
            resolutions.clone(),
        );
        tasks.spawn(async move {
            let r = one(&p, &spec, i).await;
            resolutions[i as usize].fetch_add(1, Ordering::Relaxed);
            let poison = (spec.poison)(i);
            let mut rep = report.lock().unwrap();
            rep.submit_retries += r.retries;
            rep.max_latency = rep.max_latency.max(r.latency);
            if poison {
                if let Some(rid) = &r.rid {
                    rep.poison_rids.push(rid.clone());
                }
            }
            match (r.fate, poison) {
                (Fate::Hung, _) => rep.hung += 1,
                (Fate::Error(k), true) if k == "Dead" => rep.poison_dead += 1,
                (Fate::Ok, true) => *rep.poison_other.entry("ok".into()).or_default() += 1,
                (Fate::Wrong, true) => *rep.poison_other.entry("wrong".into()).or_default() += 1,
                (Fate::Error(k), true) => *rep.poison_other.entry(k).or_default() += 1,
                (Fate::Ok, false) => rep.ok += 1,
                (Fate::Wrong, false) => rep.wrong += 1,
                (Fate::Error(k), false) => *rep.errors.entry(k).or_default() += 1,
            }
            drop(rep);
            progress.bump();
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            if let Err(e) = r {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let mut rep = report.lock().unwrap().clone();
    rep.requests = submitted;
    rep.resolved_twice = resolutions
        .iter()
        .filter(|n| n.load(Ordering::Relaxed) > 1)
        .count() as u64;
    rep.duration = started.elapsed();
    rep
}
