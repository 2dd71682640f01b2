//! The consumer's slow loop: lease renewal and the wire's upkeep (pelican's janitor,
//! Nitro's removal of gone consumers).

use super::lease::renew;
use super::state::State;
use super::wire::Wire;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Renews leases every `lease_interval` and runs the upkeep when due.
pub(crate) async fn run<W: Wire>(st: Arc<State<W>>) {
    let interval = st.settings.lease_interval;
    let upkeep = st.wire.upkeep_interval();
    // The loop wakes at least once a second for the upkeep; leases are renewed when due.
    let tick = interval.min(Duration::from_secs(1));
    let mut last_renewal = Instant::now();
    let mut last_upkeep: Option<Instant> = None;
    loop {
        tokio::time::sleep(tick).await;
        if last_renewal.elapsed() + tick / 2 >= interval {
            last_renewal = Instant::now();
            if let Err(e) = renew(&*st.wire, &st.name, &st.leases).await {
                tracing::warn!(error = %format_args!("{e:#}"), "lease renewal failed");
            }
        }
        if last_upkeep.is_none_or(|at| at.elapsed() >= upkeep) {
            last_upkeep = Some(Instant::now());
            st.wire.upkeep(&st.name).await;
        }
    }
}
