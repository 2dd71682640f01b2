//! How requests and responses become bytes.

use serde::{de::DeserializeOwned, Serialize};

/// Turns typed values into bodies and back. [`Json`] is the default.
///
/// With dedup on, the request id is a hash of the encoded body, so an encoding must be
/// deterministic for equal values (JSON of a struct is; of a `HashMap` it is not).
pub trait Codec: Send + Sync + 'static {
    /// Encodes a value.
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError>;
    /// Decodes a value.
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError>;
}

/// The error a [`Codec`] reports.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

/// JSON through `serde_json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(|e| CodecError(e.to_string()))
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(bytes).map_err(|e| CodecError(e.to_string()))
    }
}

mod raw;
pub use raw::Raw;
