//! Nitro's wire behind the consumer core: the request is the JSON in the entry's `msg`
//! field, the request id is the entry id, the answer is `result-key:<stream>.<id>` (JSON)
//! or `error-key:<stream>.<id>.error` (text), written with XACK and XDEL in one script
//! (`nitro_answer.lua`); hand-backs keep the delivery count (`nitro_release.lua`), the
//! heartbeat is owner-checked (`nitro_renew.lua`), idle entries are taken over as Nitro
//! does (`nitro_reclaim.lua`); with dedup, each entry solves, joins or is answered from the
//! cache (`nitro_join.lua`). Entries that cannot go to a handler (no `msg`, undecodable,
//! past the retry limit) are answered with an error at once.

use super::Job;
use crate::clock::ms;
use crate::conn::wire::FieldNames;
use crate::conn::OwnConn;
use crate::consumer::wire::{Admit, Place, Reclaimed, Settings, Verdict, Wire, Written};
use crate::consumer::LeaseLost;
use crate::error::{Error, ErrorKind, Result};
use crate::ids;
use crate::nitro::config::ConsumerConfig;
use crate::nitro::link::Link;
use crate::nitro::TOO_MANY_RETRIES;
use crate::protocol::entry::{self, parse_entries, RawEntry};
use crate::protocol::scripts::ScriptCall;
use redis::{RedisResult, Value};
use serde::{de::DeserializeOwned, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Longest pause between two removals of gone consumers.
const GC_EVERY: Duration = Duration::from_secs(60);

/// A connected Nitro stream, as its consumer sees it.
pub(crate) struct Nitro {
    link: Arc<Link>,
    place: Place,
    config: ConsumerConfig,
}

impl Nitro {
    pub(crate) fn new(link: Arc<Link>, config: ConsumerConfig) -> Nitro {
        let place = Place {
            stream: link.keys.stream.clone(),
            group: link.keys.group().to_string(),
            conn: link.conn(),
            endpoint: link.endpoint.clone(),
            metrics: link.metrics.clone(),
            command_timeout: link.config.command_timeout,
            // One stream, one writer: never waited for.
            write_gate: Arc::new(Semaphore::new(1)),
            reader_clients: format!("pelican-reader:{}:", link.keys.stream),
        };
        Nitro {
            link,
            place,
            config,
        }
    }

    /// The settings the consumer core runs by.
    pub(crate) fn settings(&self) -> Settings {
        let c = &self.config;
        Settings {
            claim_idle: c.idletime,
            lease_interval: c.heartbeat_interval(),
            reclaim_interval: c.reclaim_interval(),
            prefetch: c.prefetch,
            block: c.block,
            shutdown_timeout: c.shutdown_timeout,
            reclaim: c.reclaim,
        }
    }

    /// Runs a script call on the writer's own connection, opening it when needed
    /// ([`crate::conn::on_own`]).
    async fn eval_own<R>(
        &self,
        conn: &mut Option<OwnConn>,
        call: &ScriptCall<'_, R>,
    ) -> RedisResult<R> {
        let link = &self.link;
        let open = async || link.own_connection(link.config.command_timeout).await;
        crate::conn::on_own(conn, open, async |c| {
            call.invoke_on(c, &mut link.conn()).await
        })
        .await
    }

    fn release_call(&self, consumer: &str, idle_ms: u64) -> ScriptCall<'_, u64> {
        let k = &self.link.keys;
        let mut call = ScriptCall::script(&self.link.scripts.release, &[&k.stream], |v| {
            Ok(entry::int(&v).unwrap_or(0).max(0) as u64)
        });
        call.arg(k.group()).arg(consumer).arg(idle_ms).arg("0");
        call
    }
}

/// The one field of a Nitro entry.
pub(crate) struct MsgField;

impl FieldNames for MsgField {
    const NAMES: &'static [&'static [u8]] = &[b"msg"];
}

/// Who wrote an answer: the handler (it answers every entry of the body's dedup job), or
/// the retry limit (it ends the job only when the entry is the job's solver).
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    Handler,
    RetryLimit,
}

/// A result key (JSON) or an error key (plain text).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Result,
    Error,
}

/// An answer to write for one entry.
pub(crate) struct Finish {
    /// The body hash, with dedup: the answer goes to every entry of its job.
    hash: Option<Arc<str>>,
    mode: Mode,
    kind: Kind,
    value: Vec<u8>,
}

impl Finish {
    fn error(hash: Option<Arc<str>>, mode: Mode, text: String) -> Finish {
        Finish {
            hash,
            mode,
            kind: Kind::Error,
            value: text.into_bytes(),
        }
    }
}

impl Wire for Nitro {
    type Job = Job;
    /// The body hash, with dedup.
    type Admitted = Option<Arc<str>>;
    type Finish = Finish;
    type ReadState = ();
    type Fields = MsgField;

    fn place(&self) -> &Place {
        &self.place
    }

