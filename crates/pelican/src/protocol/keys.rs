//! Every Redis key of a queue is built here, and only here. All carry the hash tag
//! `{queue}` so that every script touches one cluster slot.

/// The Redis keys of one queue, for operators and tests that look at Redis directly
/// (`redis-cli`, a dashboard): get them with [`crate::QueueConfig::keys`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub(crate) stream: String,
    pub(crate) dead: String,
    /// Prefix of the per-request keys; the request id is appended (by Rust or by Lua).
    pub(crate) req_prefix: String,
    /// Prefix of the per-producer reply streams; the producer id is appended.
    pub(crate) reply_prefix: String,
    pub(crate) janitor_lock: String,
    /// The consumer group's name (not a key).
    pub(crate) group: String,
}

impl Keys {
    /// The keys of queue `queue` under key prefix `prefix`.
    pub fn new(prefix: &str, queue: &str) -> Keys {
        let base = format!("{prefix}:{{{queue}}}");
        Keys {
            stream: format!("{base}:stream"),
            dead: format!("{base}:dead"),
            req_prefix: format!("{base}:req:"),
            reply_prefix: format!("{base}:reply:"),
            janitor_lock: format!("{base}:janitor"),
            group: "pelican".to_string(),
        }
    }

    /// The request stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The dead-letter stream.
    pub fn dead(&self) -> &str {
        &self.dead
    }

    /// The janitor's lock key.
    pub fn janitor_lock(&self) -> &str {
        &self.janitor_lock
    }

    /// The consumer group's name (not a key).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The state key of request `rid` (pending, or its cached outcome).
    pub fn req(&self, rid: &str) -> String {
        format!("{}{rid}", self.req_prefix)
    }

    /// The reply stream of producer `producer`.
    pub fn reply(&self, producer: &str) -> String {
        format!("{}{producer}", self.reply_prefix)
    }

    /// A pattern matching every key of the queue (for SCAN).
    pub fn pattern(&self) -> String {
        format!("{}*", self.stream.trim_end_matches("stream"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_hash_tag() {
        let k = Keys::new("pelican", "jobs");
        for key in [
            k.stream.clone(),
            k.dead.clone(),
            k.req("abc"),
            k.reply("p1"),
            k.janitor_lock.clone(),
        ] {
            assert!(key.starts_with("pelican:{jobs}:"), "{key}");
        }
        assert_eq!(k.req("abc"), "pelican:{jobs}:req:abc");
        assert_eq!(k.pattern(), "pelican:{jobs}:*");
    }
}
