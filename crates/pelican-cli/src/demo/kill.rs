//! The worker killed mid-run: the busiest one gets SIGKILL, and what it held when it died
//! is counted (its pending entries, before the others take them over).

use super::Demo;
use crate::exit::CliResult;

/// The worker killed on purpose.
#[derive(Debug, Default)]
pub(super) struct Kill {
    /// Its slot, and what it held (when killed, then when it died).
    pub(super) victim: Option<(usize, u64)>,
    /// Its consumer name, until its pending entries are counted after its death (exact:
    /// nobody takes them over before its leases run out).
    pub(super) count_held_of: Option<String>,
    /// Its exit has been seen and its pending entries are not counted yet.
    pub(super) gone: bool,
}

impl Demo {
    /// Kills the live worker that holds the most requests; true once done (or pointless).
    pub(super) async fn try_kill(&mut self) -> CliResult<bool> {
        let st = self.admin().stats().await.map_err(|e| self.error(&e))?;
        let best = st
            .consumers
            .iter()
            .filter_map(|c| self.pool.by_consumer(&c.name).map(|slot| (slot, c.pending)))
            .max_by_key(|(_, pending)| *pending);
        let Some((slot, held)) = best.filter(|(_, held)| *held > 0) else {
            return Ok(false);
        };
        let Some(w) = self.pool.get(slot).cloned() else {
            return Ok(false);
        };
        if !self.pool.signal(slot, libc::SIGKILL) {
            return Ok(false);
        }
        self.kill.victim = Some((slot, held));
        self.kill.count_held_of = w.consumer;
        self.out.say(format!(
            "killed worker {slot} (pid {}) with SIGKILL while it was busy; the other workers \
             take its requests over once its leases run out (claim idle {} ms)",
            w.pid, self.args.claim_idle
        ));
        Ok(true)
    }

    /// Counts what the killed worker held when it died: its pending entries, before
    /// anyone takes them over.
    pub(super) async fn count_held(&mut self) -> CliResult {
        self.kill.gone = false;
        let (Some(name), Some((slot, _))) = (self.kill.count_held_of.take(), self.kill.victim)
        else {
            return Ok(());
        };
        let st = self.admin().stats().await.map_err(|e| self.error(&e))?;
        if let Some(c) = st.consumers.iter().find(|c| c.name == name) {
            self.kill.victim = Some((slot, c.pending));
            self.out.say(format!(
                "worker {slot} died holding {} request{} (XPENDING)",
                c.pending,
                if c.pending == 1 { "" } else { "s" }
            ));
        }
        Ok(())
    }
}
