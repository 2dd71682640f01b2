//! Taking over idle work: one `reclaim.lua` call claims entries idle past `claim_idle`
//! (and dead-letters the ones out of deliveries).

use super::fetch::Fetch;
use super::state::ConsumerState;
use crate::clock::{ms, now_ms};
use crate::conn::OwnConn;
use crate::error::{Error, Result};
use crate::protocol::entry::RawEntry;
use crate::protocol::scripts::Reclaim;

/// The next cursor, the entries taken over with their delivery counts, the id of the one
/// taken for its last delivery (which must run alone), and whether an entry was left
/// waiting for its last delivery.
pub(super) type Reclaimed = (String, Vec<(RawEntry, u32)>, Option<String>, bool);

/// One reclaim call, on the reader's own connection `conn` (the scan and the read of
/// stored bodies are the reader's commands, off the shared connection; the bodies with
/// the reader's fetcher, `fetch`).
/// `idle`: the consumer holds nothing, so it may take an entry for its last delivery.
pub(super) async fn reclaim(
    inner: &ConsumerState,
    conn: &mut OwnConn,
    fetch: &mut Fetch,
    cursor: &str,
    count: usize,
    idle: bool,
) -> Result<Reclaimed> {
    let sh = &inner.shared;
    let cfg = &inner.config;
    let r = Reclaim {
        consumer: &inner.name,
        min_idle_ms: ms(cfg.claim_idle),
        cursor,
        count,
        max_deliveries: cfg.max_deliveries,
        now_ms: now_ms(),
        result_ttl_ms: ms(sh.queue.result_ttl),
        reply_maxlen: sh.queue.reply_maxlen,
        dead_maxlen: sh.queue.dead_maxlen,
        max_body_bytes: sh.queue.max_body_bytes,
        idle,
    }
    .call(&sh.scripts)
    .invoke_on(conn, &mut sh.conn())
    .await
    .map_err(|e| Error::redis("reclaiming idle entries", e))?;
    if r.dead > 0 {
        tracing::warn!(
            n = r.dead,
            "dead-lettered entries that reached max_deliveries"
        );
        sh.metrics.dead_lettered(r.dead);
    }
    let (mut entries, counts): (Vec<RawEntry>, Vec<u32>) = r.claimed.into_iter().unzip();
    // The stored bodies of what was claimed. On failure the entries stay claimed by this
    // consumer and are reclaimed again later.
    fetch
        .bodies(inner, conn, &mut entries)
        .await
        .map_err(|e| Error::redis("reading stored bodies", e))?;
    let claimed = entries.into_iter().zip(counts).collect();
    Ok((r.next_cursor, claimed, r.solo, r.waiting > 0))
}
