//! A `metrics` recorder for the suite: every counter pelican registers, readable by name
//! and labels. Installed once for the whole test binary (a recorder is global, and a
//! queue's series are registered when it connects, so a test calls [`counter`] or
//! [`install_counters`] before connecting). Every test's queue has a name of its own, so
//! the `queue` label keeps the tests' counts apart.

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Once};

#[derive(Default)]
struct Counters(Mutex<HashMap<Key, Arc<AtomicU64>>>);

impl Counters {
    fn get(&self, key: &Key) -> Arc<AtomicU64> {
        self.0
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone()
    }
}

/// Counts counters; gauges and histograms go nowhere.
struct CountingRecorder(&'static Counters);

impl Recorder for CountingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.get(key))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn counters() -> &'static Counters {
    static COUNTERS: LazyLock<Counters> = LazyLock::new(Counters::default);
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        metrics::set_global_recorder(CountingRecorder(&COUNTERS))
            .expect("no other metrics recorder in this test binary");
    });
    &COUNTERS
}

/// Installs the suite's recorder if it is not yet: call before connecting.
pub fn install_counters() {
    counters();
}

/// The value of counter `name` with exactly these labels (0 if never registered).
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(k.to_string(), v.to_string()))
        .collect();
    let key = Key::from_parts(name.to_string(), labels);
    counters().get(&key).load(Ordering::Relaxed)
}

/// `pelican_requests_resubmitted_total` of queue `queue` for reason `why`.
pub fn resubmitted(queue: &str, why: &str) -> u64 {
    counter(
        "pelican_requests_resubmitted_total",
        &[("queue", queue), ("why", why)],
    )
}
