//! Withdrawals: a request nobody waits for any more is taken off the queue.

use super::pending::{CancelJob, Inner};
use super::submit::MAX_BATCH;
use crate::conn::retry::retry_if_dropped;
use crate::error::{Error, Result};
use std::sync::Arc;
use tokio::sync::mpsc;

pub(super) async fn canceller(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<CancelJob>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if let Err(e) = cancel_batch(&inner, &batch).await {
            tracing::warn!(error = %format_args!("{e:#}"), "withdrawing abandoned requests failed; they run and their outcomes are cached");
        }
        batch.clear();
    }
}

pub(super) async fn cancel_batch(inner: &Inner, jobs: &[CancelJob]) -> Result<()> {
    let sh = &inner.shared;
    let mut inv = sh.scripts.cancel.prepare_invoke();
    inv.key(&sh.keys.stream)
        .key(&sh.keys.req_prefix)
        .arg(&sh.keys.group)
        .arg(&inner.id);
    for j in jobs {
        inv.arg(&j.rid).arg(j.sid.as_deref().unwrap_or(""));
    }
    // Idempotent: a waiter already removed or a request already withdrawn is skipped.
    let inv = &inv;
    let _: i64 = retry_if_dropped(move || async move { inv.invoke_async(&mut sh.conn()).await })
        .await
        .map_err(|e| Error::redis("withdrawing requests", e))?;
    Ok(())
}
