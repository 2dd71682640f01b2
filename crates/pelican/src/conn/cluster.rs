//! Redis Cluster: `redis+cluster://` URLs, hash slots, and which node owns a slot.
//!
//! Scripts and ordinary commands go through the client library's cluster connection,
//! which routes by key and follows MOVED/ASK and failovers. The tasks with connections
//! of their own (blocking reads, outcome writes) ask the cluster which master owns their
//! partition's slot each time they (re)connect: after a failover or a resharding their
//! next command fails (connection lost, or MOVED), and the reconnect goes to the new owner.

use crate::error::{Error, Result};
use redis::Value;

/// Whether a server error with this code says the key's slot is not this node's (alone)
/// any more: `MOVED` (a resharding, a failover), `ASK` and `TRYAGAIN` (the slot is being
/// migrated), `CLUSTERDOWN`. A connection of a task's own that got one is dropped: the
/// next one is opened to the master the cluster names then (a connection kept would be
/// answered the same until the request's time ran out).
pub(crate) fn slot_elsewhere(code: Option<&str>) -> bool {
    matches!(code, Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN"))
}

/// The error of a write on a connection of a task's own that a node refused with one of
/// the [`slot_elsewhere`] codes: nothing of it was done, and the connection was dropped.
pub(crate) const SLOT_MOVED: &str = "the partition's slot moved to another node; connecting again";

/// The error for a write refused because its slot is elsewhere ([`SLOT_MOVED`]); its
/// kind says "dropped", so callers that send again after a dropped connection do.
pub(crate) fn slot_moved_error() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        SLOT_MOVED,
    ))
}

/// Whether `e` says the command was refused because its slot is elsewhere: a
/// [`slot_elsewhere`] reply through the client library, or [`slot_moved_error`]. Nothing
/// was done: it may be sent again, to the master that serves the slot then (during a
/// resharding, only once the slot's keys have moved).
pub(crate) fn is_slot_elsewhere(e: &redis::RedisError) -> bool {
    slot_elsewhere(e.code()) || e.to_string().contains(SLOT_MOVED)
}

/// Whether a command that failed with `e` is worth sending again, on a new connection:
/// no server error reply came (the connection was cut, timed out or could not be opened;
/// [`slot_moved_error`] is one of these), or the reply says the slot is elsewhere
/// ([`slot_elsewhere`]). Either way the connection it went on is not used again.
pub(crate) fn worth_sending_again(e: &redis::RedisError) -> bool {
    e.code().is_none() || slot_elsewhere(e.code())
}

/// Number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of the hash tag (the
/// part between the first `{` and the next `}`, if not empty) or of the whole key,
/// modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
    crc16_update(0, data)
}

/// The CRC16 of `data` appended to bytes whose CRC16 was `crc` (so that many strings
/// sharing a prefix cost only their suffixes).
pub(crate) fn crc16_update(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A cluster URL taken apart: `redis+cluster://[user:password@]host:port[,host:port...]`
/// (`rediss+cluster://` for TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterUrl {
    pub(crate) tls: bool,
    /// `user:password@` or empty.
    pub(crate) credentials: String,
    /// `host:port` of each seed node.
    pub(crate) seeds: Vec<String>,
}

impl ClusterUrl {
    /// `Some` for `redis+cluster://` and `rediss+cluster://` URLs.
    pub(crate) fn parse(url: &str) -> Option<Result<ClusterUrl>> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
            (true, r)
        } else {
            return None;
        };
        Some(Self::parse_rest(tls, rest))
    }

    fn parse_rest(tls: bool, rest: &str) -> Result<ClusterUrl> {
        let bad = |why: &str| {
            Error::config(format!(
                "invalid cluster URL {:?}: {why}; expected redis+cluster://[user:password@]host:port[,host:port...]",
                super::url::redacted_url(&format!("redis+cluster://{rest}"))
            ))
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, hosts) = match rest.rfind('@') {
            Some(at) => (format!("{}@", &rest[..at]), &rest[at + 1..]),
            None => (String::new(), rest),
        };
        if hosts.contains('/') || hosts.contains('?') {
            return Err(bad(
                "a cluster has no database number or options in its URL",
            ));
        }
        let seeds: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect();
        if seeds.is_empty() {
            return Err(bad("no seed node"));
        }
        for s in &seeds {
            let ok = s
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(bad(&format!("{s:?} is not host:port")));
            }
        }
        Ok(ClusterUrl {
            tls,
            credentials,
            seeds,
        })
    }

    /// What a process that could not connect through these seeds is told: which seeds it
    /// tried, and with one alone, to list more (a process cannot start while the one seed
    /// it knows is down, however healthy the rest of the cluster).
    pub(crate) fn unreachable(&self) -> String {
        let mut msg = format!(
            "cannot connect to the Redis Cluster through any seed node of its URL (tried {})",
            self.seeds.join(", ")
        );
        if self.seeds.len() == 1 {
            msg.push_str(
                "; a process finds the cluster only through the seeds its URL lists: list \
                 several nodes (redis+cluster://host:port,host:port,...) so that one down \
                 does not keep it from starting",
            );
        }
        msg
    }

    /// The single-node URL of `node` (`host:port`), with this URL's credentials and TLS.
    pub(crate) fn node_url(&self, node: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}{node}", self.credentials)
    }
}

