//! Leases: what a consumer holds, kept alive by renewal (owner-checked: pelican's
//! `renew.lua`, Nitro's heartbeat), and the handler cancellation that fires when one is
//! lost.

use super::wire::Wire;
use crate::conn::retry::retry_idempotent;
use crate::error::{Error, Result};
use crate::FastMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The entries a consumer holds, by stream id.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<FastMap<Arc<str>, Held>>,
    /// Held across a lease renewal and across a release: a renewal (`XCLAIM JUSTID`,
    /// idle back to 0) that was decided before an entry was released must not land after
    /// the release (`XCLAIM IDLE`), or the released entry waits a whole claim_idle.
    pub(crate) gate: tokio::sync::Mutex<()>,
}

struct Held {
    lease: CancellationToken,
    /// Renewed and answered with the entry (Nitro's body hash, with dedup).
    tag: Option<Arc<str>>,
    lost: bool,
    /// Its outcome or release has been handed to the writer: the entry may stop being
    /// pending before the writer reports back, and that is not a lost lease.
    finishing: bool,
}

impl Leases {
    /// Starts holding entry `sid`; the token fires if its lease is lost.
    pub(crate) fn hold(&self, sid: &Arc<str>, tag: Option<Arc<str>>) -> CancellationToken {
        let lease = CancellationToken::new();
        self.held.lock().unwrap().insert(
            sid.clone(),
            Held {
                lease: lease.clone(),
                tag,
                lost: false,
                finishing: false,
            },
        );
        lease
    }

    /// Whether entry `sid` is in work here (held, its outcome or release not on the way).
    pub(crate) fn in_work(&self, sid: &str) -> bool {
        self.held
            .lock()
            .unwrap()
            .get(sid)
            .is_some_and(|h| !h.finishing)
    }

    /// Its outcome or release is on the way: renew it no more.
    pub(crate) fn finishing(&self, sid: &str) {
        if let Some(h) = self.held.lock().unwrap().get_mut(sid) {
            h.finishing = true;
        }
    }

    /// The writer is done with `sids`. An entry held again meanwhile (released, then
    /// taken again by this consumer) is a new delivery and stays.
    pub(crate) fn forget<'a>(&self, sids: impl IntoIterator<Item = &'a Arc<str>>) {
        let mut held = self.held.lock().unwrap();
        for sid in sids {
            // One lookup for the common case (still the one finished); one held again
            // meanwhile goes back.
            if let Some((sid, h)) = held.remove_entry(sid) {
                if !h.finishing {
                    held.insert(sid, h);
                }
            }
        }
    }

    /// Cancels every handler (shutdown past its timeout).
    pub(crate) fn cancel_all(&self) {
        for h in self.held.lock().unwrap().values() {
            h.lease.cancel();
        }
    }
}

/// Renews the leases of what `name` holds (one call for all of them, retried: renewing
/// twice renews twice) and cancels the handlers of the ones it lost.
pub(crate) async fn renew<W: Wire>(wire: &W, name: &str, leases: &Leases) -> Result<()> {
    let _gate = leases.gate.lock().await;
    // Entries being finished or released need no lease any more (and a released one
    // must not get one).
    let held: Vec<(Arc<str>, Option<Arc<str>>)> = leases
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost && !h.finishing)
        .map(|(sid, h)| (sid.clone(), h.tag.clone()))
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    let held = &held;
    let lost = retry_idempotent(move || async move { wire.renew(name, held).await })
        .await
        .map_err(|e| Error::redis("renewing leases", e))?;
    if !lost.is_empty() {
        let mut held = leases.held.lock().unwrap();
        let mut n = 0;
        for sid in lost {
            if let Some(h) = held.get_mut(sid.as_str()).filter(|h| !h.finishing) {
                h.lost = true;
                h.lease.cancel();
                n += 1;
                tracing::warn!(entry = %sid, consumer = %name, "lease lost: another consumer took the request over, or it was answered elsewhere or withdrawn");
            }
        }
        wire.place().metrics.lease_lost(n);
    }
    Ok(())
}
