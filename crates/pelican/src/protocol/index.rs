//! The value of a request's state key `req:<rid>` (dedup on), the one Rust reader and
//! writer of it (the scripts use `lib.lua`'s `index_*` helpers):
//!
//! - pending: `P<stream id>;<deadline ms>;<producer>;<producer>;...` (the entry that
//!   carries the request, its deadline, and the producers waiting for it);
//! - done: an [`Outcome`] (a tag byte other than `P`, then the payload).

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
    /// Its deadline, ms since the epoch (`None` if the field is not a number).
    pub(crate) deadline_ms: Option<u64>,
    /// The producers waiting for its outcome.
    pub(crate) waiters: Vec<String>,
}

impl IndexValue {
    /// Decodes a stored value; `None` for anything pelican did not write.
    pub(crate) fn decode(bytes: &[u8]) -> Option<IndexValue> {
        match bytes.split_first()? {
            (b'P', rest) => {
                let text = std::str::from_utf8(rest).ok()?;
                let mut parts = text.split(';');
                let sid = parts.next()?.to_string();
                let deadline_ms = parts.next()?.parse().ok();
                let waiters = parts
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect();
                Some(IndexValue::Pending(PendingIndex {
                    sid,
                    deadline_ms,
                    waiters,
                }))
            }
            _ => Outcome::decode(bytes).map(IndexValue::Done),
        }
    }
}

impl PendingIndex {
    /// Whether `producer` is among the waiters.
    pub(crate) fn has_waiter(&self, producer: &str) -> bool {
        self.waiters.iter().any(|w| w == producer)
    }

    /// The stored form (as `submit.lua` writes it).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = format!("P{};{};", self.sid, self.deadline_ms.unwrap_or(0));
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
            deadline_ms: Some(1_700_000_300_000),
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
                deadline_ms: Some(5),
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
    }
}
