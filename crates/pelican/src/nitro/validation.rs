//! Nitro's block-validation request and response, as Go's `encoding/json` writes them:
//! fields in PascalCase and in the Go structs' order, `[]byte` as standard base64,
//! hashes as `0x` + 64 lowercase hex digits, map keys sorted. Use them with
//! [`Consumer`](super::Consumer) and [`Producer`](super::Producer) on a stream named
//! `stream:<module root>` (`<prefix>stream:0x…`).
//!
//! ```
//! use pelican::nitro::validation::{GoGlobalState, Hash};
//! let json = r#"{"BlockHash":"0x0000000000000000000000000000000000000000000000000000000000000001","SendRoot":"0x0000000000000000000000000000000000000000000000000000000000000002","Batch":7,"PosInBatch":3}"#;
//! let s: GoGlobalState = serde_json::from_str(json).unwrap();
//! assert_eq!(s.batch, 7);
//! assert_eq!(s.block_hash, "0x0000000000000000000000000000000000000000000000000000000000000001".parse::<Hash>().unwrap());
//! assert_eq!(serde_json::to_string(&s).unwrap(), json);
//! ```

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Serde helpers for `Vec<u8>` fields in Go's `[]byte` form (standard base64; `null`
/// reads as empty): `#[serde(with = "pelican::nitro::validation::bytes")]`.
pub use super::base64::serde_bytes as bytes;

/// A 32-byte hash (`common.Hash`), written `0x` + 64 lowercase hex digits.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hash(pub [u8; 32]);

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0x")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Hash {
    type Err = String;

    /// `0x` followed by exactly 64 hex digits (either case, as Go accepts).
    fn from_str(s: &str) -> Result<Hash, String> {
        let hex = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .ok_or_else(|| format!("hash {s:?} does not start with 0x"))?;
        if hex.len() != 64 {
            return Err(format!(
                "hash {s:?} has {} hex digits, 64 expected",
                hex.len()
            ));
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => out[i] = h << 4 | l,
                _ => return Err(format!("hash {s:?} is not hexadecimal")),
            }
        }
        Ok(Hash(out))
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `[]byte` as Go writes it: standard base64 (`null` reads as empty).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        bytes::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        bytes::deserialize(d).map(Bytes)
    }
}

/// The state a block validation starts from and ends at (`validator.GoGlobalState`): the
/// response of a validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoGlobalState {
    /// `BlockHash`.
    #[serde(rename = "BlockHash")]
    pub block_hash: Hash,
    /// `SendRoot`.
    #[serde(rename = "SendRoot")]
    pub send_root: Hash,
    /// `Batch`.
    #[serde(rename = "Batch")]
    pub batch: u64,
    /// `PosInBatch`.
    #[serde(rename = "PosInBatch")]
    pub pos_in_batch: u64,
}

/// One sequencer batch a validation reads (`validator.BatchInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchInfo {
    /// `Number`.
    #[serde(rename = "Number")]
    pub number: u64,
    /// `Data`, base64.
    #[serde(rename = "Data")]
    pub data: Bytes,
}

/// A block-validation request (`validator.ValidationInput`), as the validator client's
/// producer writes it into `msg`. Can be many MB.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationInput {
    /// `Id`.
    #[serde(rename = "Id")]
    pub id: u64,
    /// `HasDelayedMsg`.
    #[serde(rename = "HasDelayedMsg")]
    pub has_delayed_msg: bool,
    /// `DelayedMsgNr`.
    #[serde(rename = "DelayedMsgNr")]
    pub delayed_msg_nr: u64,
    /// `Preimages`: preimage type (a decimal string key) → hash → preimage.
    #[serde(rename = "Preimages", deserialize_with = "null_as_default")]
    pub preimages: BTreeMap<u8, BTreeMap<Hash, Bytes>>,
    /// `UserWasms`: target (e.g. `wavm`) → module hash → compiled module.
    #[serde(rename = "UserWasms", deserialize_with = "null_as_default")]
    pub user_wasms: BTreeMap<String, BTreeMap<Hash, Bytes>>,
    /// `BatchInfo`.
    #[serde(rename = "BatchInfo", deserialize_with = "null_as_default")]
    pub batch_info: Vec<BatchInfo>,
    /// `DelayedMsg`, base64.
    #[serde(rename = "DelayedMsg")]
    pub delayed_msg: Bytes,
    /// `StartState`.
    #[serde(rename = "StartState")]
    pub start_state: GoGlobalState,
    /// `DebugChain`.
    #[serde(rename = "DebugChain")]
    pub debug_chain: bool,
}

