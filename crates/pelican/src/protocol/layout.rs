//! Where the partitions of a queue live in a Redis Cluster's slot space (the partition
//! layout), and the queue's record of its partitions, `P:{Q}:partitions`.
//!
//! A cluster spreads its 16384 slots over its masters in equal runs. A partition's keys
//! share one hash tag, so the tag decides the partition's slot and so its master. Tags
//! chosen by their name alone (`Q#p`, the legacy layout) land where they happen to hash:
//! on 3 masters, 6 such partitions put 598, 1,144 and 1,657 stream commands of 400 calls
//! on the masters. The spread layout picks each tag so that partition `p` of `P` hashes
//! into the middle half of the `p`-th of `P` equal runs of slots: whatever number of
//! masters divides the runs evenly gets an even share, and the margin of a quarter run
//! on either side keeps a partition off the masters' boundaries (which fall between
//! equal runs only up to rounding: `redis-cli --cluster create` gives 3 masters
//! 0-5460, 5461-10922 and 10923-16383).

use crate::conn::cluster::{crc16_update, SLOTS};
use std::fmt::Write as _;

/// How the partitions of a queue of several partitions choose their hash tags (see
/// [`crate::QueueConfig::partition_layout`]). A queue of one partition has the keys
/// `P:{Q}:...` in every layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PartitionLayout {
    /// The layout the queue has recorded; a new queue gets [`PartitionLayout::Spread`].
    #[default]
    Auto,
    /// Partition `p` of `P` has the tag `Q#p~k`, `k` the smallest counter (0, 1, 2 ...)
    /// that puts the tag's slot in the middle half of slots
    /// `[p * 16384 / P, (p + 1) * 16384 / P)`: the partitions spread evenly over the
    /// masters of a cluster whose masters hold equal runs of slots. Recorded as `P;spread`.
    Spread,
    /// Partition `p` has the tag `Q#p`, wherever it hashes: the layout of queues created
    /// before the spread layout existed (recorded as `P`, without a layout). Processes
    /// of those builds can join only such a queue.
    Legacy,
}

impl PartitionLayout {
    /// The layout's name: `auto`, `spread` or `legacy` (what [`str::parse`] takes).
    pub fn name(self) -> &'static str {
        match self {
            PartitionLayout::Auto => "auto",
            PartitionLayout::Spread => "spread",
            PartitionLayout::Legacy => "legacy",
        }
    }

    /// The layout a new queue gets when a process configured with `self` creates it.
    pub(crate) fn for_new_queue(self) -> PartitionLayout {
        match self {
            PartitionLayout::Auto => PartitionLayout::Spread,
            other => other,
        }
    }

    /// Reads the value of a queue's record `P:{Q}:partitions`: `P` (a queue of one
    /// partition, or of several in the legacy layout) or `P;spread`. `None` for anything
    /// else (a record written by a later build, or not by pelican). For tools that look
    /// at Redis directly; producers, consumers and [`crate::Admin`] read it themselves.
    pub fn parse_record(value: &str) -> Option<(u32, PartitionLayout)> {
        let (count, layout) = match value.trim().split_once(';') {
            None => (value.trim(), PartitionLayout::Legacy),
            Some((count, "spread")) => (count, PartitionLayout::Spread),
            Some((count, "legacy")) => (count, PartitionLayout::Legacy),
            Some(_) => return None,
        };
        let n = count.parse::<u32>().ok().filter(|&n| n >= 1)?;
        Some((
            n,
            if n == 1 {
                PartitionLayout::Legacy
            } else {
                layout
            },
        ))
    }

    /// The value of the record for a queue of `partitions` in layout `self` (`Spread`
    /// or `Legacy`): one partition or the legacy layout write the bare count, as builds
    /// before the layout did, so that they can still join such a queue; the spread
    /// layout writes `P;spread`, which those builds cannot read and so refuse.
    pub(crate) fn record(self, partitions: u32) -> String {
        match self {
            PartitionLayout::Spread if partitions > 1 => format!("{partitions};spread"),
            _ => partitions.to_string(),
        }
    }
}

impl std::fmt::Display for PartitionLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PartitionLayout {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "auto" => Ok(PartitionLayout::Auto),
            "spread" => Ok(PartitionLayout::Spread),
            "legacy" => Ok(PartitionLayout::Legacy),
            other => Err(crate::Error::config(format!(
                "unknown partition layout {other:?}; use auto (the queue's own, spread for a \
                 new queue), spread or legacy"
            ))),
        }
    }
}

