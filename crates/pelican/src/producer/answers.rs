//! Stored answers (docs/PROTOCOL.md, "Stored answers"): a response of `STORED_ANSWER_MIN`
//! bytes or more reaches the producer as an outcome that names where it is stored, from
//! the reply stream, the sweep or a cached outcome alike. [`Inner::resolve`] hands such an
//! outcome here; the fetcher reads the answers with `MGET` (split over a few lean
//! connections when they are large, as the consumer's reader splits its reads), resolves
//! the waiters, and deletes what nothing caches (dedup off: one waiter, no index).

use super::lean::query;
use super::state::Inner;
use crate::clock::now_ms;
use crate::conn::cluster::worth_sending_again;
use crate::conn::retry::Backoff;
use crate::error::{Error, ErrorKind};
use crate::metrics::Resubmit;
use crate::protocol::outcome::Outcome;
use crate::protocol::scripts::Forget;
use crate::protocol::stored;
use futures_util::future::join_all;
use redis::RedisResult;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most times a request whose stored answer was gone is submitted again.
const MAX_LOST: u8 = 2;
/// Most answers fetched in one round.
const MAX_ROUND: usize = 256;
/// A round takes no more answers once they reach this many bytes (one large answer still
/// goes alone): 16 MiB answers are fetched a few at a time, each waiter resolved as its
/// part arrives, not after hundreds of megabytes.
const MAX_ROUND_BYTES: usize = 8 << 20;

/// A stored answer to fetch for request `rid`.
#[derive(Debug, Clone)]
pub(crate) struct AnswerJob {
    pub(crate) rid: String,
    /// Its length, as the outcome says (how a round is split).
    pub(crate) len: usize,
    /// Its name under the queue's body prefix.
    pub(crate) name: String,
    /// Whether the request has an index (dedup on): the outcome is cached, and the answer
    /// stays for the other waiters and later submitters until its ttl.
    pub(crate) indexed: bool,
}

