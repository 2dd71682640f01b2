//! The reader's fetches: `XREADGROUP` of new entries and, for a wire that stores bodies
//! apart, the `MGET` of their stored bodies (docs/PROTOCOL.md, "Stored bodies"), on the reader's own connection, and split
//! over a few more when there is much to fetch.
//!
//! Why more than one connection: Redis writes a client at most 64 KiB per turn of its
//! event loop (or one reply block, which for a large value is the whole value: its
//! `NET_MAX_WRITES_PER_EVENT`), so a large reply to one connection is spread over turns,
//! while the producers' bodies come in over several connections at once. With one, the
//! stream backed up behind the reader (`XINFO GROUPS` during a run of 100 KB bodies: ~950
//! entries not yet read, 20 in the consumer's hands); with four, 100 KB requests ran 19 %
//! faster without dedup, 1 MB requests 24-26 % faster with it
//! (docs/benchmarks/2026-12-01-69e5719-reads-in-parts.md).

use super::state::State;
use super::wire::Wire;
use crate::clock::ms;
use crate::conn::OwnConn;
use crate::protocol::entry::RawEntry;
use crate::protocol::stored;
use futures_util::future::try_join_all;
use redis::{Cmd, RedisResult};
use std::time::Duration;

/// The reader's fetcher: the extra connections it splits fetches over (opened on first
/// need, to the node of the reader's partition, dropped on an error), and what it
/// fetched last: how many entries, their mean size and the mean size of their stored
/// bodies (what the next fetch is worth splitting into).
pub(super) struct Fetch {
    extra: Vec<OwnConn>,
    entries: usize,
    entry_mean: usize,
    body_mean: usize,
}

impl Fetch {
    pub(super) fn new() -> Fetch {
        Fetch {
            extra: Vec::new(),
            entries: 0,
            entry_mean: 0,
            body_mean: 0,
        }
    }

    /// Up to `count` new entries for this consumer, waiting up to `block` for one
    /// (`None`: answers at once). When the last read brought many large entries (a
    /// backlog: one at a time is read whole, so a lone request waits for no extra round
    /// trip), this one is split into parts sent at once, none of them waiting; if those
    /// find nothing, one read waits for `block`. On an error, `conn` must be dropped (the
    /// extra connections are).
    pub(super) async fn read<W: Wire>(
        &mut self,
        inner: &State<W>,
        conn: &mut OwnConn,
        count: usize,
        block: Option<Duration>,
    ) -> RedisResult<Vec<RawEntry>> {
        let likely = count.min(self.entries);
        let parts = self.parts(inner, likely, likely * self.entry_mean).await;
        let mut entries = Vec::new();
        if parts > 1 {
            let cmds: Vec<Cmd> = split(count, parts)
                .map(|(_, n)| read_command(inner, n, None))
                .collect();
            let replies = self
                .run(conn, &cmds, async |c, cmd| {
                    c.query_streams::<W::Fields>(cmd).await
                })
                .await?;
            entries.extend(replies.into_iter().flatten().flat_map(|(_, e)| e));
        }
        if parts == 1 || (entries.is_empty() && block.is_some()) {
            let reply = conn
                .query_streams::<W::Fields>(&read_command(inner, count, block))
                .await?;
            entries = reply.into_iter().flat_map(|(_, e)| e).collect();
        }
        self.entries = entries.len();
        if let Some(mean) = RawEntry::mean_size(&entries) {
            self.entry_mean = mean;
        }
        Ok(entries)
    }