/// Go writes a nil map or slice as `null`.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(last: u8) -> Hash {
        let mut b = [0u8; 32];
        b[0] = 0xab;
        b[31] = last;
        Hash(b)
    }

    /// What Go's `json.Marshal` writes for this input (struct field order, compact,
    /// maps sorted by key, `[]byte` as standard base64, hashes as lowercase 0x-hex).
    const GO_JSON: &str = concat!(
        r#"{"Id":42,"HasDelayedMsg":true,"DelayedMsgNr":7,"#,
        r#""Preimages":{"0":{"0xab00000000000000000000000000000000000000000000000000000000000001":"AAEC","#,
        r#""0xab000000000000000000000000000000000000000000000000000000000000ff":"/w=="}},"#,
        r#""UserWasms":{"wavm":{"0xab00000000000000000000000000000000000000000000000000000000000002":"AGFzbQ=="}},"#,
        r#""BatchInfo":[{"Number":3,"Data":"aGVsbG8="}],"DelayedMsg":"+/8=","#,
        r#""StartState":{"BlockHash":"0xab00000000000000000000000000000000000000000000000000000000000010","#,
        r#""SendRoot":"0xab00000000000000000000000000000000000000000000000000000000000020","Batch":3,"PosInBatch":1},"#,
        r#""DebugChain":false}"#
    );

    fn input() -> ValidationInput {
        ValidationInput {
            id: 42,
            has_delayed_msg: true,
            delayed_msg_nr: 7,
            preimages: BTreeMap::from([(
                0,
                BTreeMap::from([(h(0xff), Bytes(vec![0xff])), (h(1), Bytes(vec![0, 1, 2]))]),
            )]),
            user_wasms: BTreeMap::from([(
                "wavm".to_string(),
                BTreeMap::from([(h(2), Bytes(b"\0asm".to_vec()))]),
            )]),
            batch_info: vec![BatchInfo {
                number: 3,
                data: Bytes(b"hello".to_vec()),
            }],
            delayed_msg: Bytes(vec![0xfb, 0xff]),
            start_state: GoGlobalState {
                block_hash: h(0x10),
                send_root: h(0x20),
                batch: 3,
                pos_in_batch: 1,
            },
            debug_chain: false,
        }
    }

    #[test]
    fn matches_gos_encoding_both_ways() {
        assert_eq!(serde_json::to_string(&input()).unwrap(), GO_JSON);
        let back: ValidationInput = serde_json::from_str(GO_JSON).unwrap();
        assert_eq!(back, input());
    }

    #[test]
    fn go_nils_and_uppercase_hex_are_read() {
        let json = r#"{"Id":1,"HasDelayedMsg":false,"DelayedMsgNr":0,"Preimages":null,"UserWasms":null,"BatchInfo":null,"DelayedMsg":null,"StartState":{"BlockHash":"0xAB00000000000000000000000000000000000000000000000000000000000010","SendRoot":"0x0000000000000000000000000000000000000000000000000000000000000000","Batch":0,"PosInBatch":0},"DebugChain":false}"#;
        let v: ValidationInput = serde_json::from_str(json).unwrap();
        assert!(v.preimages.is_empty() && v.batch_info.is_empty() && v.delayed_msg.0.is_empty());
        assert_eq!(v.start_state.block_hash, h(0x10));
    }

    #[test]
    fn bad_hashes_and_base64_are_errors() {
        for bad in ["ab", "0x12", &format!("0x{}", "g".repeat(64))] {
            assert!(bad.parse::<Hash>().is_err(), "{bad}");
        }
        let bad = GO_JSON.replace("aGVsbG8=", "aGVsbG8");
        assert!(serde_json::from_str::<ValidationInput>(&bad).is_err());
    }
}
