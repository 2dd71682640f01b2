//! Request stream entries: the names of their fields, their head, and the request they
//! carry. (A stream entry as Redis returns it, and the RESP values it arrives in, are the
//! connections' business: `conn/reply.rs`.)

use super::head::{EntryHead, HEAD_FIELD};
use crate::codec::{Codec, CodecError};
#[cfg(test)]
pub(crate) use crate::conn::reply::read_into_entries;
pub(crate) use crate::conn::reply::{
    array, bytes, field_u64, fields, int, parse_entries, string, RawEntry,
};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// The names of the fields of a request entry (docs/PROTOCOL.md, "Entries"), those of
/// the layout before `head` included (still read): a stream read hands these out as
/// static `Bytes` ([`RequestFields`]), neither copied nor counted.
pub(crate) const FIELD_NAMES: [&[u8]; 9] = [
    b"head",
    b"rid",
    b"from",
    b"deadline",
    b"at",
    b"index",
    b"body",
    b"tp",
    b"bref",
];

/// A request entry's field names, for a stream read (`conn::wire::read_streams`).
pub(crate) struct RequestFields;

impl crate::conn::wire::FieldNames for RequestFields {
    const NAMES: &'static [&'static [u8]] = &FIELD_NAMES;
}

impl RawEntry {
    /// The request's head, from its `head` field or, in the layout before it, from the
    /// fields `rid`, `from`, `deadline`, `at` and `index` (a missing or non-UTF-8 one read
    /// as empty); `None` for a `head` that is not one (not UTF-8, not five parts).
    pub(crate) fn head(&self) -> Option<EntryHead<'_>> {
        match self.get(HEAD_FIELD) {
            Some(h) => std::str::from_utf8(h).ok().and_then(EntryHead::parse),
            None => {
                let part = |name| self.get_str(name).unwrap_or("");
                Some(EntryHead {
                    rid: part("rid"),
                    from: part("from"),
                    deadline: part("deadline"),
                    at: part("at"),
                    index: part("index"),
                })
            }
        }
    }

    /// The request id the entry carries, if any (see [`RawEntry::head`]).
    pub(crate) fn rid(&self) -> Option<&str> {
        self.head().map(|h| h.rid).filter(|r| !r.is_empty())
    }
}

/// A whole number written in decimal digits (nothing else: no sign, no spaces), as the
/// entries' times are; `None` for anything else or a number past `u64`.
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// The largest body (in bytes) of an entry that, once finished, may be left in the stream
/// for `complete.lua`'s trim instead of being deleted on its own.
pub(crate) const SMALL_ENTRY_BODY: usize = 1024;

/// The request an entry carries, checked.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) rid: Arc<str>,
    pub(crate) from: Arc<str>,
    pub(crate) indexed: bool,
    /// Its body was stored beside the stream (field `bref`), fetched by the reader.
    pub(crate) stored_body: bool,
    /// The entry is small: its body is stored, or in the entry and at most
    /// [`SMALL_ENTRY_BODY`] bytes (see `complete.lua`: it may wait for a trim).
    pub(crate) small: bool,
    pub(crate) deadline_ms: u64,
    pub(crate) submitted_ms: u64,
    /// As read: a small body shares its read's buffer, a large one has its own (see
    /// [`Request::decode_body`]).
    pub(crate) body: Bytes,
}

/// The producers of the entries one reader turns into requests, the last one kept:
/// consecutive entries mostly come from the same producer, whose id is then shared
/// instead of allocated for each.
#[derive(Default)]
pub(crate) struct Producers(Option<Arc<str>>);

impl Producers {
    fn get(&mut self, id: &str) -> Arc<str> {
        match &self.0 {
            Some(p) if &**p == id => p.clone(),
            _ => self.0.insert(id.into()).clone(),
        }
    }
}

