//! Every Redis key of a queue is built here, and only here. All carry the hash tag
//! `{queue}` so that every script touches one cluster slot.

/// The keys of one queue.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
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
    pub(crate) fn new(prefix: &str, queue: &str) -> Keys {
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

    pub(crate) fn req(&self, rid: &str) -> String {
        format!("{}{rid}", self.req_prefix)
    }

    pub(crate) fn reply(&self, producer: &str) -> String {
        format!("{}{producer}", self.reply_prefix)
    }

    /// A pattern matching every key of the queue (for SCAN in admin tools and tests).
    pub(crate) fn pattern(prefix: &str, queue: &str) -> String {
        format!("{prefix}:{{{queue}}}:*")
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
    }
}