    /// Puts the stored bodies of `entries` into them (as the field `body`; a missing one
    /// is left out, and the entry is dead-lettered for it). On an error, `conn` must be
    /// dropped (the extra connections are); the entries stay pending with this consumer
    /// and are reclaimed.
    pub(super) async fn bodies(
        &mut self,
        inner: &State<impl Wire>,
        conn: &mut OwnConn,
        entries: &mut [RawEntry],
    ) -> RedisResult<()> {
        let Some(keys) = inner.wire.stored_bodies() else {
            return Ok(());
        };
        let at = stored::stored_bodies(entries);
        if at.is_empty() {
            return Ok(());
        }
        let parts = self.parts(inner, at.len(), at.len() * self.body_mean).await;
        let chunks: Vec<&[usize]> = split(at.len(), parts)
            .map(|(from, n)| &at[from..from + n])
            .collect();
        let cmds: Vec<Cmd> = chunks
            .iter()
            .map(|c| stored::mget_bodies(keys, entries, c))
            .collect();
        let replies = self
            .run(conn, &cmds, async |c, cmd| c.query(cmd).await)
            .await?;
        for (chunk, reply) in chunks.iter().zip(replies) {
            stored::attach_bodies(entries, chunk, reply);
        }
        let total: usize = at
            .iter()
            .filter_map(|&i| entries[i].get("body"))
            .map(<[u8]>::len)
            .sum();
        self.body_mean = total / at.len();
        Ok(())
    }

    /// How many parts a fetch of `items` worth `bytes` in all is split into
    /// ([`crate::conn::split_parts`]), and no more than there are connections (extra
    /// ones are opened here; fewer parts if one cannot be).
    async fn parts(&mut self, inner: &State<impl Wire>, items: usize, bytes: usize) -> usize {
        let parts = crate::conn::split_parts(items, bytes);
        let place = inner.wire.place();
        while self.extra.len() + 1 < parts {
            match place.own_connection(place.command_timeout).await {
                Ok(c) => self.extra.push(c),
                Err(e) => {
                    tracing::debug!(error = %format_args!("{e:#}"), "no extra connection for the reader; fetching in fewer parts");
                    break;
                }
            }
        }
        parts.min(self.extra.len() + 1)
    }

    /// Runs `cmds` at once with `query`, the first on `conn`, the others on the extra
    /// connections (`parts` opened enough), and returns their replies in order.
    async fn run<T>(
        &mut self,
        conn: &mut OwnConn,
        cmds: &[Cmd],
        query: impl AsyncFn(&mut OwnConn, &Cmd) -> RedisResult<T>,
    ) -> RedisResult<Vec<T>> {
        let conns = std::iter::once(conn).chain(self.extra.iter_mut());
        let replies = try_join_all(conns.zip(cmds).map(|(c, cmd)| query(c, cmd))).await;
        if replies.is_err() {
            self.extra.clear();
        }
        replies
    }
}

/// `n` items in `parts` runs as even as can be: (first item, length) of each.
fn split(n: usize, parts: usize) -> impl Iterator<Item = (usize, usize)> {
    let per = n.div_ceil(parts.max(1)).max(1);
    (0..n)
        .step_by(per)
        .map(move |from| (from, per.min(n - from)))
}

/// `XREADGROUP` of up to `count` new entries for this consumer, waiting up to `block`
/// for one (`None`: answers at once).
fn read_command(inner: &State<impl Wire>, count: usize, block: Option<Duration>) -> Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(&inner.wire.place().group)
        .arg(&inner.name)
        .arg("COUNT")
        .arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(ms(block));
    }
    cmd.arg("STREAMS").arg(&inner.wire.place().stream).arg(">");
    cmd
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_covers_every_item_once_in_at_most_the_parts_asked() {
        for n in 1..40 {
            for parts in 1..6 {
                let runs: Vec<(usize, usize)> = split(n, parts).collect();
                assert!(runs.len() <= parts, "{n} in {parts}: {runs:?}");
                assert!(
                    runs.iter().all(|&(_, len)| len > 0),
                    "{n} in {parts}: {runs:?}"
                );
                let mut next = 0;
                for (from, len) in runs {
                    assert_eq!(from, next, "{n} in {parts}");
                    next = from + len;
                }
                assert_eq!(next, n, "{n} in {parts}");
            }
        }
    }
}
