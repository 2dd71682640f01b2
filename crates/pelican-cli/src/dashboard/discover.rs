//! Which queues live under a key prefix: every stream `<prefix>:{<tag>}:stream` (the
//! requests) or `<prefix>:{<tag>}:dead` (dead letters). A tag `Q#p` is partition `p`
//! of queue `Q`: the queue is listed once, with its tags.

use super::link::Link;
use std::collections::{BTreeMap, BTreeSet};

/// The queues found: name -> the key tags of its partitions (`Q` alone when it has none).
pub type Found = BTreeMap<String, BTreeSet<String>>;

/// The queue and key tag of a key, if it is a queue's request or dead-letter stream.
pub fn queue_of_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let close = rest.find('}')?;
    let (tag, suffix) = (&rest[..close], &rest[close + 1..]);
    if !matches!(suffix, ":stream" | ":dead") || tag.is_empty() {
        return None;
    }
    let queue = tag.split_once('#').map_or(tag, |(q, _)| q);
    (!queue.is_empty()).then_some((queue, tag))
}

/// Scans Redis for the prefix's streams (SCAN with a pattern and `TYPE stream`, on every
/// master of a cluster: reads the whole key space in steps, so it runs every few seconds,
/// not every sample).
pub async fn discover(conn: &mut Link, prefix: &str) -> redis::RedisResult<Found> {
    let mut found = Found::new();
    let pattern = format!("{prefix}:{{*}}:*");
    for key in conn.scan_streams(&pattern).await? {
        if let Some((queue, tag)) = queue_of_key(prefix, &key) {
            found
                .entry(queue.to_string())
                .or_default()
                .insert(tag.to_string());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::queue_of_key;

    #[test]
    fn keys_name_their_queue_and_partitions_count_once() {
        assert_eq!(
            queue_of_key("pelican", "pelican:{jobs}:stream"),
            Some(("jobs", "jobs"))
        );
        assert_eq!(
            queue_of_key("pelican", "pelican:{jobs}:dead"),
            Some(("jobs", "jobs"))
        );
        assert_eq!(
            queue_of_key("pelican", "pelican:{jobs#3}:stream"),
            Some(("jobs", "jobs#3"))
        );
        assert_eq!(
            queue_of_key("p:x", "p:x:{a:b}:stream"),
            Some(("a:b", "a:b"))
        );
        for not in [
            "pelican:{jobs}:reply:abc",
            "pelican:{jobs}:req:abc",
            "pelican:{}:stream",
            "pelican:{#1}:stream",
            "pelican2:{jobs}:stream",
            "other:{jobs}:stream",
            "pelican:jobs:stream",
            "pelican:{jobs}:stream:x",
        ] {
            assert_eq!(queue_of_key("pelican", not), None, "{not}");
        }
    }
}
