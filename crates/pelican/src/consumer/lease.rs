//! Leases: what a consumer holds, kept alive by renewal (`renew.lua`, owner-checked),
//! and the handler cancellation that fires when one is lost.

use crate::conn::retry::retry_idempotent;
use crate::error::{Error, Result};
use crate::protocol::scripts::Renew;
use crate::shared::Shared;
use crate::FastMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The entries a consumer holds, by stream id.
#[derive(Default)]
pub(crate) struct Leases {
    pub(super) held: Mutex<FastMap<Arc<str>, Held>>,
    /// Held across a lease renewal and across a release: a renewal (`XCLAIM JUSTID`,
    /// idle back to 0) that was decided before an entry was released must not land after
    /// the release (`XCLAIM IDLE`), or the released entry waits a whole claim_idle.
    pub(super) gate: tokio::sync::Mutex<()>,
}

pub(super) struct Held {
    lease: CancellationToken,
    lost: bool,
    /// Its outcome or release has been handed to the writer: the entry may stop being
    /// pending before the writer reports back, and that is not a lost lease.
    finishing: bool,
}

impl Leases {
    /// Starts holding entry `sid`; the token fires if its lease is lost.
    pub(super) fn hold(&self, sid: &Arc<str>) -> CancellationToken {
        let lease = CancellationToken::new();
        self.held.lock().unwrap().insert(
            sid.clone(),
            Held {
                lease: lease.clone(),
                lost: false,
                finishing: false,
            },
        );
        lease
    }

    /// Its outcome or release is on the way: renew it no more.
    pub(crate) fn finishing(&self, sid: &str) {
        if let Some(h) = self.held.lock().unwrap().get_mut(sid) {
            h.finishing = true;
        }
    }

    /// Cancels every handler (shutdown past its timeout).
    pub(super) fn cancel_all(&self) {
        for h in self.held.lock().unwrap().values() {
            h.lease.cancel();
        }
    }
}

/// Renews the leases of what `name` holds (one script call for all of them) and
/// cancels the handlers of the ones it lost.
pub(super) async fn renew(sh: &Shared, name: &str, leases: &Leases) -> Result<()> {
    let _gate = leases.gate.lock().await;
    // Entries being finished or released need no lease any more (and a released one
    // must not get one).
    let ids: Vec<Arc<str>> = leases
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost && !h.finishing)
        .map(|(sid, _)| sid.clone())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    // Idempotent: renewing a lease twice renews it twice.
    let call = &Renew { consumer: name }.call(&sh.scripts, ids.iter().map(|s| &**s));
    let lost = retry_idempotent(move || async move { call.invoke(&mut sh.conn()).await })
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
                tracing::warn!(entry = %sid, consumer = %name, "lease lost: another consumer took the request over or it was withdrawn");
            }
        }
        sh.metrics.lease_lost(n);
    }
    Ok(())
}
