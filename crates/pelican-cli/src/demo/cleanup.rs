//! The end of every run, also after an error or Ctrl-C: stops what the demo started and
//! removes the demo queue's keys.

use super::Demo;
use std::time::{Duration, Instant};

/// How long workers get to stop gracefully at the end.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl Demo {
    /// Stops everything the demo started, in order: producers, workers (gracefully, then
    /// by force), the queue's keys.
    pub(super) async fn cleanup(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for p in self.producers.drain(..) {
            let _ = p.shutdown().await;
        }
        self.stopping = true;
        self.pool.signal_all(libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut forced = false;
        while self.pool.counts().0 > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(10)), self.events.recv())
                .await
            {
                Ok(Some(ev)) => {
                    let _ = self.on_event(ev);
                }
                Ok(None) => break,
                Err(_) if !forced => {
                    self.pool.signal_all(libc::SIGKILL);
                    forced = true;
                }
                Err(_) => break,
            }
            if forced && Instant::now() > deadline + Duration::from_secs(2) {
                break;
            }
        }
        self.out.bar.finish_and_clear();
        if let Some(admin) = &self.admin {
            if self.args.keep && !self.throwaway {
                self.out.say(format!(
                    "kept the demo queue: `pelican stats --queue {}`",
                    self.queue.name
                ));
            } else if let Err(e) = admin.destroy().await {
                self.out
                    .say(format!("could not remove the demo queue's keys: {e:#}"));
            }
        }
    }
}
