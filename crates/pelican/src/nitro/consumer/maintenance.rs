//! The consumer's slow loop: heartbeats, and removing consumers of the group that are
//! long gone.

use super::lease::renew;
use super::state::ConsumerState;
use crate::clock::ms;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest pause between two removals of gone consumers.
const GC_EVERY: Duration = Duration::from_secs(60);

/// Beats every `heartbeat_interval`; removes gone consumers now and then.
pub(super) async fn run(st: Arc<ConsumerState>) {
    let interval = st.config.heartbeat_interval();
    let tick = interval.min(Duration::from_secs(1));
    let gc_every = GC_EVERY.min(st.config.consumer_gc_after);
    let mut last_beat = Instant::now();
    let mut last_gc = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        if last_beat.elapsed() + tick / 2 >= interval {
            last_beat = Instant::now();
            if let Err(e) = renew(&st.link, &st.name, st.config.job_ttl(), &st.leases).await {
                tracing::warn!(error = %format_args!("{e:#}"), "heartbeat failed");
            }
        }
        if last_gc.elapsed() >= gc_every {
            last_gc = Instant::now();
            let link = &st.link;
            // Another process's removal may have taken this (empty, idle) consumer out.
            link.register(&st.name).await;
            let r: redis::RedisResult<i64> = link
                .scripts
                .gc
                .key(&link.keys.stream)
                .arg(link.keys.group())
                .arg(ms(st.config.consumer_gc_after))
                .arg(&st.name)
                .invoke_async(&mut link.conn())
                .await;
            match r {
                Ok(n) if n > 0 => tracing::debug!(removed = n, "removed gone consumers"),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %format_args!("{e:#}"), "removing gone consumers failed")
                }
            }
        }
    }
}