/// Fetches the answers handed to it and resolves their waiters. A round that fails (a
/// dropped connection, Redis down) is tried again with backoff, for as long as the
/// requests are waited for (a waiter's timeout ends the wait).
pub(super) async fn fetcher(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<AnswerJob>) {
    let mut jobs: Vec<AnswerJob> = Vec::new();
    let mut backoff = Backoff::new();
    let mut undeleted = Undeleted::default();
    loop {
        if jobs.is_empty() {
            let got = match undeleted.due_in() {
                None => rx.recv_many(&mut jobs, MAX_ROUND).await,
                // Answers read whose DEL was refused are tried again in a while, or
                // with the next round, whichever comes first.
                Some(wait) => tokio::time::timeout(wait, rx.recv_many(&mut jobs, MAX_ROUND))
                    .await
                    .unwrap_or(usize::MAX),
            };
            if got == 0 {
                return;
            }
        }
        undeleted.retry(&inner).await;
        while jobs.len() < MAX_ROUND {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        // Those still waited for, once each (the reply and a sweep may both name one).
        let mut unread = Vec::new();
        {
            let st = inner.state.lock().unwrap();
            let mut seen = HashSet::new();
            jobs.retain(|j| {
                let wanted = st.pending.contains_key(j.rid.as_str()) && seen.insert(j.rid.clone());
                if !wanted && !j.indexed {
                    unread.push(j.name.clone());
                }
                wanted
            });
        }
        if let Err(keys) = delete_unread(&inner, unread, &jobs).await {
            undeleted.add(keys);
        }
        if jobs.is_empty() {
            continue;
        }
        // What does not fit this round waits for the next.
        let later = jobs.split_off(fitting(&jobs));
        let parts = split(&jobs);
        let results = join_all(parts.iter().map(|p| fetch(&inner, p))).await;
        let mut again = Vec::new();
        let mut failure = None;
        for (part, r) in parts.into_iter().zip(results) {
            match r {
                Ok(values) => {
                    let read: Vec<String> = part
                        .iter()
                        .zip(&values)
                        .filter(|(j, v)| !j.indexed && v.is_some())
                        .map(|(j, _)| inner.shared.keys.body(&j.name))
                        .collect();
                    for (j, v) in part.iter().zip(values) {
                        match v {
                            Some(body) => inner.resolve(&j.rid, Ok(Outcome::Ok(body))),
                            None => lost(&inner, j).await,
                        }
                    }
                    if let Err(keys) = delete_read(&inner, read).await {
                        undeleted.add(keys);
                    }
                }
                Err(e) => {
                    again.extend(part.iter().map(|j| (*j).clone()));
                    failure = Some(e);
                }
            }
        }
        jobs = again;
        jobs.extend(later);
        match failure {
            Some(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), n = jobs.len(), "fetching stored answers failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
            None => backoff.reset(),
        }
    }
}

/// How many of `jobs`, from the first, fit in a round of `MAX_ROUND_BYTES` (one at
/// least).
fn fitting(jobs: &[AnswerJob]) -> usize {
    let mut bytes = 0;
    jobs.iter()
        .position(|j| {
            bytes += j.len;
            bytes > MAX_ROUND_BYTES
        })
        .map_or(jobs.len(), |i| i.max(1))
}

/// Splits a round into parts as the consumer splits its reads
/// ([`crate::conn::split_parts`]), of about equal bytes.
fn split(jobs: &[AnswerJob]) -> Vec<Vec<&AnswerJob>> {
    let total: usize = jobs.iter().map(|j| j.len).sum();
    let parts = crate::conn::split_parts(jobs.len(), total);
    let per = total.div_ceil(parts);
    let mut out: Vec<Vec<&AnswerJob>> = vec![Vec::new()];
    let mut bytes = 0;
    for j in jobs {
        if bytes >= per && out.len() < parts {
            out.push(Vec::new());
            bytes = 0;
        }
        out.last_mut().expect("one part at least").push(j);
        bytes += j.len;
    }
    out
}

/// `MGET` of the answers of `part`, on a lean connection of the producer's pool (or the
/// shared connection when the queue's are not lean ones).
async fn fetch(inner: &Inner, part: &[&AnswerJob]) -> RedisResult<Vec<Option<Vec<u8>>>> {
    let mut cmd = redis::cmd("MGET");
    for j in part {
        cmd.arg(inner.shared.keys.body(&j.name));
    }
    let reply = query(inner, &cmd).await?;
    Ok(stored::mget_values(reply))
}

/// Deletes the answers of `names` that no waiter will read: without dedup, an answer is
/// read by the one producer it is pushed to, and cached nowhere. Such an outcome is one
/// of a request this producer no longer waits for (its call failed, its submission cut
/// off after Redis had queued it; or it gave up), or a second outcome of one it does
/// (run twice after a failover lost the first completion). Left, they would stay for
/// the result ttl and a minute. Only names of stored answers (`a<sid>.<token>.<n>`: a
/// forged reply naming another key under the body prefix is ignored), and none that a
/// job of `kept` is about to read.
async fn delete_unread(
    inner: &Inner,
    mut names: Vec<String>,
    kept: &[AnswerJob],
) -> Result<(), Vec<String>> {
    names.retain(|n| n.starts_with('a') && !kept.iter().any(|j| j.name == *n));
    if names.is_empty() {
        return Ok(());
    }
    tracing::debug!(
        n = names.len(),
        "deleting stored answers no waiter reads (a call that failed or gave up, or a request run twice)"
    );
    let keys = names.iter().map(|n| inner.shared.keys.body(n)).collect();
    delete_read(inner, keys).await
}

/// Deletes answers read that nothing else needs. Gives the keys back when the DEL may
/// be sent again (the slot is elsewhere: a resharding, a failover; or the connection
/// dropped): see [`Undeleted`]. Otherwise their ttl ends them.
async fn delete_read(inner: &Inner, keys: Vec<String>) -> Result<(), Vec<String>> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("DEL");
    cmd.arg(&keys);
    match query(inner, &cmd).await {
        Ok(_) => Ok(()),
        Err(e) if worth_sending_again(&e) => {
            tracing::debug!(error = %format_args!("{e:#}"), n = keys.len(), "deleting read answers failed; trying again");
            Err(keys)
        }
        Err(e) => {
            tracing::debug!(error = %format_args!("{e:#}"), "deleting read answers failed; their ttl ends them");
            Ok(())
        }
    }
}

/// How long answers read are tried to be deleted before their ttl is left to end them.
const DELETE_FOR: Duration = Duration::from_secs(60);

/// Answers read whose DEL was refused, tried again with backoff: while a resharding
/// moves the slot, the old master refuses a DEL of keys it no longer has (`ASK`,
/// `TRYAGAIN`), and the answers would stay for the result ttl and a minute.
#[derive(Default)]
struct Undeleted {
    keys: Vec<String>,
    /// When to try next, and when to give up.
    next: Option<(Instant, Instant)>,
    backoff: Option<Backoff>,
}

impl Undeleted {
    fn add(&mut self, keys: Vec<String>) {
        self.keys.extend(keys);
        if self.next.is_none() {
            // The first refusal schedules the next try; later ones join it (pushing it
            // back on every refused round would put it off for as long as they come).
            let now = Instant::now();
            let wait = self.backoff.get_or_insert_with(Backoff::new).next();
            self.next = Some((now + wait, now + DELETE_FOR));
        }
    }

