//! Taking over idle work: one `reclaim.lua` call claims entries idle past `claim_idle`
//! (and dead-letters the ones out of deliveries).

use super::state::ConsumerState;
use crate::clock::{ms, now_ms};
use crate::error::{Error, Result};
use crate::protocol::entry::{self, parse_entries, RawEntry};
use redis::Value;
use std::collections::HashMap;

/// The next cursor, the entries taken over with their delivery counts, the id of the one
/// taken for its last delivery (which must run alone), and whether an entry was left
/// waiting for its last delivery.
pub(super) type Reclaimed = (String, Vec<(RawEntry, u32)>, Option<String>, bool);

/// One reclaim call. `idle`: the consumer holds nothing, so it may take an entry for
/// its last delivery.
pub(super) async fn reclaim(
    inner: &ConsumerState,
    cursor: &str,
    count: usize,
    idle: bool,
) -> Result<Reclaimed> {
    let sh = &inner.shared;
    let cfg = &inner.config;
    let v: Value = sh
        .scripts
        .reclaim
        .key(&sh.keys.stream)
        .key(&sh.keys.dead)
        .key(&sh.keys.req_prefix)
        .key(&sh.keys.reply_prefix)
        .arg(&sh.keys.group)
        .arg(&inner.name)
        .arg(ms(cfg.claim_idle))
        .arg(cursor)
        .arg(count)
        .arg(cfg.max_deliveries)
        .arg(now_ms())
        .arg(ms(sh.queue.result_ttl))
        .arg(sh.queue.reply_maxlen)
        .arg(sh.queue.dead_maxlen)
        .arg(sh.queue.max_body_bytes)
        .arg(if idle { "1" } else { "0" })
        .invoke_async(&mut sh.conn())
        .await
        .map_err(|e| Error::redis("reclaiming idle entries", e))?;
    let parts = entry::array(&v);
    let next = parts
        .first()
        .and_then(entry::string)
        .unwrap_or_else(|| "-".into());
    let claimed = parts.get(1).map(parse_entries).unwrap_or_default();
    let counts: HashMap<String, u32> = parts
        .get(2)
        .map(entry::array)
        .unwrap_or(&[])
        .chunks(2)
        .filter_map(|c| Some((entry::string(c.first()?)?, entry::int(c.get(1)?)? as u32)))
        .collect();
    let dead = parts.get(3).and_then(entry::int).unwrap_or(0);
    let solo = parts
        .get(4)
        .and_then(entry::string)
        .filter(|s| !s.is_empty());
    if dead > 0 {
        tracing::warn!(
            n = dead,
            "dead-lettered entries that reached max_deliveries"
        );
        sh.metrics.dead_lettered(dead as u64);
    }
    let claimed = claimed
        .into_iter()
        .map(|e| {
            let n = counts.get(&e.id).copied().unwrap_or(2);
            (e, n)
        })
        .collect();
    let waiting_alone = parts.get(5).and_then(entry::int).unwrap_or(0) > 0;
    Ok((next, claimed, solo, waiting_alone))
}
