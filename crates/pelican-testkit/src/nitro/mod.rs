//! A client of Nitro's `pubsub` wire format, written from the captured traces as raw
//! Redis commands: what Nitro's Go producer and consumer send, byte for byte in the
//! command names and arguments. Tests use it to stand in for Nitro's own processes.
//!
//! Producer: `XGROUP CREATE s s $ MKSTREAM`, `XADD s * msg <json>`, then per poll
//! `GET error-key:<s>.<id>.error`, `GET result-key:<s>.<id>`, `DEL` of the key found.
//! Consumer: `XPENDING s s IDLE <idletime> - + 50`, then `XAUTOCLAIM s s <me> <idletime>
//! <id-1> COUNT 1` of one candidate, else `XREADGROUP GROUP s <me> COUNT 1 BLOCK 1
//! STREAMS s >`; a heartbeat thread per message sending `XCLAIM s s <me> 0 <id> JUSTID`
//! every idletime / 2; answers `SET <key> <value> EX <ttl> NX`, `XACK`, `XDEL`, stopping
//! before XACK when the key exists (Nitro's `ErrAlreadySet`); a graceful hand-back
//! `XCLAIM s s <me> 0 <id> IDLE <idletime>`.
//!
//! Everything is synchronous (a blocking connection, a thread per heartbeat), usable
//! from plain tests and, on a multi-threaded runtime, from async ones.

mod consumer;
mod producer;

pub use consumer::{Message, NitroConsumer};
pub use producer::{Answer, NitroProducer};

use redis::Value;
use std::time::Duration;

/// Nitro's `response-entry-timeout` default, as `SET ... EX`.
pub const RESPONSE_TTL_SECS: u64 = 3600;

/// The result key of entry `id` of stream `stream`.
pub fn result_key(stream: &str, id: &str) -> String {
    format!("result-key:{stream}.{id}")
}

/// The error key of entry `id` of stream `stream`.
pub fn error_key(stream: &str, id: &str) -> String {
    format!("error-key:{stream}.{id}.error")
}

/// Nitro's `decrementMsgIdByOne`: `T-(S-1)`, or `(T-1)-18446744073709551615` when S = 0,
/// or `0`.
pub fn decrement_id(id: &str) -> String {
    let Some((t, s)) = id.split_once('-') else {
        return "0".into();
    };
    let (Ok(t), Ok(s)) = (t.parse::<u64>(), s.parse::<u64>()) else {
        return "0".into();
    };
    if s > 0 {
        format!("{t}-{}", s - 1)
    } else if t > 0 {
        format!("{}-{}", t - 1, u64::MAX)
    } else {
        "0".into()
    }
}

/// A version-4 UUID string, as `uuid.NewString()` makes Nitro's consumer names.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS's random number generator");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

pub(crate) fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("nitro client: redis url")
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("nitro client: connect")
}

pub(crate) fn str_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_decremented_as_nitro_does() {
        assert_eq!(
            decrement_id("1796067354580-0"),
            "1796067354579-18446744073709551615"
        );
        assert_eq!(decrement_id("1796067314245-3"), "1796067314245-2");
        assert_eq!(decrement_id("0-0"), "0");
        assert_eq!(decrement_id("junk"), "0");
    }

    #[test]
    fn names_are_uuid_v4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(uuid_v4(), u);
    }
}