/// The hash tag of partition `partition` of `partitions` in the spread layout:
/// `{queue}#{partition}~{k}` (see [`PartitionLayout::Spread`]). A pure function of its
/// arguments: every producer, consumer and tool computes the same tags.
pub(crate) fn spread_tag(queue: &str, partition: u32, partitions: u32) -> String {
    let (lo, hi) = slot_run(partition, partitions);
    let margin = (hi - lo) / 4;
    let wanted = (lo + margin)..(hi - margin);
    let mut tag = format!("{queue}#{partition}~");
    let stem = tag.len();
    let crc = crc16_update(0, tag.as_bytes());
    // With MAX_PARTITIONS the wanted range is 8 slots of 16384: about 2,048 tries on
    // average; the unit tests check that every partition count finds its tags.
    for k in 0u32.. {
        tag.truncate(stem);
        write!(tag, "{k}").expect("writing to a String");
        let slot = u32::from(crc16_update(crc, &tag.as_bytes()[stem..]) % SLOTS);
        if wanted.contains(&slot) {
            return tag;
        }
    }
    unreachable!("no counter puts {queue:?} partition {partition} in slots {wanted:?}")
}

/// The `partition`-th of `partitions` equal runs of the slot space: `[lo, hi)`.
fn slot_run(partition: u32, partitions: u32) -> (u32, u32) {
    let slots = u32::from(SLOTS);
    (
        partition * slots / partitions,
        (partition + 1) * slots / partitions,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::cluster::slot;

    fn slot_of_tag(tag: &str) -> u32 {
        u32::from(slot(format!("{{{tag}}}").as_bytes()))
    }

    #[test]
    fn spread_tags_hash_into_the_middle_of_their_run() {
        for partitions in (2..=64).chain([crate::config::MAX_PARTITIONS]) {
            for p in 0..partitions {
                let tag = spread_tag("jobs", p, partitions);
                let (lo, hi) = slot_run(p, partitions);
                let s = slot_of_tag(&tag);
                let margin = (hi - lo) / 4;
                assert!(
                    (lo + margin..hi - margin).contains(&s),
                    "P={partitions} p={p}: {tag} is in slot {s}, not in the middle of {lo}..{hi}"
                );
                assert!(tag.starts_with(&format!("jobs#{p}~")), "{tag}");
            }
        }
    }

    #[test]
    fn spread_tags_are_fixed_and_take_the_smallest_counter() {
        // Pinned: every build must compute the same tags, or processes of two builds
        // would use different streams.
        let tags: Vec<String> = (0..3).map(|p| spread_tag("jobs", p, 3)).collect();
        for (p, tag) in tags.iter().enumerate() {
            let (stem, k) = tag.rsplit_once('~').unwrap();
            let k: u32 = k.parse().unwrap();
            let (lo, hi) = slot_run(p as u32, 3);
            let m = (hi - lo) / 4;
            for smaller in 0..k {
                let s = slot_of_tag(&format!("{stem}~{smaller}"));
                assert!(!(lo + m..hi - m).contains(&s), "{stem}~{smaller} would do");
            }
        }
        // `CLUSTER KEYSLOT pelican:{<tag>}:stream`, as redis-server 7.0 answers it.
        assert_eq!(tags, PINNED_JOBS_3.map(|(t, _)| t.to_string()));
        for (t, s) in PINNED_JOBS_3 {
            assert_eq!(slot_of_tag(t), s, "{t}");
        }
    }

    const PINNED_JOBS_3: [(&str, u32); 3] =
        [("jobs#0~3", 1642), ("jobs#1~2", 8571), ("jobs#2~2", 14379)];

    #[test]
    fn the_record_says_count_and_layout() {
        use PartitionLayout::*;
        assert_eq!(Spread.record(6), "6;spread");
        assert_eq!(Legacy.record(6), "6");
        assert_eq!(Spread.record(1), "1");
        assert_eq!(PartitionLayout::parse_record("6;spread"), Some((6, Spread)));
        assert_eq!(PartitionLayout::parse_record("6"), Some((6, Legacy)));
        assert_eq!(PartitionLayout::parse_record("6;legacy"), Some((6, Legacy)));
        assert_eq!(PartitionLayout::parse_record("1"), Some((1, Legacy)));
        for bad in ["", "0", "x", "6;fancy", "-1;spread", ";spread"] {
            assert_eq!(PartitionLayout::parse_record(bad), None, "{bad}");
        }
        for l in [Auto, Spread, Legacy] {
            assert_eq!(l.name().parse::<PartitionLayout>().unwrap(), l);
        }
        let err = "even".parse::<PartitionLayout>().unwrap_err();
        assert!(err.message().contains("spread or legacy"), "{err}");
        assert_eq!(Auto.for_new_queue(), Spread);
        assert_eq!(Legacy.for_new_queue(), Legacy);
    }
}
