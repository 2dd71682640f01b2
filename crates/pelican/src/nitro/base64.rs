//! Standard base64 (RFC 4648, with padding), as Go's `encoding/json` writes `[]byte`:
//! a few dozen lines instead of a dependency. Decoding is strict: wrong characters,
//! wrong padding or stray bits are errors, not silently accepted.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 with padding.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let s = text.as_bytes();
    if !s.len().is_multiple_of(4) {
        return Err(format!("base64 length {} is not a multiple of 4", s.len()));
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let groups = s.len() / 4;
    for (g, chunk) in s.chunks(4).enumerate() {
        let last = g + 1 == groups;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return Err("misplaced base64 padding".into());
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = if i >= 4 - pad {
                0
            } else {
                value(c).ok_or_else(|| format!("invalid base64 character {:?}", c as char))?
            };
            n = (n << 6) | u32::from(v);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = 3 - pad;
        // The bits below the last kept byte must be zero (canonical encoding, as Go's
        // decoder demands).
        if bytes[keep..].iter().any(|&b| b != 0) {
            return Err("non-canonical base64 (stray bits before the padding)".into());
        }
        out.extend_from_slice(&bytes[..keep]);
    }
    Ok(out)
}

fn value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Serde helpers for `Vec<u8>` fields written as Go writes `[]byte`: `#[serde(with =
/// "pelican::nitro::validation::bytes")]` (re-exported there). Go writes a nil slice as
/// `null`; it is read as empty.
pub mod serde_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes standard base64.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::encode(v))
    }

    /// Reads standard base64 (or `null`, as empty).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(Vec::new()),
            Some(s) => super::decode(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(plain.as_bytes()), coded);
            assert_eq!(decode(coded).unwrap(), plain.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert_eq!(encode(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn bad_input_is_an_error() {
        for bad in [
            "Zg=", "Zg=a", "Z===", "Zh==", "Zm9v-A==", "=Zm9", "Zg==Zg==",
        ] {
            assert!(decode(bad).is_err(), "{bad}");
        }
    }
}
