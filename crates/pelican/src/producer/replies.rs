//! The producer's reply stream: outcomes are pushed there, and one blocking reader on a
//! connection of its own hands them to the waiters.

use super::pending::Inner;
use crate::clock::ms;
use crate::conn::retry::Backoff;
use crate::error::{Error, Result};
use crate::protocol::entry;
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

/// Reads the reply stream on a dedicated connection and resolves waiters. On a broken
/// connection it reconnects with backoff and asks for a sweep.
pub(super) async fn reply_reader(weak: std::sync::Weak<Inner>, mut last_id: String) {
    let mut backoff = Backoff::new();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let block = inner.config.block;
        let key = inner.reply_key.clone();
        let conn = inner.shared.blocking_connection(block).await;
        drop(inner);
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
                .arg(&key)
                .arg(&last_id);
            let r = conn.query(&cmd).await;
            let Some(inner) = weak.upgrade() else { return };
            match r {
                Ok(v) => {
                    backoff.reset();
                    let entries = entry::read_into_entries(v);
                    for e in &entries {
                        last_id.clone_from(&e.id);
                        // One entry carries one or more (rid, outcome) pairs. Pairs for
                        // requests this producer does not wait on are ignored (late,
                        // duplicate or forged).
                        for (rid, out) in &e.fields {
                            inner.resolve_raw(rid, out);
                        }
                    }
                    if !entries.is_empty() {
                        inner.last_reply_id.lock().unwrap().clone_from(&last_id);
                        drop(inner);
                        // Let the woken callers run first: a request submitted in answer
                        // to this outcome goes out before the next read.
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %format_args!("{e:#}"), "reply reader lost its connection; reconnecting");
                    inner.sweep_now.store(true, Ordering::SeqCst);
                    tokio::time::sleep(backoff.next()).await;
                    break;
                }
            }
        }
    }
}