    async fn ensure_group(&self, had_group: bool) -> Result<()> {
        let link = &self.link;
        if had_group {
            tracing::warn!(stream = %link.keys.stream, "the stream or its consumer group is gone; creating the group again");
        } else {
            tracing::info!(stream = %link.keys.stream, "no consumer group yet (no producer has created it); creating it");
        }
        // At `0`, so that entries added meanwhile are served (a Nitro producer's XADD may
        // have made the stream again without the group).
        link.create_group("0").await
    }

    async fn reclaim(
        &self,
        conn: &mut OwnConn,
        consumer: &str,
        settings: &Settings,
        _cursor: &str,
        count: usize,
        _idle: bool,
    ) -> Result<Reclaimed> {
        let link = &self.link;
        let k = &link.keys;
        let mut call = ScriptCall::script(&link.scripts.reclaim, &[&k.stream], reclaim_reply);
        call.arg(k.group())
            .arg(consumer)
            .arg(ms(settings.claim_idle))
            .arg(count);
        let claimed = call
            .invoke_on(conn, &mut link.conn())
            .await
            .map_err(|e| Error::redis("looking for idle entries", e))?;
        // A full hand: more may be waiting; look again at once.
        let next_cursor = if claimed.len() >= count { "0" } else { "-" };
        Ok(Reclaimed {
            next_cursor: next_cursor.to_string(),
            claimed,
            solo: None,
            waiting_alone: false,
        })
    }

    fn admit<Req: DeserializeOwned>(
        &self,
        e: RawEntry,
        deliveries: u32,
        _: &mut (),
    ) -> Admit<Self, Req> {
        let id = &e.id;
        let msg = e.get("msg");
        let hash: Option<Arc<str>> = if self.config.dedup {
            msg.map(|m| ids::request_id(m).into())
        } else {
            None
        };
        let before = deliveries - 1;
        if self.config.max_retry_count.is_some_and(|max| before > max) {
            tracing::warn!(entry = %id, deliveries = before, "past the retry limit: answering \"too many retries\"");
            return Admit::Answer(Finish::error(
                hash,
                Mode::RetryLimit,
                TOO_MANY_RETRIES.into(),
            ));
        }
        match msg.map(serde_json::from_slice::<Req>) {
            Some(Ok(req)) => Admit::Handle {
                req,
                admitted: hash.clone(),
                tag: hash,
            },
            Some(Err(err)) => {
                tracing::warn!(entry = %id, error = %err, "undecodable request: answering with an error");
                let text = format!("pelican: the request in entry {id} cannot be decoded: {err}");
                Admit::Answer(Finish::error(None, Mode::Handler, text))
            }
            None => {
                tracing::warn!(entry = %id, "entry without a msg field: answering with an error");
                let text = format!("pelican: entry {id} has no 'msg' field");
                Admit::Answer(Finish::error(None, Mode::Handler, text))
            }
        }
    }

    fn joins(&self) -> bool {
        self.config.dedup
    }

    async fn join(
        &self,
        consumer: &str,
        entries: &[(Arc<str>, Option<Arc<str>>)],
    ) -> Result<Vec<Verdict>> {
        let link = &self.link;
        let k = &link.keys;
        let c = &self.config;
        let mut inv = link.scripts.join.prepare_invoke();
        inv.key(&k.stream)
            .key(&k.job_prefix)
            .key(&k.cache_prefix)
            .key(&k.result_prefix)
            .arg(k.group())
            .arg(consumer)
            .arg(ms(c.idletime))
            .arg(ms(c.job_ttl()))
            .arg(ms(c.response_ttl));
        for (id, hash) in entries {
            inv.arg(&**id).arg(hash.as_deref().unwrap_or(""));
        }
        let verdicts: Vec<String> = inv
            .invoke_async(&mut link.conn())
            .await
            .map_err(|e| Error::redis("deduplicating entries", e))?;
        if verdicts.len() != entries.len() {
            return Err(Error::new(
                ErrorKind::Redis,
                "unexpected answer from the dedup script",
            ));
        }
        Ok(verdicts
            .iter()
            .map(|v| match v.as_str() {
                "s" => Verdict::Solve,
                "j" => Verdict::Joined,
                "c" => Verdict::Cached,
                _ => Verdict::Gone,
            })
            .collect())
    }

    fn job(&self, hash: Option<Arc<str>>, id: Arc<str>, deliveries: u32, lease: LeaseLost) -> Job {
        Job {
            id,
            hash,
            deliveries,
            lease,
        }
    }

    fn entry_id(job: &Job) -> &Arc<str> {
        &job.id
    }

    fn span(&self, job: &Job) -> tracing::Span {
        tracing::info_span!(
            "pelican.nitro.handle",
            stream = %self.link.keys.stream,
            entry = %job.id,
            delivery = job.deliveries,
        )
    }

    fn respond<Resp: Serialize>(&self, job: &Job, resp: &Resp) -> (Finish, Option<Error>) {
        match serde_json::to_vec(resp) {
            Ok(body) => (
                Finish {
                    hash: job.hash.clone(),
                    mode: Mode::Handler,
                    kind: Kind::Result,
                    value: body,
                },
                None,
            ),
            Err(e) => {
                let text =
                    format!("pelican: the handler's response cannot be encoded as JSON: {e}");
                let err = Error::new(ErrorKind::Codec, text.clone());
                (
                    Finish::error(job.hash.clone(), Mode::Handler, text),
                    Some(err),
                )
            }
        }
    }

