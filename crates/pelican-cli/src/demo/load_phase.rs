//! The load phase: the producers submit the load at a steady pace while the progress bar
//! runs; once a share of it is resolved, a worker is killed (see `kill`).

use super::load::{plan, produce, seed};
use super::Demo;
use crate::exit::CliResult;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long the producers take to submit the load (they pace themselves).
const LOAD_SPREAD: Duration = Duration::from_millis(2500);
/// The share of the load resolved when a worker is killed.
const KILL_AT: f64 = 0.35;

impl Demo {
    /// The producers submit the load; a worker is killed once a share of it is done.
    pub(super) async fn load_phase(&mut self) -> CliResult {
        let total = self.args.requests;
        let plans = plan(self.args.producers as usize, total as usize, seed());
        let per = plans.iter().map(Vec::len).max().unwrap_or(1).max(1) as u32;
        let interval = (LOAD_SPREAD / per).max(Duration::from_millis(1));
        for (p, plan) in self.producers.iter().zip(plans) {
            self.tasks.push(tokio::spawn(produce(
                p.clone(),
                plan,
                interval,
                self.load.clone(),
            )));
        }
        self.out.bar.set_length(total);
        self.out.bar.set_prefix("load");
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut kill_tried = false;
        loop {
            tokio::select! {
                Some(ev) = self.events.recv() => self.on_event(ev)?,
                _ = tick.tick() => {
                    self.update_bar();
                    let resolved = self.load.resolved.load(Ordering::Relaxed);
                    if !kill_tried && resolved as f64 >= total as f64 * KILL_AT {
                        kill_tried = self.try_kill().await?;
                    }
                    if self.kill.gone {
                        self.count_held().await?;
                    }
                    if resolved >= total {
                        break;
                    }
                }
            }
        }
        self.update_bar();
        if self.kill.victim.is_none() {
            self.out
                .say("no worker held any request when it was time to kill one; none was killed");
        }
        if let Some(e) = self.load.first_error.lock().unwrap().as_ref() {
            self.out.say(format!("a request failed: {e}"));
        }
        Ok(())
    }
}
