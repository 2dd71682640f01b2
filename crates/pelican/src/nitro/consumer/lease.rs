//! What a Nitro-format consumer holds, kept non-idle by the heartbeat (`nitro_renew.lua`,
//! owner-checked), and the handler cancellation that fires when an entry is lost.

use crate::clock::ms;
use crate::error::{Error, Result};
use crate::nitro::link::Link;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The entries a consumer holds, by entry id.
#[derive(Default)]
pub(super) struct Leases {
    held: Mutex<HashMap<String, Held>>,
    /// Held across a heartbeat and across a release: a heartbeat decided before a
    /// release must not land after it (it would undo the hand-back).
    pub(super) gate: tokio::sync::Mutex<()>,
}

struct Held {
    lease: CancellationToken,
    /// The body hash, with dedup: the heartbeat keeps the joiners of its job alive.
    hash: Option<String>,
    lost: bool,
    /// Its answer or release is on the way: the entry may leave the pending list before
    /// the writer reports back, and that is not a loss.
    finishing: bool,
}

impl Leases {
    /// Starts holding entry `id`; the token fires if it is lost.
    pub(super) fn hold(&self, id: &str, hash: Option<String>) -> CancellationToken {
        let lease = CancellationToken::new();
        self.held.lock().unwrap().insert(
            id.to_string(),
            Held {
                lease: lease.clone(),
                hash,
                lost: false,
                finishing: false,
            },
        );
        lease
    }

    /// Whether entry `id` is in work here (held, and not being answered or handed back).
    pub(super) fn in_work(&self, id: &str) -> bool {
        self.held
            .lock()
            .unwrap()
            .get(id)
            .is_some_and(|h| !h.finishing)
    }

    /// Its answer or release is on the way: no more heartbeats for it.
    pub(super) fn finishing(&self, id: &str) {
        if let Some(h) = self.held.lock().unwrap().get_mut(id) {
            h.finishing = true;
        }
    }

    /// The writer is done with it. An entry held again meanwhile (handed back, then
    /// taken over by this consumer again) is a new delivery and stays.
    pub(super) fn forget(&self, id: &str) {
        let mut held = self.held.lock().unwrap();
        if held.get(id).is_some_and(|h| h.finishing) {
            held.remove(id);
        }
    }

    /// Tells every handler to stop (shutdown past its timeout).
    pub(super) fn cancel_all(&self) {
        for h in self.held.lock().unwrap().values() {
            h.lease.cancel();
        }
    }
}

/// One heartbeat for everything `name` holds (one script call), cancelling the handlers
/// of the entries it lost.
pub(super) async fn renew(
    link: &Link,
    name: &str,
    job_ttl: Duration,
    leases: &Leases,
) -> Result<()> {
    let _gate = leases.gate.lock().await;
    let held: Vec<(String, String)> = leases
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost && !h.finishing)
        .map(|(id, h)| (id.clone(), h.hash.clone().unwrap_or_default()))
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    let k = &link.keys;
    let mut inv = link.scripts.renew.prepare_invoke();
    inv.key(&k.stream)
        .key(&k.job_prefix)
        .arg(k.group())
        .arg(name)
        .arg(ms(job_ttl));
    for (id, hash) in &held {
        inv.arg(id).arg(hash);
    }
    let lost: Vec<String> = inv
        .invoke_async(&mut link.conn())
        .await
        .map_err(|e| Error::redis("keeping entries non-idle (heartbeat)", e))?;
    if !lost.is_empty() {
        let mut held = leases.held.lock().unwrap();
        let mut n = 0;
        for id in lost {
            if let Some(h) = held.get_mut(&id).filter(|h| !h.finishing) {
                h.lost = true;
                h.lease.cancel();
                n += 1;
                tracing::warn!(entry = %id, consumer = %name, "entry lost: another consumer took it over, or it was answered or withdrawn");
            }
        }
        link.metrics.lease_lost(n);
    }
    Ok(())
}
