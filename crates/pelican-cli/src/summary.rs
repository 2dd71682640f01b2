//! The demo's closing summary: every number measured during the run.

use crate::fmt::duration_ms;
use serde_json::{json, Value};

/// What the demo measured.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Queue name.
    pub queue: String,
    /// Where Redis was (redacted URL) and whether the demo started it.
    pub redis: String,
    /// Whether a throwaway server was started.
    pub throwaway: bool,
    /// Producers.
    pub producers: u64,
    /// Submissions in all (load and poison).
    pub requests: u64,
    /// Of them, joined an identical request in flight.
    pub joined: u64,
    /// Of them, answered from the result cache.
    pub cached: u64,
    /// Load requests that got their response.
    pub answered: u64,
    /// Load requests that failed (should be none).
    pub failed: u64,
    /// Stream entries ever added (XINFO STREAM entries-added).
    pub entries: u64,
    /// Requests handled by the workers (their output lines).
    pub handled: u64,
    /// Of them, deliveries after the first (taken over from a dead worker).
    pub recovered: u64,
    /// Workers at a time.
    pub workers: u64,
    /// Worker processes started in all.
    pub started: u64,
    /// The killed worker and how many requests it held when it was killed.
    pub killed: Option<(usize, u64)>,
    /// Worker crashes (the poison's deliveries).
    pub crashes: u64,
    /// Dead letters in the queue at the end.
    pub dead_letters: u64,
    /// The poison's dead letter: deliveries.
    pub poison_deliveries: u64,
    /// Callers of the poison request that got a Dead error.
    pub poison_dead_callers: u64,
    /// Latencies of the load requests, ms, sorted.
    pub latencies_ms: Vec<f64>,
    /// The workers' claim idle time, ms.
    pub claim_idle_ms: u64,
    /// Wall time of the run, ms.
    pub wall_ms: f64,
}

impl Summary {
    /// The q-quantile (0..=1) of the latencies, nearest rank.
    pub fn quantile(&self, q: f64) -> f64 {
        let v = &self.latencies_ms;
        if v.is_empty() {
            return 0.0;
        }
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }

    /// Stream entries saved by dedup.
    pub fn dedup_saved(&self) -> u64 {
        self.requests.saturating_sub(self.entries)
    }

    /// The table for humans.
    pub fn table(&self) -> String {
        let killed = match self.killed {
            Some((slot, held)) => {
                format!("worker {slot} was SIGKILLed holding {held}; others took its work over")
            }
            None => "no worker was killed".into(),
        };
        let rows: Vec<(&str, String, String)> = vec![
            (
                "requests",
                self.requests.to_string(),
                format!(
                    "from {} producers: {} answered, {} failed, and the poison twice",
                    self.producers, self.answered, self.failed
                ),
            ),
            (
                "stream entries",
                self.entries.to_string(),
                format!(
                    "dedup saved {}: {} joined in flight, {} from the result cache",
                    self.dedup_saved(),
                    self.joined,
                    self.cached
                ),
            ),
            (
                "handled",
                self.handled.to_string(),
                format!(
                    "by {} worker processes ({} started in all)",
                    self.workers, self.started
                ),
            ),
            ("recovered", self.recovered.to_string(), killed),
            (
                "dead-lettered",
                self.dead_letters.to_string(),
                format!(
                    "the poison: {} deliveries, {} crashed workers, {} callers got Dead",
                    self.poison_deliveries, self.crashes, self.poison_dead_callers
                ),
            ),
            (
                "latency p50",
                duration_ms(self.quantile(0.50)),
                "submit to response, as the producers saw it (cache hits too)".into(),
            ),
            (
                "latency p99",
                duration_ms(self.quantile(0.99)),
                String::new(),
            ),
            (
                "latency max",
                duration_ms(self.quantile(1.0)),
                if self.killed.is_some() && self.quantile(1.0) >= self.claim_idle_ms as f64 {
                    format!(
                        "waited for the killed worker's lease to run out (claim idle {})",
                        duration_ms(self.claim_idle_ms as f64)
                    )
                } else {
                    String::new()
                },
            ),
            ("wall time", duration_ms(self.wall_ms), String::new()),
        ];
        let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
        let w2 = rows.iter().map(|r| r.2.len()).max().unwrap_or(0);
        let rule = format!(
            "+-{}-+-{}-+-{}-+\n",
            "-".repeat(w0),
            "-".repeat(w1),
            "-".repeat(w2)
        );
        let mut out = rule.clone();
        for (a, b, c) in &rows {
            out.push_str(&format!("| {a:<w0$} | {b:>w1$} | {c:<w2$} |\n"));
        }
        out.push_str(&rule);
        out
    }

    /// The same numbers for scripts.
    pub fn json(&self) -> Value {
        json!({
            "queue": self.queue,
            "redis": self.redis,
            "throwaway_redis": self.throwaway,
            "producers": self.producers,
            "requests": self.requests,
            "answered": self.answered,
            "failed": self.failed,
            "joined": self.joined,
            "cached": self.cached,
            "stream_entries": self.entries,
            "dedup_saved": self.dedup_saved(),
            "handled": self.handled,
            "recovered": self.recovered,
            "workers": self.workers,
            "workers_started": self.started,
            "killed_worker_held": self.killed.map(|k| k.1),
            "crashes": self.crashes,
            "dead_lettered": self.dead_letters,
            "poison_deliveries": self.poison_deliveries,
            "poison_dead_callers": self.poison_dead_callers,
            "latency_ms": {
                "p50": self.quantile(0.5),
                "p99": self.quantile(0.99),
                "max": self.quantile(1.0),
            },
            "wall_ms": self.wall_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let s = Summary {
            latencies_ms: (1..=100).map(f64::from).collect(),
            ..Summary::default()
        };
        assert_eq!(s.quantile(0.5), 50.0);
        assert_eq!(s.quantile(0.99), 99.0);
        assert_eq!(Summary::default().quantile(0.5), 0.0);
    }

    #[test]
    fn table_rows_line_up() {
        let t = Summary::default().table();
        let widths: Vec<usize> = t.lines().map(|l| l.chars().count()).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
        assert!(t.contains("| stream entries |"), "{t}");
    }
}
