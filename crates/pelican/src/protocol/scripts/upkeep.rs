//! The typed calls of the scripts that keep a queue rather than move its requests:
//! `janitor.lua` (trim, expiry, consumer clean-up) and `requeue.lua` (dead letters back).

use super::*;

// ---------------------------------------------------------------------------------
// janitor.lua

/// What one janitor run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JanitorReport {
    /// False when another process holds the janitor lock for this interval.
    pub ran: bool,
    /// Stream entries trimmed below the oldest pending one.
    pub trimmed: u64,
    /// Undelivered entries past their deadline, deleted and answered "expired".
    pub expired: u64,
    /// Consumers that owned nothing and were idle past `consumer_gc_after`, removed.
    pub consumers_removed: u64,
}

/// `janitor.lua`: trims the stream, expires undelivered entries past their deadline and
/// removes gone consumers, unless another run holds the lock for this interval.
pub(crate) struct Janitor<'a> {
    pub(crate) now_ms: u64,
    /// Lifetime of the lock: one run per interval.
    pub(crate) interval_ms: u64,
    /// Who runs it (the lock's value).
    pub(crate) runner: &'a str,
    pub(crate) consumer_gc_after_ms: u64,
    pub(crate) result_ttl_ms: u64,
    pub(crate) reply_maxlen: usize,
    /// How many undelivered entries to check for expiry.
    pub(crate) scan: usize,
}

impl Janitor<'_> {
    pub(crate) fn call<'s>(&self, s: &'s Scripts) -> ScriptCall<'s, JanitorReport> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.janitor,
            &[&k.stream, &k.req_prefix, &k.reply_prefix, &k.janitor_lock],
            janitor_reply,
        );
        c.arg(&k.group)
            .arg(self.now_ms)
            .arg(self.interval_ms)
            .arg(self.runner)
            .arg(self.consumer_gc_after_ms)
            .arg(self.result_ttl_ms)
            .arg(self.reply_maxlen)
            .arg(self.scan);
        c
    }
}

fn janitor_reply(v: Value) -> RedisResult<JanitorReport> {
    let n: Vec<u64> = redis::from_redis_value(v)?;
    match n[..] {
        [ran, trimmed, expired, consumers_removed] => Ok(JanitorReport {
            ran: ran == 1,
            trimmed,
            expired,
            consumers_removed,
        }),
        _ => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected reply from janitor.lua",
            format!("{n:?}"),
        ))),
    }
}

// ---------------------------------------------------------------------------------
// requeue.lua

/// `requeue.lua`: puts dead letters back as fresh requests with deadline `deadline_ms`.
/// Replies, per dead letter, the new stream entry (`None`: no such letter, or it had no
/// body).
pub(crate) struct Requeue {
    pub(crate) now_ms: u64,
    pub(crate) deadline_ms: u64,
    /// How long a new index outlives the deadline.
    pub(crate) result_ttl_ms: u64,
}

impl Requeue {
    pub(crate) fn call<'s, 'i>(
        &self,
        s: &'s Scripts,
        dead_letters: impl IntoIterator<Item = &'i str>,
    ) -> ScriptCall<'s, Vec<(String, Option<String>)>> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.requeue,
            &[&k.stream, &k.dead, &k.req_prefix],
            requeue_reply,
        );
        c.arg(self.now_ms)
            .arg(self.deadline_ms)
            .arg(self.result_ttl_ms);
        for id in dead_letters {
            c.arg(id);
        }
        c
    }
}

fn requeue_reply(v: Value) -> RedisResult<Vec<(String, Option<String>)>> {
    let flat: Vec<String> = redis::from_redis_value(v)?;
    if !flat.len().is_multiple_of(2) {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected reply from requeue.lua",
            format!("{flat:?}"),
        )));
    }
    Ok(flat
        .chunks(2)
        .map(|c| (c[0].clone(), Some(c[1].clone()).filter(|s| !s.is_empty())))
        .collect())
}
