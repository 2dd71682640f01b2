//! Turning what the reader read or claimed into deliveries: each entry as the wire admits
//! it (a delivery, an answer written at once, a dead letter; with Nitro's dedup, the
//! entries let through solve, join or are answered from the cache), each delivery with a
//! prefetch slot and a lease, handed to the handlers.

use super::delivery::{Delivery, LeaseLost};
use super::state::{Hand, State};
use super::wire::{Admit, Verdict, Wire};
use super::writer::{Completion, Release, WriteJob};
use crate::clock::ms;
use crate::protocol::entry::RawEntry;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// An entry let through, waiting for the dedup verdict.
struct Ready<W: Wire, Req> {
    sid: Arc<str>,
    req: Req,
    admitted: W::Admitted,
    tag: Option<Arc<str>>,
    deliveries: u32,
    permit: OwnedSemaphorePermit,
}

/// Turns entries read or claimed (with their delivery counts) into deliveries, answers
/// written at once or dead letters, as the wire admits them, each with a slot of
/// `permits`. `solo`: the entry claimed for its last delivery; it is handed out only once
/// every other delivery in hand has been answered, and holds every slot until it is
/// answered itself.
pub(super) async fn admit_all<W, Req>(
    inner: &State<W>,
    tx: &mpsc::Sender<Delivery<W, Req>>,
    entries: Vec<(RawEntry, u32)>,
    solo: Option<&str>,
    permits: &mut Hand,
    parse: &mut W::ReadState,
) where
    W: Wire,
    Req: DeserializeOwned + Send + 'static,
{
    let wire = &*inner.wire;
    let joins = wire.joins();
    let mut ready = Vec::new();
    for (e, deliveries) in entries {
        let alone = solo == Some(&*e.id);
        let permit = if alone {
            permits.take_all()
        } else {
            permits.take_one()
        }
        .expect("read or claimed at most the free slots");
        let sid = e.id.clone();
        if deliveries > 1 && inner.leases.in_work(&sid) {
            // Its own entry, in work, taken over from itself because a renewal came
            // late: the takeover reset its idle time; the work goes on as it was.
            tracing::debug!(entry = %sid, "took over an entry already in hand");
            continue;
        }
        match wire.admit::<Req>(e, deliveries, parse) {
            Admit::Handle { req, admitted, tag } if joins => ready.push(Ready::<W, Req> {
                sid,
                req,
                admitted,
                tag,
                deliveries,
                permit,
            }),
            Admit::Handle { req, admitted, tag } => {
                let lease = inner.leases.hold(&sid, tag);
                let job = wire.job(admitted, sid, deliveries, LeaseLost(lease));
                deliver(inner, tx, req, job, permit, alone).await;
            }
            Admit::Answer(finish) => inner.writer.send(WriteJob::Complete(Completion {
                sid,
                finish,
                ack: None,
                slot: None,
            })),
            Admit::Reject(reason) => wire.reject(&inner.name, &sid, &reason, deliveries).await,
        }
    }
    if ready.is_empty() {
        return;
    }
    let pairs: Vec<(Arc<str>, Option<Arc<str>>)> = ready
        .iter()
        .map(|r| (r.sid.clone(), r.tag.clone()))
        .collect();
    match wire.join(&inner.name, &pairs).await {
        Ok(verdicts) if verdicts.len() == ready.len() => {
            let m = &wire.place().metrics;
            for (r, v) in ready.into_iter().zip(verdicts) {
                match v {
                    Verdict::Solve => {
                        let alone = solo == Some(&*r.sid);
                        let lease = inner.leases.hold(&r.sid, r.tag);
                        let job = wire.job(r.admitted, r.sid, r.deliveries, LeaseLost(lease));
                        deliver(inner, tx, r.req, job, r.permit, alone).await;
                    }
                    Verdict::Joined => m.joined(1),
                    Verdict::Cached => m.cached(1),
                    Verdict::Gone => {}
                }
            }
        }
        r => {
            match r {
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "dedup failed; releasing the entries")
                }
                Ok(_) => {
                    tracing::warn!("dedup answered for other entries than asked; releasing them")
                }
            }
            let idle_ms = ms(inner.settings.claim_idle);
            for r in ready {
                inner.writer.send(WriteJob::Release(Release {
                    sid: r.sid,
                    idle_ms,
                    ack: None,
                    slot: None,
                }));
            }
        }
    }
}

/// Hands one entry let through, held now (`job`), to the handlers. `alone`: see
/// [`admit_all`].
async fn deliver<W, Req>(
    inner: &State<W>,
    tx: &mpsc::Sender<Delivery<W, Req>>,
    req: Req,
    job: W::Job,
    mut permit: OwnedSemaphorePermit,
    alone: bool,
) where
    W: Wire,
    Req: Send + 'static,
{
    if alone {
        // Held (so its lease is renewed) while the work in hand drains.
        let missing = inner.settings.prefetch.saturating_sub(permit.num_permits());
        if missing > 0 {
            tokio::select! {
                rest = inner.slots.clone().acquire_many_owned(missing as u32) => {
                    permit.merge(rest.expect("never closed"));
                }
                _ = inner.stop.cancelled() => {}
            }
        }
    }
    let d = Delivery::new(inner.writer.clone(), req, job, permit);
    // The channel holds as many as there are slots: there is room (no wait) unless the
    // consumer stops.
    let d = match tx.try_send(d) {
        Ok(()) => return,
        Err(mpsc::error::TrySendError::Full(d)) => d,
        Err(mpsc::error::TrySendError::Closed(d)) => return drop(d),
    };
    if let Err(mpsc::error::SendError(d)) = tx.send(d).await {
        // Nobody takes deliveries any more (stopping): dropping it releases it.
        drop(d);
    }
}
