//! The Lua scripts, one operation per file in `lua/`, and one typed call per script.
//! Each multi-key transition is one script: atomic and one round trip. `lib.lua` holds
//! the helpers they share; with them the scripts are one function library, loaded once
//! per server and called with `FCALL` ([`library`]).
//!
//! A call is a struct named after its script whose fields are the script's ARGV, named
//! and ordered as in the script's header (the KEYS, and the group name, come from the
//! queue's [`Keys`]); the entries of a batch are a struct too. `.call(&scripts, ..)`
//! builds the command once, as a [`ScriptCall`], which runs it on the shared connection
//! ([`ScriptCall::invoke`]) or on a connection of a task's own
//! ([`ScriptCall::invoke_on`]) and reads the reply into a type.
//!
//! Times are milliseconds (`_ms`: since the epoch for `now_ms` and deadlines, else a
//! duration), as the scripts take them.
//!
//! Here: the script set and the producer's calls (`submit.lua`, `cancel.lua`,
//! `forget.lua`, `watch.lua`); the consumer's in `consumer.rs`, the upkeep scripts in
//! `upkeep.rs`.

use super::entry::{self, parse_entries, RawEntry};
use super::keys::Keys;
use super::outcome::Outcome;
pub(crate) use call::ScriptCall;
use library::Function;
use redis::{ErrorKind, RedisError, RedisResult, Value};

/// Every script a queue uses (a function of the library each), with the queue's keys
/// they are called on.
pub(crate) struct Scripts {
    keys: Keys,
    submit: Function,
    complete: Function,
    reclaim: Function,
    renew: Function,
    release: Function,
    reject: Function,
    cancel: Function,
    forget: Function,
    janitor: Function,
    requeue: Function,
    watch: Function,
}

impl Scripts {
    pub(crate) fn new(keys: Keys) -> Scripts {
        Scripts {
            keys,
            submit: Function::new("submit"),
            complete: Function::new("complete"),
            reclaim: Function::new("reclaim"),
            renew: Function::new("renew"),
            release: Function::new("release"),
            reject: Function::new("reject"),
            cancel: Function::new("cancel"),
            forget: Function::new("forget"),
            janitor: Function::new("janitor"),
            requeue: Function::new("requeue"),
            watch: Function::new("watch"),
        }
    }
}

/// A reply that does not have the shape its script returns.
fn unexpected(what: &'static str, v: &Value) -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, what, format!("{v:?}")))
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

// ---------------------------------------------------------------------------------
// submit.lua

/// `submit.lua`: submits a batch of requests with dedup.
pub(crate) struct Submit<'a> {
    pub(crate) now_ms: u64,
    /// The submitting producer's id (its reply stream).
    pub(crate) producer: &'a str,
    /// How long an outcome is kept, and how long an index outlives its deadline.
    pub(crate) result_ttl_ms: u64,
    pub(crate) reply_maxlen: usize,
    /// How long a recorded failure answers a new submission (`QueueConfig::failure_ttl`).
    pub(crate) failure_ttl_ms: u64,
}

/// One request of a [`Submit`] batch.
pub(crate) struct SubmitRequest<'a> {
    pub(crate) rid: &'a str,
    pub(crate) deadline_ms: u64,
    /// Lifetime of a new index: time to the deadline plus the result ttl.
    pub(crate) index_ttl_ms: u64,
    /// The submitting span's W3C trace context, written as the entry's `tp` field.
    pub(crate) tp: Option<&'a str>,
    /// Where the body was stored just before this call (`Keys::body` of this name),
    /// instead of passing it: `body` is then not sent.
    pub(crate) stage: Option<&'a str>,
    pub(crate) body: &'a [u8],
}

/// What became of one submitted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SubmitAnswer {
    /// Queued as a new stream entry.
    Queued(String),
    /// Joined the same request in flight.
    Joined,
    /// Finished already: its cached outcome.
    Cached(Outcome),
    /// Its stored body was missing (the SET before the call failed): not submitted.
    BodyMissing,
}

impl Submit<'_> {
    pub(crate) fn call<'s, 'r>(
        &self,
        s: &'s Scripts,
        requests: impl IntoIterator<Item = SubmitRequest<'r>>,
    ) -> ScriptCall<'s, Vec<SubmitAnswer>> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.submit,
            &[&k.stream, &k.req_prefix, &k.reply_prefix],
            submit_reply,
        );
        c.arg(self.now_ms)
            .arg(self.producer)
            .arg(&k.group)
            .arg(self.result_ttl_ms)
            .arg(self.reply_maxlen)
            .arg(self.failure_ttl_ms);
        for r in requests {
            c.arg(r.rid)
                .arg(r.deadline_ms)
                .arg(r.index_ttl_ms)
                .arg(r.tp.unwrap_or(""));
            match r.stage {
                Some(stage) => c.arg(stage).arg(""),
                None => c.arg("").arg(r.body),
            };
        }
        c
    }
}

