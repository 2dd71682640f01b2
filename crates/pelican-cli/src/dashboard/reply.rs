//! Reading Redis replies (XINFO, XPENDING, TIME) whether they come as RESP2 arrays or
//! RESP3 maps.

use redis::Value;

/// The bytes of a string reply.
pub fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

/// A string reply, or an integer as text.
pub fn string(v: &Value) -> Option<String> {
    match v {
        Value::Int(i) => Some(i.to_string()),
        _ => bytes(v).map(|b| String::from_utf8_lossy(b).into_owned()),
    }
}

/// An integer reply, or a string holding one.
pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => std::str::from_utf8(bytes(v)?).ok()?.parse().ok(),
    }
}

/// The elements of an array (or set) reply.
pub fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// The value named `name` in a RESP3 map or a flat RESP2 name/value array.
pub fn field<'v>(v: &'v Value, name: &str) -> Option<&'v Value> {
    match v {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| bytes(k) == Some(name.as_bytes()))
            .map(|(_, v)| v),
        _ => array(v)
            .chunks(2)
            .find(|kv| bytes(&kv[0]) == Some(name.as_bytes()))
            .and_then(|kv| kv.get(1)),
    }
}

/// A non-negative integer field (`None` when absent or nil).
pub fn field_u64(v: &Value, name: &str) -> Option<u64> {
    field(v, name).and_then(int).map(|i| i.max(0) as u64)
}

/// The milliseconds part of a stream id (`1700000000000-0`).
pub fn id_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use redis::Value;

    #[test]
    fn fields_are_found_in_arrays_and_maps() {
        let flat = Value::Array(vec![
            Value::BulkString(b"length".to_vec()),
            Value::Int(3),
            Value::BulkString(b"lag".to_vec()),
            Value::Nil,
        ]);
        assert_eq!(super::field_u64(&flat, "length"), Some(3));
        assert_eq!(super::field_u64(&flat, "lag"), None);
        assert_eq!(super::field_u64(&flat, "absent"), None);
        let map = Value::Map(vec![(
            Value::SimpleString("pending".into()),
            Value::BulkString(b"7".to_vec()),
        )]);
        assert_eq!(super::field_u64(&map, "pending"), Some(7));
        assert_eq!(super::id_ms("1700000000123-4"), Some(1_700_000_000_123));
        assert_eq!(super::id_ms("x"), None);
    }
}
