//! The waiters table: the requests a producer waits for, how an outcome reaches every
//! local waiter of a request, and when a request is submitted again or withdrawn.

use super::answers::AnswerJob;
use super::state::Inner;
use crate::clock::now_ms;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Resubmit;
use crate::protocol::outcome::Outcome;
use crate::FastMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Most times a request that expired before a local waiter's deadline is submitted again.
const MAX_EXPIRY_RESUBMITS: u8 = 3;
/// Time a local waiter must have left for an expired request to be submitted again.
const MIN_TIME_LEFT_MS: u64 = 50;

/// What a waiter is told: an outcome from Redis, or an error on the way.
pub(crate) type Resolution = std::result::Result<Outcome, Error>;

/// The requests this producer waits for, by request id.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) pending: FastMap<Arc<str>, Pending>,
}

pub(crate) struct Pending {
    pub(crate) waiters: Vec<(u64, oneshot::Sender<Resolution>)>,
    pub(crate) started: Instant,
    pub(crate) deadline_ms: u64,
    pub(crate) indexed: bool,
    /// The stream id, once known (needed to withdraw a request without an index).
    pub(crate) sid: Option<String>,
    /// Kept to submit again if Redis lost the request (restart without persistence);
    /// `None` while only watchers wait ([`crate::Producer::watch`]: they have no body).
    pub(crate) body: Option<Arc<Vec<u8>>>,
    /// The request stays queued when its last local waiter leaves: a waiter detached
    /// ([`crate::Ticket::detach`]) or watched it, so nobody here withdraws it.
    pub(crate) keep: bool,
    /// The submission has been acknowledged by Redis.
    pub(crate) queued: bool,
    /// Times this request was submitted again because it expired before a local waiter's
    /// deadline (see `Inner::resubmit_expired`).
    pub(crate) expiry_resubmits: u8,
    /// The submitting span's trace context (`tp`), written again with the request.
    pub(crate) tp: Option<String>,
    /// Times this request was submitted again because its stored answer was gone
    /// (`answers.rs`).
    pub(crate) lost_answers: u8,
    /// Its outcome came and names a stored answer, being fetched: the request is
    /// finished in Redis, not lost (the sweep of requests without an index).
    pub(crate) answer_fetching: bool,
}

impl Pending {
    /// Request `rid` (this one) as it was first submitted, to submit it again; `None`
    /// when no waiter here brought its body (watchers only).
    pub(crate) fn submit_again(&self, rid: &str) -> Option<SubmitJob> {
        Some(SubmitJob {
            rid: rid.into(),
            body: self.body.clone()?,
            deadline_ms: self.deadline_ms,
            indexed: self.indexed,
            tp: self.tp.clone(),
            ack: None,
        })
    }
}

pub(crate) struct SubmitJob {
    pub(crate) rid: Arc<str>,
    pub(crate) body: Arc<Vec<u8>>,
    pub(crate) deadline_ms: u64,
    pub(crate) indexed: bool,
    /// The entry's `tp` field: the submitting span's W3C trace context.
    pub(crate) tp: Option<String>,
    pub(crate) ack: Option<oneshot::Sender<Result<Submitted>>>,
}

pub(crate) struct CancelJob {
    pub(crate) rid: Arc<str>,
    pub(crate) sid: Option<String>,
}

/// How a submission was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Submitted {
    /// A new stream entry was added.
    Queued,
    /// An identical request was already in flight (here or in another producer); this
    /// submission waits for its outcome.
    Joined,
    /// The outcome of an identical request was still cached; no work was queued.
    Cached,
}

impl Inner {
    /// Hands an outcome to every local waiter of `rid`; a stored answer is fetched
    /// first (`answers.rs`). Without dedup, the stored answer of a request nobody here
    /// waits for goes to the fetcher too, which deletes it: this producer was its only
    /// reader (its call failed or gave up, or the request ran twice), and nothing caches
    /// it. With dedup it is the request's cached outcome, left to its ttl.
    pub(crate) fn resolve(&self, rid: &str, resolution: Resolution) {
        if let Ok(Outcome::Stored { len, name }) = resolution {
            let indexed = match self.state.lock().unwrap().pending.get_mut(rid) {
                Some(p) => {
                    p.answer_fetching = true;
                    p.indexed
                }
                None if !self.config.dedup => false,
                None => return,
            };
            let _ = self.answer_tx.send(AnswerJob {
                rid: rid.to_string(),
                len,
                name,
                indexed,
            });
            return;
        }
        if matches!(resolution, Ok(Outcome::Expired(_))) && self.resubmit_expired(rid) {
            return;
        }
        let pending = self.state.lock().unwrap().pending.remove(rid);
        let Some(p) = pending else { return };
        let label = match &resolution {
            Ok(o) => o.label(),
            Err(_) => "failed",
        };
        self.shared.metrics.resolved(label, p.started.elapsed());
        let mut waiters = p.waiters;
        let last = waiters.pop();
        for (_, w) in waiters {
            let _ = w.send(resolution.clone());
        }
        if let Some((_, w)) = last {
            let _ = w.send(resolution);
        }
    }

