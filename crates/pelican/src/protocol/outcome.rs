//! The outcome of a request as it is stored and pushed: a tag byte, then a payload.

use crate::error::{Error, ErrorKind};

/// A finished request's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler's response body.
    Ok(Vec<u8>),
    /// The handler's response, stored at the queue's body key `name` (`Keys::body`),
    /// `len` bytes long: the producer fetches it.
    Stored { len: usize, name: String },
    /// The handler failed the request for good.
    Remote(String),
    /// Dead-lettered, with the reason.
    Dead(String),
    /// The deadline passed first.
    Expired(String),
}

impl Outcome {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let stored;
        let (tag, payload): (u8, &[u8]) = match self {
            Outcome::Ok(b) => (b'O', b),
            Outcome::Stored { len, name } => {
                stored = format!("{len}:{name}");
                (b'A', stored.as_bytes())
            }
            Outcome::Remote(m) => (b'E', m.as_bytes()),
            Outcome::Dead(m) => (b'D', m.as_bytes()),
            Outcome::Expired(m) => (b'X', m.as_bytes()),
        };
        let mut v = Vec::with_capacity(payload.len() + 1);
        v.push(tag);
        v.extend_from_slice(payload);
        v
    }

    /// Decodes a stored outcome; `None` for a pending index value or garbage.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Outcome> {
        let (&tag, payload) = bytes.split_first()?;
        let text = || String::from_utf8_lossy(payload).into_owned();
        Some(match tag {
            b'O' => Outcome::Ok(payload.to_vec()),
            b'A' => {
                let text = std::str::from_utf8(payload).ok()?;
                let (len, name) = text.split_once(':')?;
                if name.is_empty() {
                    return None;
                }
                Outcome::Stored {
                    len: len.parse().ok()?,
                    name: name.to_string(),
                }
            }
            b'E' => Outcome::Remote(text()),
            b'D' => Outcome::Dead(text()),
            b'X' => Outcome::Expired(text()),
            _ => return None,
        })
    }

    /// The outcome's label for metrics and logs.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Outcome::Ok(_) | Outcome::Stored { .. } => "ok",
            Outcome::Remote(_) => "error",
            Outcome::Dead(_) => "dead",
            Outcome::Expired(_) => "expired",
        }
    }

    /// The body, or the error a caller gets.
    pub(crate) fn into_result(self, rid: &str) -> Result<Vec<u8>, Error> {
        match self {
            Outcome::Ok(b) => Ok(b),
            // The producer fetches a stored answer before it resolves a waiter.
            Outcome::Stored { name, .. } => Err(Error::new(
                ErrorKind::Internal,
                format!("request {rid}: its stored answer {name} was not fetched"),
            )),
            Outcome::Remote(m) => Err(Error::new(ErrorKind::Remote, m)),
            Outcome::Dead(m) => Err(Error::new(
                ErrorKind::Dead,
                format!("request {rid} was dead-lettered: {m}"),
            )),
            Outcome::Expired(m) => Err(Error::new(
                ErrorKind::Expired,
                format!("request {rid} expired: {m}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for o in [
            Outcome::Ok(b"{\"a\":1}".to_vec()),
            Outcome::Remote("bad".into()),
            Outcome::Dead("poison".into()),
            Outcome::Expired("late".into()),
            Outcome::Stored {
                len: 100_000,
                name: "a1-0.5f3e.7".into(),
            },
        ] {
            assert_eq!(Outcome::decode(&o.encode()), Some(o));
        }
        assert_eq!(Outcome::decode(b"P1-0;5;p;"), None);
        assert_eq!(Outcome::decode(b""), None);
        assert_eq!(Outcome::decode(b"A12"), None);
        assert_eq!(Outcome::decode(b"Ax:a1"), None);
        assert_eq!(Outcome::decode(b"A12:"), None);
        // A withdrawn request has no outcome: its key is deleted (cancel.lua).
        assert_eq!(Outcome::decode(b"Cgone"), None);
    }
}
