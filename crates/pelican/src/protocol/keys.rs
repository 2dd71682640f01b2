//! Every Redis key of a queue is built here, and only here. All keys of a partition
//! carry one hash tag, so that every script touches one cluster slot: `{Q}` for a queue of
//! one partition (the keys queues have always had); for partition `p` of a queue of
//! several, `{Q#p~k}` in the spread layout and `{Q#p}` in the legacy one
//! (`protocol/layout.rs`; `#` and `~` are outside the queue-name alphabet, so no other
//! queue's tag can be one of these). The record of a queue's partitions is
//! `P:{Q}:partitions` in every case.

use super::layout::{spread_tag, PartitionLayout};

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
    /// Prefix of the stored bodies (large bodies with dedup on): a stream entry id, `d`
    /// and a dead-letter id, or `s` and a producer's staging name is appended. Lua builds
    /// the same names from the stream key (`lib.lua`, `body_key`).
    pub(crate) body_prefix: String,
    pub(crate) janitor_lock: String,
    /// How many partitions the queue has (one key per queue, not per partition).
    pub(crate) partitions: String,
    /// The consumer group's name (not a key).
    pub(crate) group: String,
}

impl Keys {
    /// The keys of queue `queue` (of one partition) under key prefix `prefix`.
    pub fn new(prefix: &str, queue: &str) -> Keys {
        Keys::with_tag(prefix, queue, queue)
    }

    /// The keys of partition `partition` of queue `queue` when it has `partitions`
    /// partitions, in the spread layout (a new queue's; `partitions` = 1: the same as
    /// [`Keys::new`]).
    pub fn partition(prefix: &str, queue: &str, partition: u32, partitions: u32) -> Keys {
        Keys::partition_in(
            PartitionLayout::Spread,
            prefix,
            queue,
            partition,
            partitions,
        )
    }

    /// The keys of partition `partition` of `partitions` in layout `layout` (`Auto`: the
    /// spread layout, a new queue's).
    pub fn partition_in(
        layout: PartitionLayout,
        prefix: &str,
        queue: &str,
        partition: u32,
        partitions: u32,
    ) -> Keys {
        if partitions <= 1 {
            return Keys::new(prefix, queue);
        }
        let tag = match layout.for_new_queue() {
            PartitionLayout::Legacy => format!("{queue}#{partition}"),
            _ => spread_tag(queue, partition, partitions),
        };
        Keys::with_tag(prefix, queue, &tag)
    }

    fn with_tag(prefix: &str, queue: &str, tag: &str) -> Keys {
        let base = format!("{prefix}:{{{tag}}}");
        Keys {
            stream: format!("{base}:stream"),
            dead: format!("{base}:dead"),
            req_prefix: format!("{base}:req:"),
            reply_prefix: format!("{base}:reply:"),
            body_prefix: format!("{base}:body:"),
            janitor_lock: format!("{base}:janitor"),
            partitions: format!("{prefix}:{{{queue}}}:partitions"),
            group: "pelican".to_string(),
        }
    }

    /// The key that records the queue's number of partitions.
    pub fn partitions(&self) -> &str {
        &self.partitions
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

    /// The stored body of stream entry `sid` (an entry with the field `bref`; large
    /// bodies of requests with dedup on are kept beside the stream, not in it).
    pub fn body(&self, sid: &str) -> String {
        format!("{}{sid}", self.body_prefix)
    }

    /// The stored body of dead letter `id` (its `bref` field is set).
    pub fn dead_body(&self, id: &str) -> String {
        format!("{}d{id}", self.body_prefix)
    }

    /// The reply stream of producer `producer`.
    pub fn reply(&self, producer: &str) -> String {
        format!("{}{producer}", self.reply_prefix)
    }

    /// What the names of every reader connection of this partition start with (`CLIENT
    /// SETNAME`; not a key): `pelican-reader:<stream key>:` and the consumer's name, so that
    /// a consumer leaving can find the other readers of the partition (`conn/unblock.rs`),
    /// and an operator can see them in `CLIENT LIST`.
    pub(crate) fn reader_clients(&self) -> String {
        format!("pelican-reader:{}:", self.stream)
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
        assert_eq!(k.body("1-2"), "pelican:{jobs}:body:1-2");
        assert_eq!(k.dead_body("1-2"), "pelican:{jobs}:body:d1-2");
        assert_eq!(k.pattern(), "pelican:{jobs}:*");
        assert_eq!(k.partitions(), "pelican:{jobs}:partitions");
        assert_eq!(Keys::partition("pelican", "jobs", 0, 1), k);
        for layout in [
            PartitionLayout::Auto,
            PartitionLayout::Spread,
            PartitionLayout::Legacy,
        ] {
            assert_eq!(Keys::partition_in(layout, "pelican", "jobs", 0, 1), k);
        }
        let p = Keys::partition_in(PartitionLayout::Legacy, "pelican", "jobs", 3, 6);
        assert_eq!(p.stream(), "pelican:{jobs#3}:stream");
        assert_eq!(p.req("r"), "pelican:{jobs#3}:req:r");
        assert_eq!(p.partitions(), "pelican:{jobs}:partitions");
        assert_eq!(p.pattern(), "pelican:{jobs#3}:*");
        let tag = spread_tag("jobs", 3, 6);
        let p = Keys::partition("pelican", "jobs", 3, 6);
        assert_eq!(p.stream(), format!("pelican:{{{tag}}}:stream"));
        assert_eq!(p.req("r"), format!("pelican:{{{tag}}}:req:r"));
        assert_eq!(p.partitions(), "pelican:{jobs}:partitions");
        assert_eq!(p.pattern(), format!("pelican:{{{tag}}}:*"));
        assert_eq!(
            Keys::partition_in(PartitionLayout::Auto, "pelican", "jobs", 3, 6),
            p
        );
    }
}
