//! The typed calls of the consumer's scripts: `complete.lua` (outcomes), `reclaim.lua`
//! (idle entries taken over or dead-lettered), `renew.lua` and `release.lua` (leases) and
//! `reject.lua` (a malformed entry dead-lettered).

use super::*;

// ---------------------------------------------------------------------------------
// complete.lua

/// `complete.lua`: records the outcomes of a batch of delivered entries (first outcome
/// wins). Replies, per entry, whether its outcome was recorded.
pub(crate) struct Complete {
    pub(crate) result_ttl_ms: u64,
    pub(crate) reply_maxlen: usize,
    pub(crate) now_ms: u64,
}

/// One entry of a [`Complete`] batch.
pub(crate) struct CompleteEntry<'a> {
    pub(crate) sid: &'a str,
    pub(crate) rid: &'a str,
    /// The producer that submitted it.
    pub(crate) from: &'a str,
    /// Its deadline (ms since the epoch): with `from`, what its index holds while the
    /// submitter alone waits, which the script compares whole before parsing it (sent
    /// only for an entry with an index).
    pub(crate) deadline_ms: u64,
    /// Whether an index tracks it (dedup on).
    pub(crate) indexed: bool,
    /// Whether its body is stored beside the stream (deleted with the entry).
    pub(crate) stored_body: bool,
    /// Small enough to be left for the trim instead of its own `XDEL`.
    pub(crate) small: bool,
    /// The encoded [`Outcome`]; for [`Outcome::Stored`], the answer is SET just before.
    pub(crate) outcome: &'a [u8],
}

impl Complete {
    pub(crate) fn call<'s, 'e>(
        &self,
        s: &'s Scripts,
        entries: impl IntoIterator<Item = CompleteEntry<'e>>,
    ) -> ScriptCall<'s, Vec<Completed>> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.complete,
            &[&k.stream, &k.req_prefix, &k.reply_prefix],
            flags_reply,
        );
        c.arg(&k.group)
            .arg(self.result_ttl_ms)
            .arg(self.reply_maxlen)
            .arg(self.now_ms);
        for e in entries {
            c.arg(e.sid).arg(e.rid).arg(e.from);
            // Read only to compare an index with: without one, nothing for Redis and Lua
            // to copy and hash.
            if e.indexed || e.stored_body {
                c.arg(e.deadline_ms);
            } else {
                c.arg("");
            }
            c.arg(flags(&e)).arg(e.outcome);
        }
        c
    }
}

/// The flags of one entry of a `complete.lua` call: its index flag, whether it is small,
/// whether its outcome is a stored answer (see the script's header).
fn flags(e: &CompleteEntry<'_>) -> &'static str {
    let index = match (e.stored_body, e.indexed) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    };
    let stored = e.outcome.first() == Some(&b'A');
    const FLAGS: [[[&str; 2]; 2]; 3] = [
        [["2-", "2-a"], ["2t", "2ta"]],
        [["1-", "1-a"], ["1t", "1ta"]],
        [["0-", "0-a"], ["0t", "0ta"]],
    ];
    FLAGS[index][usize::from(e.small)][usize::from(stored)]
}

/// What `complete.lua` did with one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completed {
    /// Recorded, and pushed to the waiters.
    Recorded,
    /// Dropped: another outcome came first (or the entry was withdrawn or dead).
    Dropped,
    /// Not done: its stored answer was not there (the SET before the call failed).
    AnswerMissing,
}

fn flags_reply(v: Value) -> RedisResult<Vec<Completed>> {
    let flags: Vec<i64> = redis::from_redis_value(v)?;
    Ok(flags
        .into_iter()
        .map(|f| match f {
            1 => Completed::Recorded,
            2 => Completed::AnswerMissing,
            _ => Completed::Dropped,
        })
        .collect())
}

// ---------------------------------------------------------------------------------
// reclaim.lua

/// `reclaim.lua`: takes over entries idle for `min_idle_ms` from `cursor` on, and
/// dead-letters the ones delivered `max_deliveries` times.
pub(crate) struct Reclaim<'a> {
    /// The consumer taking them over.
    pub(crate) consumer: &'a str,
    pub(crate) min_idle_ms: u64,
    /// Where the scan starts: a stream id, `(id` to start after it, `-` first.
    pub(crate) cursor: &'a str,
    pub(crate) count: usize,
    pub(crate) max_deliveries: u32,
    pub(crate) now_ms: u64,
    pub(crate) result_ttl_ms: u64,
    pub(crate) reply_maxlen: usize,
    pub(crate) dead_maxlen: usize,
    /// Longer values are not copied to a dead letter.
    pub(crate) max_body_bytes: usize,
    /// The consumer holds nothing: it may take an entry for its last delivery.
    pub(crate) idle: bool,
}

/// What a [`Reclaim`] call did.
#[derive(Debug, Default)]
pub(crate) struct Reclaimed {
    /// Where the next call starts (`-` when the scan wrapped).
    pub(crate) next_cursor: String,
    /// The entries taken over, with their delivery counts (this delivery included).
    pub(crate) claimed: Vec<(RawEntry, u32)>,
    /// Entries dead-lettered.
    pub(crate) dead: u64,
    /// The entry taken for its last delivery, which must run alone.
    pub(crate) solo: Option<String>,
    /// Entries left waiting for their last delivery (for a consumer with nothing in
    /// hand).
    pub(crate) waiting: u64,
}