impl Request {
    /// The request, or the reason the entry must be dead-lettered.
    pub(crate) fn from_entry(
        e: RawEntry,
        max_body: usize,
        producers: &mut Producers,
    ) -> Result<Request, String> {
        if e.fields.is_empty() {
            return Err("the entry has no fields (deleted from the stream while pending?)".into());
        }
        // The entry's head: one field, or five in the layout before it (still served,
        // for entries written by an earlier build); the reasons name where each part was.
        let (rid_what, deadline_what) = match e.get(HEAD_FIELD) {
            Some(_) => (
                "request id in its 'head' field",
                "deadline in its 'head' field",
            ),
            None => ("'rid' field", "'deadline' field"),
        };
        let h = e.head().ok_or(
            "entry has a malformed 'head' field (not <rid>;<from>;<deadline>;<at>;<index>)",
        )?;
        let rid = Some(h.rid)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| format!("entry has no valid {rid_what}"))?;
        // The rules a producer's ids follow; anything else was written by someone else,
        // and an id becomes part of a key name.
        super::request_id::validate_request_id(rid)
            .map_err(|e| format!("entry has an invalid {rid_what}: {}", e.message()))?;
        let rid: Arc<str> = rid.into();
        let from = producers.get(h.from);
        let indexed = h.index == "1";
        let deadline_ms = digits(h.deadline.as_bytes()).ok_or_else(|| {
            format!("entry has no valid {deadline_what} (milliseconds since the epoch)")
        })?;
        let submitted_ms = digits(h.at.as_bytes()).unwrap_or(0);
        let stored_body = e.get("bref") == Some(b"1");
        let body_len = e.get("body").map(<[u8]>::len);
        match body_len {
            None if stored_body => {
                return Err(
                    "the entry's stored body is gone (its key expired or was deleted)".to_string(),
                )
            }
            None => return Err("entry has no 'body' field".to_string()),
            Some(n) if n > max_body => {
                return Err(format!(
                    "body of {n} bytes exceeds max_body_bytes {max_body}"
                ))
            }
            _ => {}
        }
        let body = e
            .fields
            .into_iter()
            .find(|(k, _)| k == &b"body"[..])
            .map(|(_, v)| v)
            .unwrap_or_default();
        Ok(Request {
            rid,
            from,
            indexed,
            stored_body,
            small: stored_body || body.len() <= SMALL_ENTRY_BODY,
            deadline_ms,
            submitted_ms,
            body,
        })
    }

    /// Decodes the body, taken out of the request: one with a buffer of its own (a large
    /// body) is handed over, for a codec that can keep it ([`Codec::decode_owned`]); one
    /// that shares its read's buffer is decoded where it lies, not copied first.
    pub(crate) fn decode_body<C: Codec, T: DeserializeOwned>(&mut self) -> Result<T, CodecError> {
        let body = std::mem::take(&mut self.body);
        if body.is_unique() {
            C::decode_owned(Vec::from(body))
        } else {
            C::decode(&body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::reply::read_into_streams;
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entries(id: &str, k: &str, v: &str) -> Value {
        Value::Array(vec![Value::Array(vec![
            bulk(id),
            Value::Array(vec![bulk(k), bulk(v)]),
        ])])
    }

    /// An XREAD of several streams keeps each stream's entries apart, in RESP2 (an
    /// array of [name, entries]) and RESP3 (a map) alike; a timed-out block is empty.
    #[test]
    fn a_read_of_several_streams_is_split_by_stream() {
        let resp2 = Value::Array(vec![
            Value::Array(vec![bulk("a"), entries("1-0", "r1", "O1")]),
            Value::Array(vec![bulk("b"), entries("2-0", "r2", "O2")]),
        ]);
        let resp3 = Value::Map(vec![
            (bulk("a"), entries("1-0", "r1", "O1")),
            (bulk("b"), entries("2-0", "r2", "O2")),
        ]);
        for v in [resp2, resp3] {
            let got = read_into_streams(v);
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].0, b"a");
            assert_eq!(&*got[0].1[0].id, "1-0");
            assert_eq!(
                got[0].1[0].fields,
                vec![(Bytes::from_static(b"r1"), Bytes::from_static(b"O1"))]
            );
            assert_eq!(got[1].0, b"b");
            assert_eq!(&*got[1].1[0].id, "2-0");
        }
        assert!(read_into_streams(Value::Nil).is_empty());
    }

    /// The names a stream read hands out as static are the entry's fields, the trace
    /// context's included (that docs/PROTOCOL.md names each: `tests/it/docs.rs`).
    #[test]
    fn the_static_field_names_are_the_entry_fields() {
        assert!(FIELD_NAMES.contains(&crate::trace::FIELD.as_bytes()));
        let names: Vec<&str> = FIELD_NAMES
            .iter()
            .map(|n| std::str::from_utf8(n).unwrap())
            .collect();
        assert_eq!(
            names,
            ["head", "rid", "from", "deadline", "at", "index", "body", "tp", "bref"],
            "a new field: name it in docs/PROTOCOL.md and in tests/it/docs.rs"
        );
    }

    /// Times in entries are plain decimal digits: anything else is not a time.
    #[test]
    fn an_entry_time_is_digits_only() {
        assert_eq!(digits(b"0"), Some(0));
        assert_eq!(digits(b"1796207331130"), Some(1_796_207_331_130));
        assert_eq!(digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"+5",
            b"-1",
            b" 5",
            b"5 ",
            b"1.5",
            b"x",
        ] {
            assert_eq!(digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
