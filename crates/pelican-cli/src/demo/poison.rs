//! The poison phase: one request that crashes every worker that takes it, submitted by two
//! producers (one stream entry: dedup), until it is dead-lettered and both callers get
//! `Dead`.

use super::Demo;
use crate::exit::{CliError, CliResult};
use pelican::ErrorKind;
use serde_json::json;
use std::time::Duration;

/// How long the poison may take to be dead-lettered.
const POISON_TIMEOUT: Duration = Duration::from_secs(60);

impl Demo {
    /// Two producers submit the same poison request; both must get Dead. Returns the
    /// dead letter's delivery count and how many callers got Dead.
    pub(super) async fn poison_phase(&mut self) -> CliResult<(u64, u64)> {
        let poison = json!({"task": "poison", "poison": true});
        self.out.say(
            "submitting a poison request from two producers (one stream entry: dedup); every \
             worker that takes it crashes",
        );
        self.out.bar.set_prefix("poison");
        let a = self.producers[0].clone();
        let b = self.producers[1 % self.producers.len()].clone();
        let t1 = a.submit(&poison).await.map_err(|e| self.error(&e))?;
        let t2 = b.submit(&poison).await.map_err(|e| self.error(&e))?;
        self.load.submitted(t1.submitted());
        self.load.submitted(t2.submitted());
        let waiter = tokio::spawn(async move { (t1.await, t2.await) });
        tokio::pin!(waiter);
        let deadline = tokio::time::sleep(POISON_TIMEOUT);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let (r1, r2) = loop {
            tokio::select! {
                Some(ev) = self.events.recv() => self.on_event(ev)?,
                _ = tick.tick() => self.update_bar(),
                r = &mut waiter => break r.map_err(|e| CliError::failure(format!("poison waiter: {e}")))?,
                _ = &mut deadline => return Err(CliError::failure(format!(
                    "the poison request was not dead-lettered within {POISON_TIMEOUT:?}; look \
                     at `pelican stats --queue {}`", self.queue.name
                ))),
            }
        };
        let mut dead_callers = 0;
        for r in [&r1, &r2] {
            match r {
                Err(e) if e.kind() == ErrorKind::Dead => dead_callers += 1,
                Err(e) => self.out.say(format!("a poison caller got: {e:#}")),
                Ok(v) => self
                    .out
                    .say(format!("a poison caller got a response?! {v}")),
            }
        }
        if let Err(e) = &r1 {
            self.out.say(format!("both callers got: {e:#}"));
        }
        let letters = self
            .admin()
            .dead_letters(100)
            .await
            .map_err(|e| self.error(&e))?;
        let deliveries = letters
            .iter()
            .find(|d| d.body_preview.contains("poison"))
            .map(|d| d.deliveries)
            .unwrap_or(0);
        Ok((deliveries, dead_callers))
    }
}
