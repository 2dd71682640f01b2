//! Submissions, batched: whatever is queued while one script call is on the wire goes
//! out in the next call, so a busy producer sends few, large calls and an idle one adds
//! no delay.

use super::lean::{is_elsewhere, send_xadds, submit_with_bodies};
use super::pending::{SubmitJob, Submitted};
use super::state::Inner;
use crate::clock::{ms, now_ms};
use crate::conn::cluster::{is_slot_elsewhere, slot_moved_error};
use crate::conn::command;
use crate::conn::framed::Framed;
use crate::conn::retry::{retry_idempotent, Backoff};
use crate::conn::wire::into_result;
use crate::error::{Error, Result};
use crate::protocol::head::{EntryHead, HEAD_FIELD};
use crate::protocol::scripts::{Submit, SubmitAnswer, SubmitRequest};
use crate::protocol::stored::{StoredBody, STORED_BODY_MIN};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Most requests sent in one script call.
pub(super) const MAX_BATCH: usize = 256;
/// A call takes no more requests once their bodies reach this many bytes (one large
/// body still goes alone): megabyte bodies travel in several calls that overlap, not in
/// one call of hundreds of megabytes that Redis and the consumers must take whole.
pub(crate) const MAX_BATCH_BYTES: usize = 2 << 20;

/// Sends whatever is queued in one call. The calls are tasks of this one: aborted with
/// it, and a panic in one is this task's panic (so the producer's supervisor sees it).
/// The submitters of the partitions on one node share their calls on the wire
/// ([`crate::shared::NodeGate`]: 4 for one partition, fewer for several): while they are
/// all busy, submissions queue up and go out together in the next call, up to
/// `MAX_BATCH` requests or `MAX_BATCH_BYTES` of bodies.
pub(super) async fn submitter(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<SubmitJob>) {
    let limit = inner.shared.node.submits.clone();
    let mut calls = JoinSet::new();
    // The next call's jobs: those taken while no call slot was free, or the one that did
    // not fit the last call's bytes.
    let mut batch: Vec<SubmitJob> = Vec::new();
    loop {
        // Work first, then a call slot (an idle partition holds none), then whatever
        // else queued up meanwhile. Finished calls are reaped while waiting, so a panic
        // in one surfaces at once.
        if batch.is_empty() {
            let n = tokio::select! {
                n = rx.recv_many(&mut batch, MAX_BATCH) => n,
                Some(done) = calls.join_next() => {
                    reap(done);
                    continue;
                }
            };
            if n == 0 {
                break;
            }
        }
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("never closed"),
            Some(done) = calls.join_next() => {
                reap(done);
                continue;
            }
        };
        // Within the bytes bound: the jobs in hand up to it, then more from the channel.
        let mut bytes = 0;
        let mut fits = 0;
        for j in &batch {
            if fits > 0 && bytes + j.body.len() > MAX_BATCH_BYTES {
                break;
            }
            bytes += j.body.len();
            fits += 1;
        }
        let mut rest = batch.split_off(fits);
        while rest.is_empty() && batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(j) if bytes + j.body.len() > MAX_BATCH_BYTES => rest.push(j),
                Ok(j) => {
                    bytes += j.body.len();
                    batch.push(j);
                }
                Err(_) => break,
            }
        }
        let jobs = std::mem::replace(&mut batch, rest);
        let inner = inner.clone();
        calls.spawn(async move {
            submit_batch(&inner, jobs).await;
            drop(permit);
        });
    }
    while let Some(done) = calls.join_next().await {
        reap(done);
    }
}

