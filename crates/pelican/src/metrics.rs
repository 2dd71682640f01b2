//! Every metric pelican records, through the `metrics` facade (install any recorder, e.g.
//! a Prometheus exporter, to see them). Names carry their unit; every series has a
//! `queue` label.

use metrics::{counter, histogram};
use std::time::Duration;

pub(crate) fn submitted(queue: &str, n: u64) {
    counter!("pelican_requests_submitted_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn joined(queue: &str, n: u64) {
    counter!("pelican_requests_joined_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn cached(queue: &str, n: u64) {
    counter!("pelican_requests_cached_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn resolved(queue: &str, outcome: &'static str, elapsed: Duration) {
    counter!("pelican_requests_resolved_total", "queue" => queue.to_string(), "outcome" => outcome)
        .increment(1);
    histogram!("pelican_request_duration_seconds", "queue" => queue.to_string())
        .record(elapsed.as_secs_f64());
}

pub(crate) fn completed(queue: &str, outcome: &'static str, n: u64) {
    counter!("pelican_deliveries_completed_total", "queue" => queue.to_string(), "outcome" => outcome)
        .increment(n);
}

pub(crate) fn handler_duration(queue: &str, elapsed: Duration) {
    histogram!("pelican_handler_duration_seconds", "queue" => queue.to_string())
        .record(elapsed.as_secs_f64());
}

pub(crate) fn redelivered(queue: &str, n: u64) {
    counter!("pelican_deliveries_redelivered_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn dead_lettered(queue: &str, n: u64) {
    counter!("pelican_dead_lettered_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn lease_lost(queue: &str, n: u64) {
    counter!("pelican_leases_lost_total", "queue" => queue.to_string()).increment(n);
}

pub(crate) fn duplicate_dropped(queue: &str, n: u64) {
    counter!("pelican_outcomes_dropped_total", "queue" => queue.to_string()).increment(n);
}