impl Reclaim<'_> {
    pub(crate) fn call<'s>(&self, s: &'s Scripts) -> ScriptCall<'s, Reclaimed> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.reclaim,
            &[&k.stream, &k.dead, &k.req_prefix, &k.reply_prefix],
            reclaim_reply,
        );
        c.arg(&k.group)
            .arg(self.consumer)
            .arg(self.min_idle_ms)
            .arg(self.cursor)
            .arg(self.count)
            .arg(self.max_deliveries)
            .arg(self.now_ms)
            .arg(self.result_ttl_ms)
            .arg(self.reply_maxlen)
            .arg(self.dead_maxlen)
            .arg(self.max_body_bytes)
            .arg(flag(self.idle));
        c
    }
}

fn reclaim_reply(v: Value) -> RedisResult<Reclaimed> {
    let parts = entry::array(&v);
    if parts.len() != 6 {
        return Err(unexpected("unexpected reply from reclaim.lua", &v));
    }
    let counts: std::collections::HashMap<String, u32> = entry::array(&parts[2])
        .chunks(2)
        .filter_map(|c| Some((entry::string(c.first()?)?, entry::int(c.get(1)?)? as u32)))
        .collect();
    let claimed = parse_entries(&parts[1])
        .into_iter()
        .map(|e| {
            let n = counts.get(&*e.id).copied().unwrap_or(2);
            (e, n)
        })
        .collect();
    let n = |i: usize| entry::int(&parts[i]).unwrap_or(0).max(0) as u64;
    Ok(Reclaimed {
        next_cursor: entry::string(&parts[0]).unwrap_or_else(|| "-".into()),
        claimed,
        dead: n(3),
        solo: entry::string(&parts[4]).filter(|s| !s.is_empty()),
        waiting: n(5),
    })
}

// ---------------------------------------------------------------------------------
// renew.lua and release.lua

/// `renew.lua`: keeps the leases of `consumer` on the entries it still owns. Replies
/// with the ones it no longer owns.
pub(crate) struct Renew<'a> {
    pub(crate) consumer: &'a str,
}

impl Renew<'_> {
    pub(crate) fn call<'s, 'i>(
        &self,
        s: &'s Scripts,
        sids: impl IntoIterator<Item = &'i str>,
    ) -> ScriptCall<'s, Vec<String>> {
        let k = &s.keys;
        let mut c = ScriptCall::new(&s.renew, &[&k.stream], ids_reply);
        c.arg(&k.group).arg(self.consumer);
        for sid in sids {
            c.arg(sid);
        }
        c
    }
}

fn ids_reply(v: Value) -> RedisResult<Vec<String>> {
    Ok(redis::from_redis_value(v)?)
}

/// `release.lua`: hands entries `consumer` still owns back, backdated to `idle_ms` (the
/// claim idle: reclaimable at once; less: after the difference). Replies with how many
/// were released.
pub(crate) struct Release<'a> {
    pub(crate) consumer: &'a str,
    pub(crate) idle_ms: u64,
}

impl Release<'_> {
    /// Releases `sids`; none means every entry the consumer owns.
    pub(crate) fn call<'s, 'i>(
        &self,
        s: &'s Scripts,
        sids: impl IntoIterator<Item = &'i str>,
    ) -> ScriptCall<'s, u64> {
        let k = &s.keys;
        let mut c = ScriptCall::new(&s.release, &[&k.stream], count_reply);
        c.arg(&k.group).arg(self.consumer).arg(self.idle_ms);
        for sid in sids {
            c.arg(sid);
        }
        c
    }
}

// ---------------------------------------------------------------------------------
// reject.lua

/// `reject.lua`: dead-letters delivered entry `sid`, which cannot be handled, with
/// `reason`. Replies whether it did (false: the entry was no longer pending).
pub(crate) struct Reject<'a> {
    /// The consumer holding it (recorded as its last consumer).
    pub(crate) consumer: &'a str,
    pub(crate) sid: &'a str,
    pub(crate) reason: &'a str,
    pub(crate) deliveries: u32,
    pub(crate) now_ms: u64,
    pub(crate) result_ttl_ms: u64,
    pub(crate) reply_maxlen: usize,
    pub(crate) dead_maxlen: usize,
    /// Longer values are not copied to the dead letter.
    pub(crate) max_body_bytes: usize,
}

impl Reject<'_> {
    pub(crate) fn call<'s>(&self, s: &'s Scripts) -> ScriptCall<'s, bool> {
        let k = &s.keys;
        let mut c = ScriptCall::new(
            &s.reject,
            &[&k.stream, &k.dead, &k.req_prefix, &k.reply_prefix],
            |v| Ok(count_reply(v)? == 1),
        );
        c.arg(&k.group)
            .arg(self.consumer)
            .arg(self.sid)
            .arg(self.reason)
            .arg(self.deliveries)
            .arg(self.now_ms)
            .arg(self.result_ttl_ms)
            .arg(self.reply_maxlen)
            .arg(self.dead_maxlen)
            .arg(self.max_body_bytes);
        c
    }
}
