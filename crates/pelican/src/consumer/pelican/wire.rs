//! pelican's own wire behind the consumer core: entries with a `head` field and a body
//! (in the entry, or stored beside the stream), outcomes written by `complete.lua` to the
//! request index and the producers' reply streams (large responses stored beside the
//! stream, in one transaction with the call: `protocol/stored`), dead letters, leases renewed
//! by `renew.lua`, idle work taken over by `reclaim.lua` (a request's last delivery run
//! alone), the janitor.

use super::delivery::Job;
use crate::clock::{ms, now_ms};
use crate::codec::Codec;
use crate::config::ConsumerConfig;
use crate::conn::OwnConn;
use crate::consumer::wire::{Admit, Place, Reclaimed, Settings, Wire, Written};
use crate::consumer::LeaseLost;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::entry::{self, Producers, RawEntry, Request};
use crate::protocol::keys::Keys;
use crate::protocol::outcome::Outcome;
use crate::protocol::scripts::{
    self, Complete, CompleteEntry, Completed, Reclaim, Reject, Renew, ScriptCall,
};
use crate::protocol::stored::{self, AnswerNames, StoredBody, ANSWER_GRACE_MS, STORED_ANSWER_MIN};
use crate::shared::Shared;
use serde::{de::DeserializeOwned, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// One partition of a queue, read with codec `C`.
pub(crate) struct Pelican<C> {
    pub(crate) shared: Arc<Shared>,
    place: Place,
    max_deliveries: u32,
    /// The names of its stored answers.
    answers: AnswerNames,
    _codec: PhantomData<fn() -> C>,
}

impl<C: Codec> Pelican<C> {
    pub(crate) fn new(shared: Arc<Shared>, config: &ConsumerConfig) -> Pelican<C> {
        let place = Place {
            stream: shared.keys.stream.clone(),
            group: shared.keys.group.clone(),
            conn: shared.conn(),
            endpoint: shared.endpoint.clone(),
            metrics: shared.metrics.clone(),
            command_timeout: shared.queue.command_timeout,
            write_gate: shared.node.writes.clone(),
            reader_clients: shared.keys.reader_clients(),
        };
        Pelican {
            shared,
            place,
            max_deliveries: config.max_deliveries,
            answers: AnswerNames::new(),
            _codec: PhantomData,
        }
    }

    /// Runs a script call on the writer's own connection, after the SETs of `answers` in
    /// the same write and the same transaction (`protocol/stored/atomic.rs`), opening the connection
    /// when needed ([`crate::conn::on_own`]: one that failed, or whose partition's slot
    /// is served elsewhere now, is dropped, and the next call opens a new one).
    async fn eval_own<R>(
        &self,
        conn: &mut Option<OwnConn>,
        call: &ScriptCall<'_, R>,
        answers: &[StoredBody<'_>],
    ) -> redis::RedisResult<R> {
        let sh = &self.shared;
        let open = async || sh.own_connection(sh.queue.command_timeout).await;
        crate::conn::on_own(conn, open, async |c| {
            if answers.is_empty() {
                call.invoke_on(c, &mut sh.conn()).await
            } else {
                stored::atomic::invoke_with_answers(call, c, &mut sh.conn(), answers).await
            }
        })
        .await
    }
}

/// What an entry let through keeps for its job: the request's head (its body decoded
/// apart) and trace context.
pub(crate) struct Admitted {
    rid: Arc<str>,
    from: Arc<str>,
    indexed: bool,
    stored_body: bool,
    small: bool,
    deadline_ms: u64,
    submitted_ms: u64,
    tp: Option<Arc<str>>,
}

/// An outcome to record for one entry, with what `complete.lua` needs of the entry.
pub(crate) struct Finish {
    rid: Arc<str>,
    from: Arc<str>,
    deadline_ms: u64,
    indexed: bool,
    stored_body: bool,
    small: bool,
    /// A response of `STORED_ANSWER_MIN` bytes or more is stored beside the stream
    /// (`protocol/stored`): SET under a new name ([`AnswerNames`]) in the same write and
    /// transaction as each call that records it, the outcome naming it.
    outcome: Outcome,
}

impl Finish {
    fn of(job: &Job, outcome: Outcome) -> Finish {
        Finish {
            rid: job.rid.clone(),
            from: job.from.clone(),
            deadline_ms: job.deadline_ms,
            indexed: job.indexed,
            stored_body: job.stored_body,
            small: job.small,
            outcome,
        }
    }
}

impl<C: Codec> Wire for Pelican<C> {
    type Job = Job;
    type Admitted = Admitted;
    type Finish = Finish;
    type ReadState = Producers;
    type Fields = entry::RequestFields;

    fn place(&self) -> &Place {
        &self.place
    }

    fn stored_bodies(&self) -> Option<&Keys> {
        Some(&self.shared.keys)
    }

    async fn ensure_group(&self, _had_group: bool) -> Result<()> {
        tracing::warn!("the consumer group is gone (Redis restarted or the stream was deleted); creating it again");
        self.shared.ensure_group().await
    }

    async fn reclaim(
        &self,
        conn: &mut OwnConn,
        consumer: &str,
        settings: &Settings,
        cursor: &str,
        count: usize,
        idle: bool,
    ) -> Result<Reclaimed> {
        let sh = &self.shared;
        let r = Reclaim {
            consumer,
            min_idle_ms: ms(settings.claim_idle),
            cursor,
            count,
            max_deliveries: self.max_deliveries,
            now_ms: now_ms(),
            result_ttl_ms: ms(sh.queue.result_ttl),
            reply_maxlen: sh.queue.reply_maxlen,
            dead_maxlen: sh.queue.dead_maxlen,
            max_body_bytes: sh.queue.max_body_bytes,
            idle,
        }
        .call(&sh.scripts)
        .invoke_on(conn, &mut sh.conn())
        .await
        .map_err(|e| Error::redis("reclaiming idle entries", e))?;
        if r.dead > 0 {
            tracing::warn!(
                n = r.dead,
                "dead-lettered entries that reached max_deliveries"
            );
            sh.metrics.dead_lettered(r.dead);
        }
        Ok(Reclaimed {
            next_cursor: r.next_cursor,
            claimed: r.claimed,
            solo: r.solo,
            waiting_alone: r.waiting > 0,
        })
    }

    fn admit<Req: DeserializeOwned>(
        &self,
        e: RawEntry,
        _deliveries: u32,
        producers: &mut Producers,
    ) -> Admit<Self, Req> {
        let tp = crate::trace::from_entry(e.get(crate::trace::FIELD));
        let mut req = match Request::from_entry(e, self.shared.queue.max_body_bytes, producers) {
            Ok(r) => r,
            Err(reason) => return Admit::Reject(reason),
        };
        if req.deadline_ms < now_ms() {
            return Admit::Answer(Finish {
                rid: req.rid,
                from: req.from,
                deadline_ms: req.deadline_ms,
                indexed: req.indexed,
                stored_body: req.stored_body,
                small: req.small,
                outcome: Outcome::Expired("deadline passed before a consumer started it".into()),
            });
        }
        match req.decode_body::<C, Req>() {
            Ok(value) => Admit::Handle {
                req: value,
                admitted: Admitted {
                    rid: req.rid,
                    from: req.from,
                    indexed: req.indexed,
                    stored_body: req.stored_body,
                    small: req.small,
                    deadline_ms: req.deadline_ms,
                    submitted_ms: req.submitted_ms,
                    tp,
                },
                tag: None,
            },
            Err(err) => Admit::Reject(format!("undecodable body: {err}")),
        }
    }

    async fn reject(&self, consumer: &str, sid: &str, reason: &str, deliveries: u32) {
        let sh = &self.shared;
        tracing::warn!(entry = sid, reason, "dead-lettering a malformed entry");
        let r = Reject {
            consumer,
            sid,
            reason,
            deliveries,
            now_ms: now_ms(),
            result_ttl_ms: ms(sh.queue.result_ttl),
            reply_maxlen: sh.queue.reply_maxlen,
            dead_maxlen: sh.queue.dead_maxlen,
            max_body_bytes: sh.queue.max_body_bytes,
        }
        .call(&sh.scripts)
        .invoke(&mut sh.conn())
        .await;
        match r {
            Ok(true) => sh.metrics.dead_lettered(1),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), entry = sid, "could not dead-letter; it will be reclaimed and tried again")
            }
        }
    }

    fn job(&self, a: Admitted, sid: Arc<str>, deliveries: u32, lease: LeaseLost) -> Job {
        Job {
            sid,
            rid: a.rid,
            from: a.from,
            indexed: a.indexed,
            stored_body: a.stored_body,
            small: a.small,
            deliveries,
            deadline_ms: a.deadline_ms,
            submitted_ms: a.submitted_ms,
            tp: a.tp,
            lease,
        }
    }

    fn entry_id(job: &Job) -> &Arc<str> {
        &job.sid
    }

    fn span(&self, job: &Job) -> tracing::Span {
        let span = tracing::info_span!(
            "pelican.handle",
            queue = %self.shared.queue.name,
            rid = %job.request_id(),
            delivery = job.delivery_count(),
        );
        crate::trace::continue_from(&span, job.trace_parent());
        span
    }

    fn respond<Resp: Serialize>(&self, job: &Job, resp: &Resp) -> (Finish, Option<Error>) {
        let max = self.shared.queue.max_body_bytes;
        let (outcome, err) = match C::encode(resp) {
            Err(e) => {
                let err = Error::codec("encoding the response", e);
                let o = Outcome::Remote(format!(
                    "the handler's response could not be encoded: {err:#}"
                ));
                (o, Some(err))
            }
            Ok(body) if body.len() > max => {
                let msg = format!(
                    "the response body is {} bytes; max_body_bytes is {max}",
                    body.len()
                );
                (
                    Outcome::Remote(msg.clone()),
                    Some(Error::new(ErrorKind::TooLarge, msg)),
                )
            }
            Ok(body) => (Outcome::Ok(body), None),
        };
        (Finish::of(job, outcome), err)
    }

    fn fail(&self, job: &Job, message: String) -> Finish {
        Finish::of(job, Outcome::Remote(message))
    }

    fn label(finish: &Finish) -> &'static str {
        finish.outcome.label()
    }

    async fn complete(
        &self,
        conn: &mut Option<OwnConn>,
        batch: &[(&Arc<str>, &Finish)],
    ) -> Result<Vec<Written>> {
        let sh = &self.shared;
        // Each outcome as sent; a large response stored under a new name, named instead.
        let ttl_ms = ms(sh.queue.result_ttl) + ANSWER_GRACE_MS;
        let mut answers: Vec<StoredBody<'_>> = Vec::new();
        let outcomes: Vec<Vec<u8>> = batch
            .iter()
            .map(|(sid, f)| match &f.outcome {
                Outcome::Ok(body) if body.len() >= STORED_ANSWER_MIN => {
                    let name = self.answers.next(sid);
                    answers.push(StoredBody {
                        key: sh.keys.body(&name),
                        body,
                        ttl_ms,
                    });
                    Outcome::Stored {
                        len: body.len(),
                        name,
                    }
                    .encode()
                }
                o => o.encode(),
            })
            .collect();
        let call = Complete {
            result_ttl_ms: ms(sh.queue.result_ttl),
            reply_maxlen: sh.queue.reply_maxlen,
            now_ms: now_ms(),
        }
        .call(
            &sh.scripts,
            batch
                .iter()
                .zip(&outcomes)
                .map(|((sid, f), outcome)| CompleteEntry {
                    sid,
                    rid: &f.rid,
                    from: &f.from,
                    deadline_ms: f.deadline_ms,
                    indexed: f.indexed,
                    stored_body: f.stored_body,
                    small: f.small,
                    outcome,
                }),
        );
        let done = self
            .eval_own(conn, &call, &answers)
            .await
            .map_err(|e| Error::redis("writing outcomes", e))?;
        Ok(done
            .into_iter()
            .map(|d| match d {
                Completed::Recorded => Written::Recorded(0),
                Completed::Dropped => Written::Dropped,
                Completed::AnswerMissing => Written::AnswerMissing,
            })
            .collect())
    }

    async fn release(
        &self,
        conn: &mut Option<OwnConn>,
        consumer: &str,
        idle_ms: u64,
        sids: &[Arc<str>],
    ) -> Result<()> {
        let call = scripts::Release { consumer, idle_ms }
            .call(&self.shared.scripts, sids.iter().map(|s| &**s));
        self.eval_own(conn, &call, &[])
            .await
            .map_err(|e| Error::redis("releasing entries", e))?;
        Ok(())
    }

    async fn release_all(&self, consumer: &str, idle_ms: u64) -> redis::RedisResult<u64> {
        let sh = &self.shared;
        scripts::Release { consumer, idle_ms }
            .call(&sh.scripts, [])
            .invoke(&mut sh.conn())
            .await
    }

    async fn renew(
        &self,
        consumer: &str,
        held: &[(Arc<str>, Option<Arc<str>>)],
    ) -> redis::RedisResult<Vec<String>> {
        let sh = &self.shared;
        Renew { consumer }
            .call(&sh.scripts, held.iter().map(|(s, _)| &**s))
            .invoke(&mut sh.conn())
            .await
    }

    fn upkeep_interval(&self) -> Duration {
        self.shared.queue.janitor_interval
    }

    async fn upkeep(&self, consumer: &str) {
        if let Err(e) = self.shared.janitor(consumer).await {
            tracing::debug!(error = %format_args!("{e:#}"), "janitor failed");
        }
    }
}