    /// How long until the next try; `None` when nothing waits.
    fn due_in(&self) -> Option<Duration> {
        self.next
            .map(|(at, _)| at.saturating_duration_since(Instant::now()))
    }

    /// Sends the DEL again if it is time.
    async fn retry(&mut self, inner: &Inner) {
        let Some((at, give_up)) = self.next else {
            return;
        };
        let now = Instant::now();
        if now < at {
            return;
        }
        let keys = std::mem::take(&mut self.keys);
        match delete_read(inner, keys).await {
            Err(keys) if now < give_up => {
                self.keys = keys;
                let wait = self.backoff.get_or_insert_with(Backoff::new).next();
                self.next = Some((now + wait, give_up));
            }
            Err(keys) => {
                tracing::debug!(
                    n = keys.len(),
                    "answers read could not be deleted; their ttl ends them"
                );
                *self = Undeleted::default();
            }
            Ok(()) => *self = Undeleted::default(),
        }
    }
}

/// The answer of `job` is gone from Redis (its ttl outlives its outcome by a minute, so
/// it was evicted under maxmemory, lost in a restart, or deleted). The request is solved
/// again rather than failed: its cached outcome is forgotten (if it still names that
/// answer) and it is submitted afresh, a few times at most; after that, or past its
/// deadline, its waiters get an error that says what happened.
async fn lost(inner: &Inner, job: &AnswerJob) {
    let again = {
        let mut st = inner.state.lock().unwrap();
        let Some(p) = st.pending.get_mut(job.rid.as_str()) else {
            return;
        };
        let again = p.lost_answers < MAX_LOST && p.deadline_ms > now_ms();
        p.lost_answers += u8::from(again);
        again
    };
    if again {
        if job.indexed {
            let outcome = Outcome::Stored {
                len: job.len,
                name: job.name.clone(),
            }
            .encode();
            let forget = Forget {
                rid: &job.rid,
                outcome: &outcome,
            }
            .call(&inner.shared.scripts);
            if let Err(e) = forget.invoke(&mut inner.shared.conn()).await {
                tracing::warn!(error = %format_args!("{e:#}"), rid = job.rid, "forgetting an outcome whose answer is gone failed");
            }
        }
        inner.resubmit(
            &job.rid,
            Resubmit::AnswerGone,
            "the stored answer of this request is gone from Redis (evicted?); submitting it again",
        );
        return;
    }
    let e = Error::new(
        ErrorKind::Redis,
        format!(
            "request {}: its stored answer ({}) is gone from Redis (evicted, lost in a restart, or deleted)",
            job.rid, job.name
        ),
    );
    inner.resolve(&job.rid, Err(e));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(len: usize) -> AnswerJob {
        AnswerJob {
            rid: format!("r{len}"),
            len,
            name: "a".into(),
            indexed: true,
        }
    }

    #[test]
    fn refused_deletes_are_tried_again_soon_however_many_follow() {
        let mut u = Undeleted::default();
        assert_eq!(u.due_in(), None, "nothing waits");
        u.add(vec!["a".into()]);
        let first = u.due_in().expect("a try is scheduled");
        assert!(first <= Duration::from_millis(50), "{first:?}");
        for n in 0..100 {
            u.add(vec![format!("k{n}")]);
        }
        assert!(u.due_in().expect("still scheduled") <= first, "put off");
        assert_eq!(u.keys.len(), 101);
    }

    #[test]
    fn rounds_split_by_bytes_into_few_parts() {
        let small: Vec<AnswerJob> = (0..10).map(|_| job(5_000)).collect();
        assert_eq!(split(&small).len(), 1, "50 KB in all: one part");
        let large: Vec<AnswerJob> = (0..10).map(|_| job(100_000)).collect();
        let parts = split(&large);
        assert_eq!(parts.len(), crate::conn::SPLIT_CONNECTIONS);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 10);
        assert!(parts.iter().all(|p| !p.is_empty()));
        let two = vec![job(1_000_000), job(1_000_000)];
        assert_eq!(split(&two).len(), 2, "never more parts than answers");
    }

    #[test]
    fn a_round_holds_a_few_megabytes_and_one_answer_at_least() {
        let mb: Vec<AnswerJob> = (0..20).map(|_| job(1 << 20)).collect();
        assert_eq!(fitting(&mb), 8);
        let huge: Vec<AnswerJob> = (0..3).map(|_| job(16 << 20)).collect();
        assert_eq!(fitting(&huge), 1);
        let small: Vec<AnswerJob> = (0..256).map(|_| job(5_000)).collect();
        assert_eq!(fitting(&small), 256);
        assert_eq!(fitting(&[]), 0);
    }
}
