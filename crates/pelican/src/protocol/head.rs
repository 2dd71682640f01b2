//! A request entry's `head` field: the request's own facts in one value.

use std::fmt;

/// The name of a request entry's `head` field: its request id, producer, deadline,
/// submission time and index flag in one value, `<rid>;<from>;<deadline>;<at>;<index>`
/// (docs/PROTOCOL.md, "Entries"). One field where there were five: every field is an
/// argument Redis parses and stores on `XADD` and a name and a value it writes into
/// every read of the entry, and the five cost Redis a sixth of its instructions per
/// request without dedup.
pub const HEAD_FIELD: &str = "head";

/// A request entry's `head` field, split into its parts as written (nothing checked:
/// the consumer checks each part before it serves the entry). The request id comes
/// first and may itself hold `;`, so the other parts are taken from the right; a
/// producer's id never holds one.
///
/// ```
/// use pelican::admin::EntryHead;
/// let h = EntryHead::parse("r;1;p7;1796207341130;1796207331130;0").unwrap();
/// assert_eq!(h.rid, "r;1");
/// assert_eq!(h.from, "p7");
/// assert_eq!(h.deadline, "1796207341130");
/// assert_eq!(h.at, "1796207331130");
/// assert_eq!(h.index, "0");
/// assert!(EntryHead::parse("r1;p7;1796207341130").is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHead<'a> {
    /// The request id.
    pub rid: &'a str,
    /// The submitting producer's id (its reply stream).
    pub from: &'a str,
    /// The deadline, milliseconds since the epoch in decimal digits.
    pub deadline: &'a str,
    /// The submission time, milliseconds since the epoch in decimal digits (anything else
    /// reads as unknown).
    pub at: &'a str,
    /// `1` when a `req:<rid>` key tracks the request (dedup on), `0` otherwise.
    pub index: &'a str,
}

impl<'a> EntryHead<'a> {
    /// The parts of `head`; `None` unless it has all five (four `;` at least).
    pub fn parse(head: &'a str) -> Option<EntryHead<'a>> {
        // By hand, byte by byte from the end: `rsplitn`'s searcher was 4 % of a
        // worker's instructions per request. `;` is ASCII, so every cut is on a char
        // boundary.
        let bytes = head.as_bytes();
        let mut end = head.len();
        let mut cut = || {
            let at = bytes[..end].iter().rposition(|&b| b == b';')?;
            let part = &head[at + 1..end];
            end = at;
            Some(part)
        };
        let index = cut()?;
        let at = cut()?;
        let deadline = cut()?;
        let from = cut()?;
        Some(EntryHead {
            rid: &head[..end],
            from,
            deadline,
            at,
            index,
        })
    }
}

/// The value as written: `<rid>;<from>;<deadline>;<at>;<index>` (what `entry_head` in
/// `lib.lua` makes; the producer's XADD template writes the same from its parts).
impl fmt::Display for EntryHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let EntryHead {
            rid,
            from,
            deadline,
            at,
            index,
        } = self;
        write!(f, "{rid};{from};{deadline};{at};{index}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head is split from the right: the request id keeps its own `;`, parts may be
    /// empty, and fewer than five parts is no head.
    #[test]
    fn a_head_is_split_from_the_right() {
        let h = EntryHead::parse("a;b;c;p;1;2;1").unwrap();
        assert_eq!(
            (h.rid, h.from, h.deadline, h.at, h.index),
            ("a;b;c", "p", "1", "2", "1")
        );
        let h = EntryHead::parse(";;;;").unwrap();
        assert_eq!(
            (h.rid, h.from, h.deadline, h.at, h.index),
            ("", "", "", "", "")
        );
        let h = EntryHead::parse("é;p;1;2;0").unwrap();
        assert_eq!(h.rid, "é");
        for bad in ["", "r", "r;p;1;2", ";;;"] {
            assert_eq!(EntryHead::parse(bad), None, "{bad:?}");
        }
    }

    /// Written and split again, a head gives back its parts.
    #[test]
    fn a_head_written_splits_into_its_parts() {
        let h = EntryHead {
            rid: "r;1",
            from: "p7",
            deadline: "1796207341130",
            at: "1796207331130",
            index: "0",
        };
        let s = h.to_string();
        assert_eq!(s, "r;1;p7;1796207341130;1796207331130;0");
        assert_eq!(EntryHead::parse(&s), Some(h));
    }
}
