//! What the worker processes report (ready, handled, exited), counted and shown: a crashed
//! worker is replaced, and the progress bar shows the counts.

use super::Demo;
use crate::exit::{CliError, CliResult};
use crate::pool::Event;
use std::sync::atomic::Ordering;

/// Replacement workers allowed beyond the crashes the demo causes.
const SPARE_RESTARTS: usize = 10;

impl Demo {
    /// Counts one event; replaces a worker that died (an error once they keep dying).
    pub(super) fn on_event(&mut self, ev: Event) -> CliResult {
        self.pool.observe(&ev);
        match ev {
            Event::Ready { slot, .. } => {
                if slot > self.args.workers as usize {
                    let pid = self.pool.get(slot).map(|w| w.pid).unwrap_or(0);
                    self.out.say(format!("worker {slot} (pid {pid}) is up"));
                }
            }
            Event::Handled { delivery, .. } => {
                self.seen.handled += 1;
                if delivery > 1 {
                    self.seen.recovered += 1;
                }
            }
            Event::Exited {
                slot,
                pid,
                status,
                stderr,
            } => {
                if self.stopping {
                    return Ok(());
                }
                let how = status
                    .map(|s| {
                        use std::os::unix::process::ExitStatusExt;
                        match s.signal() {
                            Some(sig) => crate::process::signal_name(sig),
                            None => s.to_string(),
                        }
                    })
                    .unwrap_or_else(|| "unknown status".into());
                if self.kill.victim.map(|k| k.0) == Some(slot) {
                    self.kill.gone = true;
                    self.out
                        .say(format!("worker {slot} (pid {pid}) is gone ({how})"));
                } else {
                    self.seen.crashes += 1;
                    let why = stderr
                        .iter()
                        .rev()
                        .find(|l| l.contains("crash-if"))
                        .or(stderr.last())
                        .map(|l| l.trim_start_matches("pelican worker: ").to_string())
                        .unwrap_or_default();
                    let why = why.split(';').next().unwrap_or_default();
                    self.out
                        .say(format!("worker {slot} (pid {pid}) crashed ({how}): {why}"));
                }
                let limit = self.args.workers as usize
                    + self.args.max_deliveries as usize
                    + 1
                    + SPARE_RESTARTS;
                if self.pool.started() >= limit {
                    return Err(CliError::failure(format!(
                        "worker processes keep dying; the last one said: {}",
                        stderr.join(" | ")
                    )));
                }
                let new = self.pool.spawn()?;
                self.out
                    .say(format!("started worker {new} in place of worker {slot}"));
            }
        }
        Ok(())
    }

    /// Shows the counts so far on the progress bar.
    pub(super) fn update_bar(&self) {
        let l = &self.load;
        let (live, ready) = self.pool.counts();
        self.out
            .bar
            .set_position(l.resolved.load(Ordering::Relaxed));
        self.out.bar.set_message(format!(
            "answered · new {} · joined {} · cached {} · handled {} · recovered {} · workers {ready}/{live}{}",
            l.queued.load(Ordering::Relaxed),
            l.joined.load(Ordering::Relaxed),
            l.cached.load(Ordering::Relaxed),
            self.seen.handled,
            self.seen.recovered,
            if self.seen.crashes > 0 {
                format!(" · crashes {}", self.seen.crashes)
            } else {
                String::new()
            }
        ));
    }
}