    fn fail(&self, job: &Job, message: String) -> Finish {
        Finish::error(job.hash.clone(), Mode::Handler, message)
    }

    fn label(finish: &Finish) -> &'static str {
        match finish.kind {
            Kind::Result => "ok",
            Kind::Error => "error",
        }
    }

    async fn complete(
        &self,
        conn: &mut Option<OwnConn>,
        batch: &[(&Arc<str>, &Finish)],
    ) -> Result<Vec<Written>> {
        let k = &self.link.keys;
        let mut call = ScriptCall::script(
            &self.link.scripts.answer,
            &[
                &k.stream,
                &k.result_prefix,
                &k.error_prefix,
                &k.job_prefix,
                &k.cache_prefix,
            ],
            answer_reply,
        );
        call.arg(k.group())
            .arg(ms(self.config.response_ttl))
            .arg(self.config.dedup_cache_ttl.map_or(0, ms));
        for (id, a) in batch {
            call.arg(&***id)
                .arg(a.hash.as_deref().unwrap_or(""))
                .arg(match a.mode {
                    Mode::Handler => "h",
                    Mode::RetryLimit => "r",
                })
                .arg(match a.kind {
                    Kind::Result => "r",
                    Kind::Error => "e",
                })
                .arg(a.value.as_slice());
        }
        let flags = self
            .eval_own(conn, &call)
            .await
            .map_err(|e| Error::redis("writing answers", e))?;
        Ok(flags
            .into_iter()
            .zip(batch)
            .map(|((mine, others), (_, a))| {
                if mine {
                    Written::Recorded(others)
                } else {
                    // Its own entry was no longer pending; the other entries of its
                    // dedup job were answered all the same.
                    self.link.metrics.completed(Self::label(a), others);
                    Written::Dropped
                }
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
        let mut call = self.release_call(consumer, idle_ms);
        for id in sids {
            call.arg(&**id);
        }
        self.eval_own(conn, &call)
            .await
            .map_err(|e| Error::redis("handing entries back", e))?;
        Ok(())
    }

    async fn release_all(&self, consumer: &str, idle_ms: u64) -> RedisResult<u64> {
        self.release_call(consumer, idle_ms)
            .invoke(&mut self.link.conn())
            .await
    }

    async fn renew(
        &self,
        consumer: &str,
        held: &[(Arc<str>, Option<Arc<str>>)],
    ) -> RedisResult<Vec<String>> {
        let link = &self.link;
        let k = &link.keys;
        let mut inv = link.scripts.renew.prepare_invoke();
        inv.key(&k.stream)
            .key(&k.job_prefix)
            .arg(k.group())
            .arg(consumer)
            .arg(ms(self.config.job_ttl()));
        for (id, hash) in held {
            inv.arg(&**id).arg(hash.as_deref().unwrap_or(""));
        }
        inv.invoke_async(&mut link.conn()).await
    }

    fn upkeep_interval(&self) -> Duration {
        GC_EVERY.min(self.config.consumer_gc_after)
    }

    async fn upkeep(&self, consumer: &str) {
        let link = &self.link;
        // Another process's removal may have taken this (empty, idle) consumer out.
        link.register(consumer).await;
        let r: RedisResult<i64> = link
            .scripts
            .gc
            .key(&link.keys.stream)
            .arg(link.keys.group())
            .arg(ms(self.config.consumer_gc_after))
            .arg(consumer)
            .invoke_async(&mut link.conn())
            .await;
        match r {
            Ok(n) if n > 0 => tracing::debug!(removed = n, "removed gone consumers"),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %format_args!("{e:#}"), "removing gone consumers failed")
            }
        }
    }
}

/// `nitro_reclaim.lua`'s reply: the entries taken over, with their delivery counts
/// (this one included).
fn reclaim_reply(v: Value) -> RedisResult<Vec<(RawEntry, u32)>> {
    let parts = entry::array(&v);
    let counts: std::collections::HashMap<String, u32> = parts
        .first()
        .map(entry::array)
        .unwrap_or(&[])
        .chunks(2)
        .filter_map(|c| Some((entry::string(c.first()?)?, entry::int(c.get(1)?)? as u32)))
        .collect();
    Ok(parts
        .get(1)
        .map(parse_entries)
        .unwrap_or_default()
        .into_iter()
        .map(|entry| {
            let before = counts.get(&*entry.id).copied().unwrap_or(1);
            (entry, before + 1)
        })
        .collect())
}

/// `nitro_answer.lua`'s reply: per answer, `[1 if its own entry was answered, how many
/// other entries of its dedup job were]`.
fn answer_reply(v: Value) -> RedisResult<Vec<(bool, u64)>> {
    Ok(entry::array(&v)
        .iter()
        .map(|pair| {
            let p = entry::array(pair);
            let mine = p.first().and_then(entry::int) == Some(1);
            let others = p.get(1).and_then(entry::int).unwrap_or(0).max(0) as u64;
            (mine, others)
        })
        .collect())
}
