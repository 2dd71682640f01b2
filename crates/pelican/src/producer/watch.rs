//! Waiting on a request by its id without submitting it ([`Producer::watch`]): a caller
//! that comes back for the answer to a request submitted earlier (detached, by this
//! process or another). `watch.lua` reads the request's index: its recorded outcome, or
//! it adds this producer to the waiters of a request in flight.

use super::pending::Pending;
use super::state::Inner;
use super::ticket::{Ticket, WaiterGuard};
use super::{Producer, Submitted};
use crate::clock::{ms, now_ms};
use crate::codec::Codec;
use crate::config::validate_request_id;
use crate::conn::retry::retry_idempotent;
use crate::error::{Error, Result};
use crate::protocol::scripts::{Watch, WatchAnswer};
use serde::{de::DeserializeOwned, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

impl<Req, Resp, C> Producer<Req, Resp, C>
where
    Req: Serialize,
    Resp: DeserializeOwned,
    C: Codec,
{
    /// Waits on request `request_id` without submitting it: a ticket that resolves with
    /// its outcome (at once when it is finished and its outcome still recorded, a
    /// failure too), or `None` when Redis knows nothing of it (never submitted, finished
    /// more than `result_ttl` ago, expired, or submitted with dedup off: without an index
    /// there is nothing to look up). The ticket gives up after `wait`
    /// ([`crate::ErrorKind::Timeout`]); giving up, or dropping it, never withdraws the
    /// request. [`Ticket::submitted`] says `Cached` for a finished request, `Joined` for
    /// one in flight.
    pub async fn watch(&self, request_id: &str, wait: Duration) -> Result<Option<Ticket<Resp, C>>> {
        validate_request_id(request_id)?;
        if wait.is_zero() {
            return Err(Error::config("a watch's wait must be more than zero"));
        }
        let rid: Arc<str> = request_id.into();
        let inner = self.part(&rid);
        if inner.closed.load(Ordering::SeqCst) {
            return Err(inner.closed_error());
        }
        let started = Instant::now();
        let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        // Registered before Redis is asked, as a submission is: an outcome pushed right
        // after the script adds this producer to the waiters finds its waiter here.
        let mut guard = WaiterGuard::new(inner.clone(), rid.clone(), token);
        let in_flight_here = register(inner, &rid, token, tx, started, now_ms() + ms(wait));
        let how = if in_flight_here {
            // This producer waits for it already (submitted or watched here): its
            // outcome comes to this producer's reply stream.
            Submitted::Joined
        } else {
            let sh = &inner.shared;
            let call = Watch {
                rid: &rid,
                producer: &inner.id,
            }
            .call(&sh.scripts);
            let call = &call;
            // Idempotent: a second run finds this producer among the waiters already.
            let found = retry_idempotent(move || async move { call.invoke(&mut sh.conn()).await })
                .await
                .map_err(|e| Error::redis("looking up a request", e))?;
            match found {
                WatchAnswer::Finished(outcome) => {
                    inner.resolve(&rid, Ok(outcome));
                    Submitted::Cached
                }
                WatchAnswer::Joined => {
                    if let Some(p) = inner.state.lock().unwrap().pending.get_mut(&rid) {
                        p.queued = true;
                    }
                    Submitted::Joined
                }
                WatchAnswer::Unknown => {
                    guard.disarm();
                    unknown(inner, &rid, token);
                    return Ok(None);
                }
            }
        };
        let ticket = Ticket::new(inner.clone(), rid, token, how, rx, started, wait);
        guard.disarm();
        Ok(Some(ticket))
    }
}

/// Adds a watcher of `rid` to the waiters table; returns whether this producer waits for
/// it in Redis already (its request in flight here, acknowledged by Redis).
fn register(
    inner: &Arc<Inner>,
    rid: &Arc<str>,
    token: u64,
    tx: oneshot::Sender<super::pending::Resolution>,
    started: Instant,
    deadline_ms: u64,
) -> bool {
    let mut st = inner.state.lock().unwrap();
    if let Some(p) = st.pending.get_mut(rid) {
        p.waiters.push((token, tx));
        p.deadline_ms = p.deadline_ms.max(deadline_ms);
        // Watched: never withdrawn by this producer.
        p.keep = true;
        return p.queued && p.indexed;
    }
    st.pending.insert(
        rid.clone(),
        Pending {
            waiters: vec![(token, tx)],
            started,
            deadline_ms,
            indexed: true,
            sid: None,
            body: None,
            keep: true,
            queued: false,
            expiry_resubmits: 0,
            tp: None,
            lost_answers: 0,
            answer_fetching: false,
        },
    );
    false
}

/// Redis does not know `rid`: this watcher leaves (a submitter of this process that came
/// meanwhile submits its request itself: see `Producer::submit_body`).
fn unknown(inner: &Inner, rid: &str, token: u64) {
    let mut st = inner.state.lock().unwrap();
    let Some(p) = st.pending.get_mut(rid) else {
        return;
    };
    p.waiters.retain(|(t, _)| *t != token);
    if p.waiters.is_empty() {
        st.pending.remove(rid);
    }
}
