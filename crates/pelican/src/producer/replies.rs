//! The producer's reply stream: outcomes are pushed there, and one blocking reader on a
//! connection of its own hands them to the waiters.

use super::state::Inner;
use crate::clock::ms;
use crate::conn::retry::Backoff;
use crate::conn::wire::NoNames;
use crate::error::{Error, Result};
use crate::shared::Shared;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub(super) async fn create_reply_stream(
    shared: &Shared,
    key: &str,
    ttl: Duration,
) -> Result<String> {
    let (id, _): (String, ()) = redis::pipe()
        .cmd("XADD")
        .arg(key)
        .arg("MAXLEN")
        .arg(0)
        .arg("*")
        .arg("pelican")
        .arg("reply stream created")
        .cmd("PEXPIRE")
        .arg(key)
        .arg(ms(ttl))
        .ignore()
        .cmd("PING")
        .query_async(&mut shared.conn())
        .await
        .map_err(|e| Error::redis("creating the reply stream", e))?;
    Ok(id)
}

/// Reads the reply streams of one or more partitions (all on one node: one `XREAD` names
/// them all) on a dedicated connection and resolves waiters. `parts` pairs each
/// partition's state with the id its stream is read from. On a broken connection it
/// reconnects with backoff and asks each partition for a sweep.
pub(super) async fn reply_reader(parts: Vec<(std::sync::Weak<Inner>, String)>) {
    let (weaks, mut last_ids): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    let mut backoff = Backoff::new();
    loop {
        let Some(first) = weaks[0].upgrade() else {
            return;
        };
        let block = first.config.block;
        let mut keys = Vec::with_capacity(weaks.len());
        for w in &weaks {
            let Some(inner) = w.upgrade() else { return };
            keys.push(inner.reply_key.clone());
        }
        let conn = first.shared.blocking_connection(block).await;
        drop(first);
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %format_args!("{e:#}"), "reply reader cannot connect; retrying");
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        loop {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(ms(block))
                .arg("STREAMS")
                .arg(&keys)
                .arg(&last_ids);
            // Its entries' field names are request ids: none is worth keeping static.
            let r = conn.query_streams::<NoNames>(&cmd).await;
            if weaks[0].strong_count() == 0 {
                return;
            }
            match r {
                Ok(streams) => {
                    backoff.reset();
                    let mut any = false;
                    for (key, entries) in streams {
                        let Some(i) = keys.iter().position(|k| k.as_bytes() == key) else {
                            continue;
                        };
                        let Some(last) = entries.last().map(|e| e.id.to_string()) else {
                            continue;
                        };
                        let Some(inner) = weaks[i].upgrade() else {
                            return;
                        };
                        any = true;
                        for e in &entries {
                            // One entry carries one or more (rid, outcome) pairs. Pairs
                            // for requests this producer does not wait on are ignored
                            // (late, duplicate or forged).
                            for (rid, out) in &e.fields {
                                inner.resolve_raw(rid, out);
                            }
                        }
                        inner.last_reply_id.lock().unwrap().clone_from(&last);
                        last_ids[i] = last;
                    }
                    if any {
                        // Let the woken callers run first: a request submitted in answer
                        // to this outcome goes out before the next read.
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "reply reader lost its connection; reconnecting");
                    for w in &weaks {
                        let Some(inner) = w.upgrade() else { return };
                        inner.sweep_now.store(true, Ordering::SeqCst);
                    }
                    tokio::time::sleep(backoff.next()).await;
                    break;
                }
            }
        }
    }
}