/// A finished call: a panic in it goes on up.
fn reap(done: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

async fn submit_batch(inner: &Arc<Inner>, batch: Vec<SubmitJob>) {
    let (indexed, plain): (Vec<_>, Vec<_>) = batch.into_iter().partition(|j| j.indexed);
    if !indexed.is_empty() {
        let deadline = indexed.iter().map(|j| j.deadline_ms).max().unwrap_or(0);
        // Named once for every try: a try whose SET of a body was done and whose call
        // was not (refused mid-failover, a dropped connection) leaves the body under the
        // name the next try writes again and renames (or deletes), not a new one.
        let stages = stage_names(inner, &indexed);
        let r = while_slot_elsewhere(deadline, || submit_indexed(inner, &indexed, &stages)).await;
        finish_submits(inner, indexed, r);
    }
    if !plain.is_empty() {
        let r = submit_plain(inner, &plain).await;
        finish_submits(inner, plain, r);
    }
}

/// The per-job answers of a submit call.
type Answers = Result<Vec<SubmitAnswer>>;

/// Where each large body of `jobs` is stored before its `submit.lua` call (`None` for
/// a body sent in the call).
fn stage_names(inner: &Inner, jobs: &[SubmitJob]) -> Vec<Option<String>> {
    jobs.iter()
        .map(|j| {
            if j.body.len() < STORED_BODY_MIN {
                return None;
            }
            let n = inner.next_token.fetch_add(1, Ordering::Relaxed);
            Some(format!("s{}:{n}", inner.id))
        })
        .collect()
}

async fn submit_indexed(inner: &Inner, jobs: &[SubmitJob], stages: &[Option<String>]) -> Answers {
    let sh = &inner.shared;
    let now = now_ms();
    let result_ttl = ms(sh.queue.result_ttl);
    let index_ttl = |j: &SubmitJob| j.deadline_ms.saturating_sub(now).max(1) + result_ttl;
    // Large bodies are stored by a plain SET sent in the same write, just before the
    // script, which only renames or deletes them: Redis hashes every byte of every string
    // a script sees (about a millisecond per megabyte), a SET does not.
    let stored: Vec<StoredBody<'_>> = jobs
        .iter()
        .zip(stages)
        .filter_map(|(j, stage)| {
            Some(StoredBody {
                key: sh.keys.body(stage.as_deref()?),
                body: j.body.as_slice(),
                ttl_ms: index_ttl(j),
            })
        })
        .collect();
    let call = Submit {
        now_ms: now,
        producer: &inner.id,
        result_ttl_ms: result_ttl,
        reply_maxlen: sh.queue.reply_maxlen,
        failure_ttl_ms: ms(sh.queue.failure_ttl),
    }
    .call(
        &sh.scripts,
        jobs.iter().zip(stages).map(|(j, stage)| SubmitRequest {
            rid: &j.rid,
            deadline_ms: j.deadline_ms,
            // The index outlives the deadline by the result ttl.
            index_ttl_ms: index_ttl(j),
            tp: j.tp.as_deref(),
            stage: stage.as_deref(),
            body: &j.body,
        }),
    );
    // Idempotent per rid (a repeat joins the first attempt's request or reads its
    // outcome, and deletes its stored body again), so it may be sent again after a
    // dropped connection.
    // On a lean connection, with or without stored bodies: through the shared connection
    // the call's reply went through the client library's general parser.
    let call = &call;
    let stored = &stored;
    match submit_with_bodies(inner, call, stored).await {
        Some(Ok(answers)) => return Ok(answers),
        // A refusal (a server error reply) is the answer; so is a slot that is
        // elsewhere (the caller sends the call again, on a new connection).
        Some(Err(e)) if e.code().is_some() || is_slot_elsewhere(&e) => {
            return Err(Error::redis("submitting requests", e));
        }
        // The connection failed (a node down mid-failover, a slot that moved): the same
        // commands go through the client library, which follows the cluster's topology
        // and reconnects (they are idempotent, see above).
        Some(Err(e)) => {
            tracing::debug!(error = %e, "stored bodies: the own connection failed; sending through the shared one");
        }
        None => {}
    }
    // Not plain TCP (or its connection failed): the same commands through the client
    // library.
    let pipe = &call.after(stored.iter().map(StoredBody::cmd).collect());
    retry_idempotent(move || async move { call.invoke_pipeline(pipe, &mut sh.conn()).await })
        .await
        .map_err(|e| Error::redis("submitting requests", e))
}

async fn submit_plain(inner: &Inner, jobs: &[SubmitJob]) -> Answers {
    let sh = &inner.shared;
    let now = now_ms().to_string();
    // On a lean connection (see `stored.rs`): large bodies written in place, small
    // ones with the rest of the batch in one buffer; the replies read by the lean
    // reader. The client library's pipeline below (kept for TLS and Unix sockets)
    // built each command by growing it argument by argument, copied them all into
    // the pipeline and parsed the replies with its general parser: 18 % of the
    // producer's instructions per request without dedup (64-byte bodies).
    let xadd = XaddTemplate::new(&sh.keys.stream, &inner.id, &now);
    let xadds: Vec<Framed<'_>> = jobs.iter().map(|j| xadd.frame(j)).collect();
    if let Some(ids) = xadd_lean(inner, jobs, &xadds).await {
        return ids;
    }
    let mut pipe = redis::pipe();
    for j in jobs {
        pipe.cmd("XADD")
            .arg(&sh.keys.stream)
            .arg("*")
            .arg(HEAD_FIELD)
            .arg(
                EntryHead {
                    rid: &j.rid,
                    from: &inner.id,
                    deadline: &j.deadline_ms.to_string(),
                    at: &now,
                    index: "0",
                }
                .to_string(),
            );
        if let Some(tp) = &j.tp {
            pipe.arg(crate::trace::FIELD).arg(tp);
        }
        pipe.arg("body").arg(j.body.as_slice());
    }
    let ids: Vec<String> = pipe
        .query_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("submitting requests", e))?;
    Ok(ids.into_iter().map(SubmitAnswer::Queued).collect())
}

