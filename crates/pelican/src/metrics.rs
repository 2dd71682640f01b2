//! Every metric pelican records, through the `metrics` facade (install any recorder, e.g.
//! a Prometheus exporter, to see them). Names carry their unit; every series has a
//! `queue` label.
//!
//! The series of a queue are registered once, when a producer, consumer or admin
//! connects, and kept as handles: a `counter!` per request would build its key (and
//! allocate its labels) on every request, and make the recorder look it up. So a recorder
//! must be installed before connecting.

use metrics::{counter, histogram, Counter, Histogram};
use std::sync::Arc;
use std::time::Duration;

/// Outcome labels: those of `Outcome::label`, then "failed" (a request that got an error
/// instead of an outcome).
const OUTCOMES: [&str; 5] = ["ok", "error", "dead", "expired", "failed"];

/// Why a producer submitted a request again of its own accord (the `why` label of
/// `pelican_requests_resubmitted_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resubmit {
    /// The entry it shared expired with another submitter's earlier deadline, and this
    /// producer's caller still has time.
    Expired,
    /// Redis no longer knows the request, or knows it without this producer: lost in a
    /// restart without persistence or a failover, or its index rewritten by someone else.
    Lost,
    /// Its outcome named a stored answer that is gone from Redis (evicted, lost, deleted).
    AnswerGone,
}

impl Resubmit {
    const ALL: [Resubmit; 3] = [Resubmit::Expired, Resubmit::Lost, Resubmit::AnswerGone];

    /// The `why` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Resubmit::Expired => "expired",
            Resubmit::Lost => "lost",
            Resubmit::AnswerGone => "answer_gone",
        }
    }
}

/// Why a consumer handed an entry back unanswered for any consumer to take at once (the
/// `why` label of `pelican_deliveries_handed_back_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandBack {
    /// A delivery dropped without an answer (its handler cancelled, the program let go of it).
    Dropped,
    /// Read ahead, and its slot did not come free within a quarter of `claim_idle` (the
    /// outcome writer retrying a failed call), or the consumer stopped meanwhile.
    ReadAhead,
}

impl HandBack {
    const ALL: [HandBack; 2] = [HandBack::Dropped, HandBack::ReadAhead];

    /// The `why` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            HandBack::Dropped => "dropped",
            HandBack::ReadAhead => "read_ahead",
        }
    }
}

fn outcome_index(label: &str) -> usize {
    OUTCOMES
        .iter()
        .position(|l| *l == label)
        .unwrap_or(OUTCOMES.len() - 1)
}

/// The series of one queue.
#[derive(Clone)]
pub(crate) struct Metrics(Arc<Series>);

struct Series {
    submitted: Counter,
    joined: Counter,
    cached: Counter,
    resolved: Vec<Counter>,
    request_duration: Histogram,
    completed: Vec<Counter>,
    handler_duration: Histogram,
    redelivered: Counter,
    dead_lettered: Counter,
    lease_lost: Counter,
    duplicate_dropped: Counter,
    resubmitted: Vec<Counter>,
    read_ahead: Counter,
    handed_back: Vec<Counter>,
}

impl Metrics {
    pub(crate) fn new(queue: &str) -> Metrics {
        let q = queue.to_string();
        let per_outcome = |name: &'static str| -> Vec<Counter> {
            OUTCOMES
                .iter()
                .map(|o| counter!(name, "queue" => q.clone(), "outcome" => *o))
                .collect()
        };
        Metrics(Arc::new(Series {
            submitted: counter!("pelican_requests_submitted_total", "queue" => q.clone()),
            joined: counter!("pelican_requests_joined_total", "queue" => q.clone()),
            cached: counter!("pelican_requests_cached_total", "queue" => q.clone()),
            resolved: per_outcome("pelican_requests_resolved_total"),
            request_duration: histogram!("pelican_request_duration_seconds", "queue" => q.clone()),
            completed: per_outcome("pelican_deliveries_completed_total"),
            handler_duration: histogram!("pelican_handler_duration_seconds", "queue" => q.clone()),
            redelivered: counter!("pelican_deliveries_redelivered_total", "queue" => q.clone()),
            dead_lettered: counter!("pelican_dead_lettered_total", "queue" => q.clone()),
            lease_lost: counter!("pelican_leases_lost_total", "queue" => q.clone()),
            duplicate_dropped: counter!("pelican_outcomes_dropped_total", "queue" => q.clone()),
            read_ahead: counter!("pelican_deliveries_read_ahead_total", "queue" => q.clone()),
            handed_back: HandBack::ALL
                .iter()
                .map(|w| {
                    counter!("pelican_deliveries_handed_back_total", "queue" => q.clone(), "why" => w.label())
                })
                .collect(),
            resubmitted: Resubmit::ALL
                .iter()
                .map(|w| {
                    counter!("pelican_requests_resubmitted_total", "queue" => q.clone(), "why" => w.label())
                })
                .collect(),
        }))
    }

    pub(crate) fn submitted(&self, n: u64) {
        self.0.submitted.increment(n);
    }

    pub(crate) fn joined(&self, n: u64) {
        self.0.joined.increment(n);
    }

    pub(crate) fn cached(&self, n: u64) {
        self.0.cached.increment(n);
    }

    pub(crate) fn resolved(&self, outcome: &str, elapsed: Duration) {
        self.0.resolved[outcome_index(outcome)].increment(1);
        self.0.request_duration.record(elapsed.as_secs_f64());
    }

    pub(crate) fn completed(&self, outcome: &str, n: u64) {
        self.0.completed[outcome_index(outcome)].increment(n);
    }

    pub(crate) fn handler_duration(&self, elapsed: Duration) {
        self.0.handler_duration.record(elapsed.as_secs_f64());
    }

    pub(crate) fn redelivered(&self, n: u64) {
        self.0.redelivered.increment(n);
    }

    pub(crate) fn dead_lettered(&self, n: u64) {
        self.0.dead_lettered.increment(n);
    }

    pub(crate) fn lease_lost(&self, n: u64) {
        self.0.lease_lost.increment(n);
    }

    pub(crate) fn duplicate_dropped(&self, n: u64) {
        self.0.duplicate_dropped.increment(n);
    }

    pub(crate) fn read_ahead(&self, n: u64) {
        self.0.read_ahead.increment(n);
    }

    pub(crate) fn handed_back(&self, why: HandBack) {
        self.0.handed_back[why as usize].increment(1);
    }

    pub(crate) fn resubmitted(&self, why: Resubmit) {
        self.0.resubmitted[why as usize].increment(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_outcome_label_has_a_series() {
        for l in ["ok", "error", "dead", "expired", "failed"] {
            assert_eq!(super::OUTCOMES[super::outcome_index(l)], l);
        }
        assert_eq!(super::outcome_index("something else"), 4);
    }

    #[test]
    fn every_resubmit_reason_has_its_series() {
        for (i, w) in super::Resubmit::ALL.iter().enumerate() {
            assert_eq!(*w as usize, i, "{}", w.label());
        }
    }
}
