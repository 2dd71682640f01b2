//! The demo's load: what each producer submits, at what pace, and what it measured.

use pelican::{Producer, Submitted};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing::Instrument;

/// What the producers measured.
#[derive(Default)]
pub struct Load {
    /// Submissions that joined an identical request in flight.
    pub joined: AtomicU64,
    /// Submissions answered from the result cache.
    pub cached: AtomicU64,
    /// Submissions that added a stream entry.
    pub queued: AtomicU64,
    /// Load requests resolved, either way.
    pub resolved: AtomicU64,
    /// Load requests answered.
    pub answered: AtomicU64,
    /// Load requests that failed.
    pub failed: AtomicU64,
    /// Submit-to-response times of the answered ones, ms.
    pub latencies_ms: Mutex<Vec<f64>>,
    /// The first failure, for the message.
    pub first_error: Mutex<Option<String>>,
}

impl Load {
    /// Counts one submission by how it was taken.
    pub fn submitted(&self, how: Submitted) {
        let c = match how {
            Submitted::Joined => &self.joined,
            Submitted::Cached => &self.cached,
            _ => &self.queued,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one outcome.
    pub fn resolved(&self, took: Duration, r: Result<Value, String>) {
        match r {
            Ok(_) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                self.latencies_ms
                    .lock()
                    .unwrap()
                    .push(took.as_secs_f64() * 1000.0);
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error.lock().unwrap().get_or_insert(e);
            }
        }
        self.resolved.fetch_add(1, Ordering::Relaxed);
    }
}
/// Submits `plan` at a steady pace and records every outcome.
pub async fn produce(
    producer: Producer<Value, Value>,
    plan: Vec<Value>,
    interval: Duration,
    load: Arc<Load>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut waits = tokio::task::JoinSet::new();
    for body in plan {
        tick.tick().await;
        let t0 = Instant::now();
        match producer.submit(&body).await {
            Ok(ticket) => {
                load.submitted(ticket.submitted());
                let span = tracing::info_span!("request", rid = %ticket.request_id());
                waits.spawn(
                    async move {
                        let r = ticket.await.map_err(|e| format!("{e:#}"));
                        tracing::debug!(ok = r.is_ok(), "resolved");
                        (t0.elapsed(), r)
                    }
                    .instrument(span),
                );
            }
            Err(e) => load.resolved(t0.elapsed(), Err(format!("{e:#}"))),
        }
        while let Some(Ok((took, r))) = waits.try_join_next() {
            load.resolved(took, r);
        }
    }
    while let Some(Ok((took, r))) = waits.join_next().await {
        load.resolved(took, r);
    }
}

/// The requests of each producer: mostly distinct tasks, some identical to what the
/// next producer submits at the same moment (joined in flight), some repeating the
/// producer's own earlier ones (answered from the cache).
pub fn plan(producers: usize, requests: usize, seed: u64) -> Vec<Vec<Value>> {
    let per = requests.div_ceil(producers);
    let unique = |p: usize, j: usize| json!({"task": p * per + j, "text": format!("request {}", p * per + j)});
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % 100
    };
    let mut plans = vec![Vec::new(); producers];
    for i in 0..requests {
        let (p, j) = (i % producers, i / producers);
        let r = next();
        let body = if r < 18 && producers > 1 {
            unique((p + 1) % producers, j)
        } else if r < 28 && j >= 8 {
            unique(p, j - 8)
        } else {
            unique(p, j)
        };
        plans[p].push(body);
    }
    plans
}
/// A seed that differs per run.
pub fn seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id())
}
#[cfg(test)]
mod tests {
    #[test]
    fn plans_have_the_right_size_and_duplicates() {
        let plans = super::plan(4, 402, 7);
        assert_eq!(plans.iter().map(Vec::len).sum::<usize>(), 402);
        let mut all: Vec<String> = plans.iter().flatten().map(|v| v.to_string()).collect();
        all.sort();
        all.dedup();
        assert!(all.len() < 402 && all.len() > 250, "{}", all.len());
    }
}
