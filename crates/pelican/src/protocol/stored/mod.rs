//! Values stored beside the stream, one home for both kinds (docs/PROTOCOL.md, "Stored
//! bodies" and "Stored answers"):
//!
//! - A request body of [`STORED_BODY_MIN`] bytes or more (dedup on) is a plain SET sent
//!   in the same write as the submit call (the producer's lean connections,
//!   `producer/lean.rs`); the entry says so (`bref`), and the consumer's reader fetches
//!   those bodies after a read ([`stored_bodies`], [`mget_bodies`], [`attach_bodies`];
//!   `consumer/fetch.rs` splits the fetch over connections).
//! - A response of [`STORED_ANSWER_MIN`] bytes or more is stored under a new name
//!   ([`AnswerNames`]) in one transaction with the call that records its outcome
//!   ([`atomic`]); the outcome names it, and the producer fetches it
//!   (`producer/answers.rs`, [`mget_values`]).
//!
//! Each value is written by [`StoredBody`]: from where it lies on a lean connection,
//! through the client library elsewhere.

pub(crate) mod atomic;

use super::keys::Keys;
use crate::conn::framed::Framed;
use crate::conn::reply::{into_array, into_bytes, RawEntry};
use bytes::Bytes;
use redis::Value;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bodies of at least this many bytes are stored beside the stream rather than passed
/// through the submit script (dedup on; see `producer/submit.rs`, `submit_indexed`). Below it, the script's
/// cost for the body's bytes is less than the extra commands a stored body takes.
pub(crate) const STORED_BODY_MIN: usize = 4096;
/// Responses of this many bytes or more are stored beside the stream by the consumer and
/// fetched by the producer, instead of passing through `complete.lua` (docs/PROTOCOL.md,
/// "Stored answers"); the same threshold as stored request bodies ([`STORED_BODY_MIN`]).
pub(crate) const STORED_ANSWER_MIN: usize = 4096;

/// How much longer than the result ttl a stored answer is kept: a waiter told of it just
/// before its outcome expires still finds it.
pub(crate) const ANSWER_GRACE_MS: u64 = 60_000;

/// One value to store by a plain `SET <key> <body> PX <ttl_ms>` (a stored request body or
/// answer).
pub(crate) struct StoredBody<'a> {
    pub(crate) key: String,
    pub(crate) body: &'a [u8],
    pub(crate) ttl_ms: u64,
}

impl StoredBody<'_> {
    /// The SET, its body written in place.
    pub(crate) fn framed(&self) -> Framed<'_> {
        let ttl = self.ttl_ms.to_string();
        Framed::new(
            &[b"SET", self.key.as_bytes()],
            self.body,
            &[b"PX", ttl.as_bytes()],
        )
    }

    /// The SET as the client library sends it (connections that are not lean ones).
    pub(crate) fn cmd(&self) -> redis::Cmd {
        let mut c = redis::cmd("SET");
        c.arg(&self.key).arg(self.body).arg("PX").arg(self.ttl_ms);
        c
    }
}

/// The names of one consumer's stored answers (see `lib.lua`, "stored answer"): a new
/// name each time, random in part, so a name is never used twice, by this consumer or
/// another, or by this one after a restart. A call that failed on the way may have
/// recorded its outcome, and the call sent again must not delete that answer when it
/// loses.
pub(crate) struct AnswerNames {
    token: String,
    next: AtomicU64,
}

impl AnswerNames {
    pub(crate) fn new() -> AnswerNames {
        AnswerNames {
            token: crate::ids::random_id()[..16].to_string(),
            next: AtomicU64::new(1),
        }
    }

    /// A new name for a stored answer of entry `sid`.
    pub(crate) fn next(&self, sid: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("a{sid}.{}.{n}", self.token)
    }
}

/// The entries among `entries` whose body is stored beside the stream (field `bref`),
/// by index.
pub(crate) fn stored_bodies(entries: &[RawEntry]) -> Vec<usize> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.get("bref") == Some(b"1") && e.get("body").is_none())
        .map(|(i, _)| i)
        .collect()
}

/// The `MGET` of the stored bodies of `entries[i]` for each `i` in `at` (one slot: every
/// key of a partition carries its hash tag).
pub(crate) fn mget_bodies(keys: &Keys, entries: &[RawEntry], at: &[usize]) -> redis::Cmd {
    let mut cmd = redis::cmd("MGET");
    for &i in at {
        cmd.arg(keys.body(&entries[i].id));
    }
    cmd
}

/// The values of an `MGET` reply, in order (`None` where a key was missing).
pub(crate) fn mget_values(reply: Value) -> Vec<Option<Vec<u8>>> {
    into_array(reply).into_iter().map(into_bytes).collect()
}

/// Puts the bodies a [`mget_bodies`] `MGET` returned into their entries, as the
/// field `body`; a missing one (nil) is left out, and the entry is dead-lettered with
/// that reason.
pub(crate) fn attach_bodies(entries: &mut [RawEntry], at: &[usize], reply: Value) {
    for (&i, v) in at.iter().zip(into_array(reply)) {
        if let Some(b) = into_bytes(v) {
            entries[i]
                .fields
                .push((Bytes::from_static(b"body"), b.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored value's SET, written in place, is the client library's SET.
    #[test]
    fn a_stored_body_is_the_client_library_set() {
        let value = vec![7u8; 100_000];
        let set = StoredBody {
            key: "k".into(),
            body: &value,
            ttl_ms: 123,
        };
        assert_eq!(
            set.framed().parts().concat(),
            set.cmd().get_packed_command()
        );
    }

    #[test]
    fn answer_names_are_never_reused() {
        let (a, b) = (AnswerNames::new(), AnswerNames::new());
        let names = [a.next("1-0"), a.next("1-0"), b.next("1-0")];
        assert!(names.iter().all(|n| n.starts_with("a1-0.")));
        assert_ne!(names[0], names[1]);
        assert_ne!(names[0], names[2]);
    }
}