    /// An identical request in flight carries the deadline of whoever submitted it first;
    /// a later submitter with more time (here, or joined from another producer) would get
    /// "expired" although its own deadline has not passed. Such a request is submitted
    /// again with this producer's deadline instead (expiries are not cached, so it starts
    /// afresh, and the other producers' waiters join it). At most a few times, and only
    /// with time left to run it. Returns whether it was submitted again.
    pub(crate) fn resubmit_expired(&self, rid: &str) -> bool {
        let job = {
            let mut st = self.state.lock().unwrap();
            let Some(p) = st.pending.get_mut(rid) else {
                return false;
            };
            if !p.indexed
                || p.expiry_resubmits >= MAX_EXPIRY_RESUBMITS
                || p.deadline_ms < now_ms() + MIN_TIME_LEFT_MS
            {
                return false;
            }
            let Some(job) = p.submit_again(rid) else {
                return false;
            };
            p.expiry_resubmits += 1;
            p.queued = false;
            job
        };
        tracing::debug!(
            rid,
            "request expired before this producer's deadline; submitting it again"
        );
        let sent = self.submit_tx.send(job).is_ok();
        if sent {
            self.shared.metrics.resubmitted(Resubmit::Expired);
        }
        sent
    }

    /// Submits request `rid` again as it was first submitted (Redis lost it, or its
    /// answer), if it is still waited for; `why` is counted
    /// (`pelican_requests_resubmitted_total`) and `says` logged. It counts as not queued
    /// until Redis takes it again (a sweep meanwhile leaves it alone).
    pub(crate) fn resubmit(&self, rid: &str, why: Resubmit, says: &str) {
        let job = {
            let mut st = self.state.lock().unwrap();
            let Some(p) = st.pending.get_mut(rid) else {
                return;
            };
            p.queued = false;
            p.answer_fetching = false;
            p.submit_again(rid)
        };
        let Some(job) = job else {
            // Only watchers wait, without the body: it cannot be submitted again.
            self.resolve(
                rid,
                Err(Error::new(
                    ErrorKind::Expired,
                    format!("request {rid} is no longer known to Redis (lost in a restart?) and nobody here has its body to submit it again"),
                )),
            );
            return;
        };
        tracing::info!(rid, why = why.label(), "{says}");
        if self.submit_tx.send(job).is_ok() {
            self.shared.metrics.resubmitted(why);
        }
    }

    /// Resolves from a reply-stream pair, if this producer waits on that request.
    pub(crate) fn resolve_raw(&self, rid: &[u8], out: &[u8]) {
        let Ok(rid) = std::str::from_utf8(rid) else {
            return;
        };
        // Decoded before looking the request up: `resolve` looks it up once, where
        // checking first took the lock and hashed the id twice per reply.
        match Outcome::decode(out) {
            Some(o) => self.resolve(rid, Ok(o)),
            None if self.state.lock().unwrap().pending.contains_key(rid) => {
                tracing::warn!(rid, "ignoring a malformed reply")
            }
            None => {}
        }
    }

    /// A waiter gave up (timed out or dropped its ticket). The last one to leave
    /// withdraws the request, unless it is kept (detached or watched).
    pub(crate) fn drop_waiter(&self, rid: &str, token: u64) {
        let job = {
            let mut st = self.state.lock().unwrap();
            let Some(p) = st.pending.get_mut(rid) else {
                return;
            };
            p.waiters.retain(|(t, _)| *t != token);
            if !p.waiters.is_empty() {
                return;
            }
            let (rid, p) = st.pending.remove_entry(rid).expect("present");
            if p.keep {
                return;
            }
            CancelJob {
                rid,
                sid: if p.indexed { None } else { p.sid },
            }
        };
        let _ = self.cancel_tx.send(job);
    }

    /// A waiter stops waiting and leaves the request to run: it is never withdrawn by
    /// this producer from now on (its outcome is recorded as any other).
    pub(crate) fn detach_waiter(&self, rid: &str, token: u64) {
        let mut st = self.state.lock().unwrap();
        let Some(p) = st.pending.get_mut(rid) else {
            return;
        };
        p.waiters.retain(|(t, _)| *t != token);
        p.keep = true;
        if p.waiters.is_empty() {
            st.pending.remove(rid);
        }
    }
}