/// The `host:port` of the master that owns `slot`, from a `CLUSTER SLOTS` reply.
pub(crate) fn master_of(slots_reply: &Value, slot: u16) -> Option<String> {
    let ranges = match slots_reply {
        Value::Array(a) => a,
        _ => return None,
    };
    for r in ranges {
        let Value::Array(parts) = r else { continue };
        let (Some(lo), Some(hi)) = (
            parts.first().and_then(as_int),
            parts.get(1).and_then(as_int),
        ) else {
            continue;
        };
        if (lo..=hi).contains(&i64::from(slot)) {
            let Some(Value::Array(master)) = parts.get(2) else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = as_int(master.get(1)?)?;
            return Some(format!("{host}:{port}"));
        }
    }
    None
}

/// The `host:port` of every master, from a `CLUSTER SLOTS` reply (each once, in the
/// order of their first slot range).
pub(crate) fn masters(slots_reply: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let Value::Array(ranges) = slots_reply else {
        return out;
    };
    for r in ranges {
        let Value::Array(parts) = r else { continue };
        let Some(Value::Array(master)) = parts.get(2) else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(port) = master.get(1).and_then(as_int) else {
            continue;
        };
        let node = format!("{host}:{port}");
        if !out.contains(&node) {
            out.push(node);
        }
    }
    out
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command is sent again after a cut connection or a slot that is elsewhere, not
    /// after any other error reply.
    #[test]
    fn worth_sending_again_after_a_cut_or_a_slot_elsewhere() {
        let reply = |line: &str| {
            crate::conn::wire::into_result(
                redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap(),
            )
            .unwrap_err()
        };
        let cut = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(worth_sending_again(&cut));
        assert!(worth_sending_again(&slot_moved_error()));
        for line in [
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(worth_sending_again(&reply(line)), "{line}");
        }
        for line in ["NOSCRIPT No matching script", "ERR boom", "NOPERM no"] {
            assert!(!worth_sending_again(&reply(line)), "{line}");
        }
    }

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from Redis' cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16_update(crc16(b"1234"), b"56789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    #[test]
    fn masters_and_the_master_of_a_slot_from_cluster_slots() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |lo: i64, hi: i64, nodes: Vec<Value>| {
            let mut r = vec![Value::Int(lo), Value::Int(hi)];
            r.extend(nodes);
            Value::Array(r)
        };
        // Two ranges of one master, each master with a replica.
        let reply = Value::Array(vec![
            range(
                0,
                5000,
                vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
            ),
            range(
                5001,
                10000,
                vec![node("10.0.0.2", 7001), node("10.0.0.5", 7004)],
            ),
            range(10001, 12000, vec![node("10.0.0.1", 7000)]),
            range(12001, 16383, vec![node("10.0.0.3", 7002)]),
        ]);
        assert_eq!(
            masters(&reply),
            ["10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"]
        );
        assert_eq!(master_of(&reply, 11000).as_deref(), Some("10.0.0.1:7000"));
        assert_eq!(master_of(&reply, 5001).as_deref(), Some("10.0.0.2:7001"));
        assert!(masters(&Value::Nil).is_empty());
    }

    #[test]
    fn cluster_urls() {
        let u = ClusterUrl::parse("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001")
            .unwrap()
            .unwrap();
        assert!(!u.tls);
        assert_eq!(u.seeds, ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(u.node_url("10.0.0.1:7002"), "redis://u:p@10.0.0.1:7002");
        let t = ClusterUrl::parse("rediss+cluster://h:1").unwrap().unwrap();
        assert_eq!(t.node_url("h:1"), "rediss://h:1");
        assert!(ClusterUrl::parse("redis://h:1").is_none());
        for bad in [
            "redis+cluster://",
            "redis+cluster://h",
            "redis+cluster://h:x",
            "redis+cluster://h:1/0",
        ] {
            assert!(ClusterUrl::parse(bad).unwrap().is_err(), "{bad}");
        }
    }
}
