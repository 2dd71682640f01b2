//! The value of a request's state key `req:<rid>` (dedup on), read and written in Rust
//! only here; the scripts' twin is `lib.lua`'s `index_*` helpers (keep the two in step).
//!
//! - pending: `P<stream id>;<deadline>;<producer>;<producer>;...`: the entry that carries
//!   the request, its deadline (ms since the epoch, in digits), then every producer
//!   waiting for its outcome, each followed by `;` (none after a requeue). Producer ids
//!   contain no `;`.
//! - done: an [`Outcome`] (a tag byte other than `P`, then the payload).
//!
//! Anything else (or a key of another type) was written by someone else: the scripts
//! replace it as if the key were absent.

use super::outcome::Outcome;

/// A decoded `req:<rid>` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IndexValue {
    /// In flight.
    Pending(PendingIndex),
    /// Finished: the cached outcome.
    Done(Outcome),
}

/// The state of a request in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingIndex {
    /// The stream entry that carries it.
    pub(crate) sid: String,
    /// Its deadline, ms since the epoch.
    pub(crate) deadline_ms: u64,
    /// The producers waiting for its outcome.
    pub(crate) waiters: Vec<String>,
}

impl IndexValue {
    /// Decodes a stored value; `None` for anything pelican did not write.
    pub(crate) fn decode(bytes: &[u8]) -> Option<IndexValue> {
        match bytes.split_first()? {
            (b'P', rest) => PendingIndex::decode(rest).map(IndexValue::Pending),
            _ => Outcome::decode(bytes).map(IndexValue::Done),
        }
    }
}

impl PendingIndex {
    /// What follows the `P`, as `lib.lua`'s `index_parse` reads it: `<sid>;<digits>;`
    /// then the waiters, each ended by `;` (a last one without is not counted).
    fn decode(rest: &[u8]) -> Option<PendingIndex> {
        let text = std::str::from_utf8(rest).ok()?;
        let (sid, rest) = text.split_once(';')?;
        let (deadline, waiters) = rest.split_once(';')?;
        if deadline.is_empty() || !deadline.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let waiters = waiters.rsplit_once(';').map_or("", |(w, _)| w);
        Some(PendingIndex {
            sid: sid.to_string(),
            deadline_ms: deadline.parse().ok()?,
            waiters: waiters
                .split(';')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    /// Whether `producer` is among the waiters.
    pub(crate) fn has_waiter(&self, producer: &str) -> bool {
        self.waiters.iter().any(|w| w == producer)
    }

    /// The stored form (as `lib.lua`'s `index_pending` and `index_add_waiter` write it).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = format!("P{};{};", self.sid, self.deadline_ms);
        for w in &self.waiters {
            v.push_str(w);
            v.push(';');
        }
        v.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_values_round_trip() {
        let p = PendingIndex {
            sid: "1700000000000-0".into(),
            deadline_ms: 1_700_000_300_000,
            waiters: vec!["p1".into(), "p2".into()],
        };
        assert_eq!(p.encode(), b"P1700000000000-0;1700000300000;p1;p2;");
        assert_eq!(
            IndexValue::decode(&p.encode()),
            Some(IndexValue::Pending(p.clone()))
        );
        assert!(p.has_waiter("p2") && !p.has_waiter("p"));
        // A requeued dead letter has no waiters.
        let lone = IndexValue::decode(b"P1-0;5;").unwrap();
        assert_eq!(
            lone,
            IndexValue::Pending(PendingIndex {
                sid: "1-0".into(),
                deadline_ms: 5,
                waiters: vec![]
            })
        );
    }

    #[test]
    fn outcomes_and_garbage() {
        let ok = Outcome::Ok(b"{}".to_vec());
        assert_eq!(IndexValue::decode(&ok.encode()), Some(IndexValue::Done(ok)));
        assert_eq!(IndexValue::decode(b""), None);
        assert_eq!(IndexValue::decode(b"Zzz"), None);
        assert_eq!(IndexValue::decode(b"Pnosemicolon"), None);
        // The deadline is digits, as the scripts read it; a value without it is foreign.
        assert_eq!(IndexValue::decode(b"P1-0;abc;p1;"), None);
        assert_eq!(IndexValue::decode(b"P1-0;;p1;"), None);
        assert_eq!(IndexValue::decode(b"P1-0;5"), None);
        // A waiter counts once it is ended by ';' (index_waiters in lib.lua).
        let IndexValue::Pending(p) = IndexValue::decode(b"P1-0;5;p1;p2").unwrap() else {
            panic!("pending")
        };
        assert_eq!(p.waiters, vec!["p1".to_string()]);
    }
}
