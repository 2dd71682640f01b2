//! The consumer's slow loop: lease renewal and the janitor.

use super::lease::renew;
use super::state::ConsumerState;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Renews leases every `lease_interval` and runs the janitor when due.
pub(super) async fn run(inner: Arc<ConsumerState>) {
    let interval = inner.config.lease_interval();
    // The loop wakes at least once a second for the janitor; leases are renewed when due.
    let tick = interval.min(Duration::from_secs(1));
    let mut last_renewal = Instant::now();
    let mut last_janitor = Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::time::sleep(tick).await;
        if last_renewal.elapsed() + tick / 2 >= interval {
            last_renewal = Instant::now();
            if let Err(e) = renew(&inner.shared, &inner.name, &inner.leases).await {
                tracing::warn!(error = %format_args!("{e:#}"), "lease renewal failed");
            }
        }
        let sh = &inner.shared;
        if last_janitor.elapsed() >= sh.queue.janitor_interval {
            last_janitor = Instant::now();
            if let Err(e) = sh.janitor(&inner.name).await {
                tracing::debug!(error = %format_args!("{e:#}"), "janitor failed");
            }
        }
    }
}