/// The XADD of a request without dedup, most of it the same for every request of a
/// batch: those arguments are encoded once, around the request's own.
struct XaddTemplate {
    /// `XADD <stream> * head`
    lead: Vec<u8>,
    /// `;<producer>;`, in the head after the request id
    from: Vec<u8>,
    /// `;<now>;0`, the head's end
    at: Vec<u8>,
}

impl XaddTemplate {
    fn new(stream: &str, producer: &str, now: &str) -> XaddTemplate {
        let mut lead = Vec::new();
        for a in [&b"XADD"[..], stream.as_bytes(), b"*", HEAD_FIELD.as_bytes()] {
            command::arg(&mut lead, a);
        }
        XaddTemplate {
            lead,
            from: format!(";{producer};").into_bytes(),
            at: format!(";{now};0").into_bytes(),
        }
    }

    /// The XADD of `j`: `XADD <stream> * head <rid>;<producer>;<deadline>;<now>;0
    /// [tp <trace context>] body <body>`.
    fn frame<'j>(&self, j: &'j SubmitJob) -> Framed<'j> {
        let tp = j.tp.as_deref();
        let mut head = Vec::with_capacity(
            self.lead.len()
                + self.from.len()
                + self.at.len()
                + j.rid.len()
                + 64
                + tp.map_or(0, |tp| tp.len() + 16),
        );
        // XADD, the stream, `*`, then the head and the body as name and value (and `tp`)
        command::header(&mut head, b'*', if tp.is_some() { 9 } else { 7 });
        head.extend_from_slice(&self.lead);
        let (deadline, at) = command::digits(j.deadline_ms);
        command::joined_arg(
            &mut head,
            &[j.rid.as_bytes(), &self.from, &deadline[at..], &self.at],
        );
        if let Some(tp) = tp {
            command::arg(&mut head, crate::trace::FIELD.as_bytes());
            command::arg(&mut head, tp.as_bytes());
        }
        command::arg(&mut head, b"body");
        Framed::ending_with(head, &j.body)
    }
}

/// Sends `xadds` (one per job) on a lean connection; `None` when the queue's connections
/// are not lean ones. An XADD refused because the partition's slot is elsewhere (moved;
/// or being moved, its stream gone to the new master already) did nothing: it alone is
/// sent again, on a new connection, backing off, until the jobs' deadline. (Not after
/// a dropped connection: the XADDs may have been done.)
async fn xadd_lean(inner: &Inner, jobs: &[SubmitJob], xadds: &[Framed<'_>]) -> Option<Answers> {
    let err = |e| Error::redis("submitting requests", e);
    let deadline = jobs.iter().map(|j| j.deadline_ms).max().unwrap_or(0);
    let mut ids: Vec<Option<String>> = vec![None; xadds.len()];
    let mut todo: Vec<usize> = (0..xadds.len()).collect();
    let mut backoff = Backoff::new();
    loop {
        let frames: Vec<&Framed<'_>> = todo.iter().map(|&i| &xadds[i]).collect();
        let none_queued = ids.iter().all(Option::is_none);
        let replies = match send_xadds(inner, &frames).await {
            Some(Ok(r)) => r,
            Some(Err(e)) => return Some(Err(err(e))),
            // Not lean: the caller sends them through the client library; never once
            // some are queued (they would be queued twice).
            None if none_queued => return None,
            None => return Some(Err(err(slot_moved_error()))),
        };
        let mut refused = Vec::new();
        for (i, v) in todo.into_iter().zip(replies) {
            if is_elsewhere(&v) {
                refused.push(i);
                continue;
            }
            match into_result(v)
                .and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into))
            {
                Ok(id) => ids[i] = Some(id),
                Err(e) => return Some(Err(err(e))),
            }
        }
        todo = refused;
        if todo.is_empty() {
            return Some(Ok(ids
                .into_iter()
                .map(|id| SubmitAnswer::Queued(id.expect("every XADD answered")))
                .collect()));
        }
        let wait = backoff.next();
        if now_ms() + ms(wait) >= deadline {
            return Some(Err(err(slot_moved_error())));
        }
        tracing::debug!(
            n = todo.len(),
            "submissions refused: the partition's slot is elsewhere; sending them again"
        );
        tokio::time::sleep(wait).await;
    }
}

