//! What Redis replies, read: stream entries (their id and raw field/value pairs) and the
//! RESP values replies arrive in.

use bytes::Bytes;
use redis::Value;
use std::sync::Arc;

/// One stream entry: its id and its raw field/value pairs. The names and values are
/// `Bytes`: read by the lean reader, the small ones of a reply share a few buffers
/// (`wire::read_streams`) instead of an allocation each. The id is shared as it
/// is read: a delivery keeps it to the end (lease, outcome) without a copy.
#[derive(Debug, Clone)]
pub(crate) struct RawEntry {
    pub(crate) id: Arc<str>,
    pub(crate) fields: Vec<(Bytes, Bytes)>,
}

impl RawEntry {
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| &v[..])
    }

    /// Bytes of its field names and values.
    pub(crate) fn size(&self) -> usize {
        self.fields.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// The mean [`RawEntry::size`] of `entries`; `None` for none.
    pub(crate) fn mean_size(entries: &[RawEntry]) -> Option<usize> {
        let total: usize = entries.iter().map(RawEntry::size).sum();
        total.checked_div(entries.len())
    }

    pub(crate) fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

pub(crate) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn string(v: &Value) -> Option<String> {
    match v {
        Value::Int(i) => Some(i.to_string()),
        _ => bytes(v).map(|b| String::from_utf8_lossy(b).into_owned()),
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => bytes(v).and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()),
    }
}

pub(crate) fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// The name/value pairs of a RESP map (RESP3) or flat array (RESP2), e.g. an XINFO reply.
pub(crate) fn fields(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((string(k)?, v.clone())))
            .collect(),
        _ => array(v)
            .chunks(2)
            .filter_map(|c| Some((string(c.first()?)?, c.get(1)?.clone())))
            .collect(),
    }
}

/// The non-negative integer named `name` among `fields` (0 when absent).
pub(crate) fn field_u64(fields: &[(String, Value)], name: &str) -> u64 {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| int(v))
        .unwrap_or(0)
        .max(0) as u64
}

/// Parses `[[id, [field, value, ...]], ...]` (XRANGE, XCLAIM, one stream of XREAD).
/// Entries without fields (deleted while pending) come back with no fields.
pub(crate) fn parse_entries(v: &Value) -> Vec<RawEntry> {
    array(v)
        .iter()
        .filter_map(|e| {
            let parts = array(e);
            let id = string(parts.first()?)?.into();
            let flat = parts.get(1).map(array).unwrap_or(&[]);
            let fields = flat
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some((
                        Bytes::copy_from_slice(bytes(k)?),
                        Bytes::copy_from_slice(bytes(v)?),
                    )),
                    _ => None,
                })
                .collect();
            Some(RawEntry { id, fields })
        })
        .collect()
}

pub(crate) fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

pub(crate) fn into_array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => Vec::new(),
    }
}

/// [`parse_entries`], taking the reply: field names and values are moved, not copied.
pub(crate) fn into_entries(v: Value) -> Vec<RawEntry> {
    into_array(v)
        .into_iter()
        .filter_map(|e| {
            let mut parts = into_array(e).into_iter();
            let id = String::from_utf8(into_bytes(parts.next()?)?).ok()?.into();
            let mut flat = parts.next().map(into_array).unwrap_or_default().into_iter();
            let mut fields = Vec::with_capacity(flat.len() / 2);
            while let (Some(k), Some(v)) = (flat.next(), flat.next()) {
                if let (Some(k), Some(v)) = (into_bytes(k), into_bytes(v)) {
                    fields.push((k.into(), v.into()));
                }
            }
            Some(RawEntry { id, fields })
        })
        .collect()
}

/// Parses an XREAD/XREADGROUP reply for one stream (nil when the block timed out), taking
/// it. For the scripts' tests: the library's stream reads go through
/// `wire::read_streams` (lean connections) or [`read_into_streams`].
#[cfg(test)]
pub(crate) fn read_into_entries(v: Value) -> Vec<RawEntry> {
    match v {
        Value::Nil => Vec::new(),
        Value::Map(m) => m
            .into_iter()
            .flat_map(|(_, entries)| into_entries(entries))
            .collect(),
        _ => into_array(v)
            .into_iter()
            .flat_map(|s| {
                into_array(s)
                    .into_iter()
                    .nth(1)
                    .map(into_entries)
                    .unwrap_or_default()
            })
            .collect(),
    }
}

/// Parses an XREAD reply for several streams (nil when the block timed out), taking it:
/// each stream's name with its entries, in the order of the reply.
pub(crate) fn read_into_streams(v: Value) -> Vec<(Vec<u8>, Vec<RawEntry>)> {
    match v {
        Value::Nil => Vec::new(),
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, entries)| Some((into_bytes(k)?, into_entries(entries))))
            .collect(),
        _ => into_array(v)
            .into_iter()
            .filter_map(|s| {
                let mut parts = into_array(s).into_iter();
                let key = into_bytes(parts.next()?)?;
                Some((key, parts.next().map(into_entries).unwrap_or_default()))
            })
            .collect(),
    }
}
