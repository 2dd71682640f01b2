//! `pelican stats`: the queue at a glance.

use crate::cli::Global;
use crate::exit::{CliError, CliResult};
use crate::fmt::{age, duration_ms};
use pelican::admin::Stats;
use pelican::Admin;

/// In-flight requests listed in the text output (`--json` has them all).
const SHOW_IN_FLIGHT: usize = 10;

/// Prints the queue's statistics.
pub async fn run(g: &Global) -> CliResult {
    let queue = g.connectable().await?;
    let admin = Admin::connect(queue).await.map_err(|e| g.error(&e))?;
    let st = admin.stats().await.map_err(|e| g.error(&e))?;
    if g.json {
        let text = serde_json::to_string_pretty(&st)
            .map_err(|e| CliError::failure(format!("cannot encode the stats: {e}")))?;
        outln!("{text}");
    } else {
        out!("{}", render(&st, &g.redis.redacted()));
    }
    Ok(())
}

/// The human-readable form.
fn render(st: &Stats, url: &str) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<16}{v}\n"));
    line("queue", format!("{} on {url}", st.queue));
    line(
        "stream",
        format!(
            "{} entries ({} queued, {} pending), {} ever added",
            st.stream_length, st.queued, st.pending, st.entries_added
        ),
    );
    line(
        "pending",
        match st.oldest_pending_idle_ms {
            Some(ms) if st.pending > 0 => {
                format!("{}, oldest idle {}", st.pending, duration_ms(ms as f64))
            }
            _ => st.pending.to_string(),
        },
    );
    line("consumers", st.consumers.len().to_string());
    for c in &st.consumers {
        line(
            "",
            format!(
                "{}  pending {}  idle {}",
                c.name,
                c.pending,
                duration_ms(c.idle_ms as f64)
            ),
        );
    }
    line(
        "in flight",
        format!(
            "{} requests, {} waiting producers",
            st.in_flight.len(),
            st.waiting_producers
        ),
    );
    for f in st.in_flight.iter().take(SHOW_IN_FLIGHT) {
        line(
            "",
            format!(
                "{}  entry {}  deadline {}  waiters {}",
                f.rid,
                f.entry,
                age(f.deadline_ms),
                f.waiters.len()
            ),
        );
    }
    if st.in_flight.len() > SHOW_IN_FLIGHT {
        line(
            "",
            format!(
                "... {} more (--json lists all)",
                st.in_flight.len() - SHOW_IN_FLIGHT
            ),
        );
    }
    line("reply streams", st.reply_streams.to_string());
    line(
        "dead letters",
        if st.dead_letters > 0 {
            format!("{}  (see `pelican dead list`)", st.dead_letters)
        } else {
            "0".into()
        },
    );
    line("cached results", st.cached_results.to_string());
    if !st.partitions.is_empty() {
        line(
            "partitions",
            format!("{} (totals above; --json has each)", st.partitions.len()),
        );
        for p in &st.partitions {
            line(
                "",
                format!(
                    "#{}  queued {}  pending {}  added {}  dead {}",
                    p.partition.unwrap_or_default(),
                    p.queued,
                    p.pending,
                    p.entries_added,
                    p.dead_letters
                ),
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_an_empty_queue() {
        let mut st = pelican::admin::Stats::default();
        st.queue = "q".into();
        let text = super::render(&st, "redis://x:1");
        assert!(
            text.starts_with("queue           q on redis://x:1\n"),
            "{text}"
        );
        assert!(text.contains("dead letters    0\n"), "{text}");
    }
}
