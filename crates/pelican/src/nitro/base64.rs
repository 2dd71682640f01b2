//! Standard base64 (RFC 4648, with padding), as Go's `encoding/json` writes `[]byte`, by
//! the `base64` crate. Decoding is strict, as Go's is: wrong characters, wrong padding or
//! stray bits are errors, not silently accepted.

use ::base64::engine::general_purpose::STANDARD;
use ::base64::Engine as _;

/// Encodes `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decodes standard base64 with padding.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(text)
        .map_err(|e| format!("bad base64: {e}"))
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