fn submit_reply(v: Value) -> RedisResult<Vec<SubmitAnswer>> {
    let answers: Vec<Vec<u8>> = redis::from_redis_value(v)?;
    answers
        .into_iter()
        .map(|a| match a.split_first() {
            Some((b'0'..=b'9', _)) => Ok(SubmitAnswer::Queued(
                String::from_utf8_lossy(&a).into_owned(),
            )),
            Some((b'=', [])) => Ok(SubmitAnswer::Joined),
            Some((b'!', [])) => Ok(SubmitAnswer::BodyMissing),
            _ => Outcome::decode(&a)
                .map(SubmitAnswer::Cached)
                .ok_or_else(|| {
                    unexpected("unexpected answer from submit.lua", &Value::BulkString(a))
                }),
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// cancel.lua

/// `cancel.lua`: a producer stops waiting for some requests; the ones nobody waits for
/// any more are withdrawn. Replies with how many were withdrawn.
pub(crate) struct Cancel<'a> {
    pub(crate) producer: &'a str,
}

/// One request of a [`Cancel`] batch.
pub(crate) struct CancelRequest<'a> {
    pub(crate) rid: &'a str,
    /// The stream entry of a request without an index; `None` for an indexed one
    /// (the index names its entry and its waiters).
    pub(crate) sid: Option<&'a str>,
}

impl Cancel<'_> {
    pub(crate) fn call<'s, 'r>(
        &self,
        s: &'s Scripts,
        requests: impl IntoIterator<Item = CancelRequest<'r>>,
    ) -> ScriptCall<'s, u64> {
        let k = &s.keys;
        let mut c = ScriptCall::new(&s.cancel, &[&k.stream, &k.req_prefix], count_reply);
        c.arg(&k.group).arg(self.producer);
        for r in requests {
            c.arg(r.rid).arg(r.sid.unwrap_or(""));
        }
        c
    }
}

fn count_reply(v: Value) -> RedisResult<u64> {
    Ok(redis::from_redis_value(v)?)
}

// ---------------------------------------------------------------------------------
// forget.lua

/// `forget.lua`: forgets request `rid`'s cached outcome if it is still `outcome` (a stored
/// answer found gone). Replies whether it did.
pub(crate) struct Forget<'a> {
    pub(crate) rid: &'a str,
    /// The encoded outcome, as read.
    pub(crate) outcome: &'a [u8],
}

impl Forget<'_> {
    pub(crate) fn call<'s>(&self, s: &'s Scripts) -> ScriptCall<'s, u64> {
        let key = s.keys.req(self.rid);
        let mut c = ScriptCall::new(&s.forget, &[&key], count_reply);
        c.arg(self.outcome);
        c
    }
}

// ---------------------------------------------------------------------------------
// watch.lua

/// `watch.lua`: a producer waits on request `rid` without submitting it.
pub(crate) struct Watch<'a> {
    pub(crate) rid: &'a str,
    pub(crate) producer: &'a str,
}

/// What a [`Watch`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchAnswer {
    /// Finished: its recorded outcome.
    Finished(Outcome),
    /// In flight; the producer is among its waiters now.
    Joined,
    /// Redis knows nothing of it.
    Unknown,
}

impl Watch<'_> {
    pub(crate) fn call<'s>(&self, s: &'s Scripts) -> ScriptCall<'s, WatchAnswer> {
        let key = s.keys.req(self.rid);
        let mut c = ScriptCall::new(&s.watch, &[&key], watch_reply);
        c.arg(self.producer);
        c
    }
}

fn watch_reply(v: Value) -> RedisResult<WatchAnswer> {
    let a: Vec<u8> = redis::from_redis_value(v)?;
    match a.as_slice() {
        b"" => Ok(WatchAnswer::Unknown),
        b"=" => Ok(WatchAnswer::Joined),
        _ => Outcome::decode(&a)
            .map(WatchAnswer::Finished)
            .ok_or_else(|| unexpected("unexpected answer from watch.lua", &Value::BulkString(a))),
    }
}

mod call;
mod consumer;
pub(crate) mod library;
mod upkeep;
pub(crate) use consumer::{Complete, CompleteEntry, Completed, Reclaim, Reject, Release, Renew};
pub use upkeep::JanitorReport;
pub(crate) use upkeep::{Janitor, Requeue};
#[cfg(test)]
mod tests;