/// Runs `op`, a submission that is safe to send again, again while Redis refuses it
/// because the partition's slot is elsewhere: moved (a failover, a resharding), or being
/// moved (the source answers `TRYAGAIN` to every script of the slot until its keys have
/// moved), or the cluster down. Backs off; gives up at `deadline_ms`.
async fn while_slot_elsewhere<Fut>(deadline_ms: u64, mut op: impl FnMut() -> Fut) -> Answers
where
    Fut: std::future::Future<Output = Answers>,
{
    let mut backoff = Backoff::new();
    loop {
        let r = op().await;
        let elsewhere = matches!(&r, Err(e) if e.redis_source().is_some_and(is_slot_elsewhere));
        let wait = backoff.next();
        if !elsewhere || now_ms() + ms(wait) >= deadline_ms {
            return r;
        }
        tracing::debug!(
            "a submission was refused: the partition's slot is elsewhere; sending it again"
        );
        tokio::time::sleep(wait).await;
    }
}

fn finish_submits(inner: &Inner, jobs: Vec<SubmitJob>, answers: Answers) {
    match answers {
        Ok(answers) => {
            for (mut job, a) in jobs.into_iter().zip(answers) {
                let how = match a {
                    SubmitAnswer::Queued(sid) => {
                        let mut st = inner.state.lock().unwrap();
                        if let Some(p) = st.pending.get_mut(&job.rid) {
                            p.sid = Some(sid);
                            p.queued = true;
                        }
                        Submitted::Queued
                    }
                    SubmitAnswer::Joined => {
                        if let Some(p) = inner.state.lock().unwrap().pending.get_mut(&job.rid) {
                            p.queued = true;
                        }
                        Submitted::Joined
                    }
                    SubmitAnswer::Cached(o) => {
                        inner.resolve(&job.rid, Ok(o));
                        Submitted::Cached
                    }
                    SubmitAnswer::BodyMissing => {
                        let e = Error::redis(
                            "submitting requests",
                            redis::RedisError::from((
                                redis::ErrorKind::Client,
                                "Redis did not store the request's body (the SET before the submit script failed)",
                            )),
                        );
                        inner.resolve(&job.rid, Err(e.clone()));
                        if let Some(ack) = job.ack.take() {
                            let _ = ack.send(Err(e));
                        }
                        continue;
                    }
                };
                if let Some(ack) = job.ack.take() {
                    let _ = ack.send(Ok(how));
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %format_args!("{e:#}"), n = jobs.len(), "submission failed");
            for mut job in jobs {
                let Some(ack) = job.ack.take() else {
                    // Submitted again by the producer itself (Redis lost the request or
                    // its answer; its index expired early): the caller did not ask, so
                    // its call does not fail for it. The next sweep looks again (and
                    // submits it again if Redis still does not have it); the caller's
                    // own timeout bounds the wait.
                    if let Some(p) = inner.state.lock().unwrap().pending.get_mut(&job.rid) {
                        p.queued = true;
                    }
                    continue;
                };
                inner.resolve(&job.rid, Err(e.clone()));
                let _ = ack.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The XADD of a request without dedup, from the template, is the client library's
    /// command of the same arguments (the fallback's, for connections that are not lean).
    #[test]
    fn an_xadd_from_the_template_is_the_client_library_command() {
        let xadd = XaddTemplate::new("P:{q}:stream", "p1", "1796207331130");
        for tp in [
            None,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ] {
            for body in [Vec::new(), b"{\"i\":1}".to_vec(), vec![7u8; 100_000]] {
                let job = SubmitJob {
                    rid: "r-1".into(),
                    body: Arc::new(body),
                    deadline_ms: 1_796_207_341_130,
                    indexed: false,
                    tp: tp.map(str::to_owned),
                    ack: None,
                };
                let mut theirs = redis::cmd("XADD");
                theirs
                    .arg("P:{q}:stream")
                    .arg("*")
                    .arg("head")
                    .arg("r-1;p1;1796207341130;1796207331130;0");
                if let Some(tp) = tp {
                    theirs.arg(crate::trace::FIELD).arg(tp);
                }
                theirs.arg("body").arg(job.body.as_slice());
                assert_eq!(
                    xadd.frame(&job).parts().concat(),
                    theirs.get_packed_command()
                );
            }
        }
    }
}
