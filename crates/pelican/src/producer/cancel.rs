//! Withdrawals: a request nobody waits for any more is taken off the queue.

use super::pending::CancelJob;
use super::state::Inner;
use super::submit::MAX_BATCH;
use crate::conn::retry::retry_idempotent;
use crate::error::{Error, Result};
use crate::protocol::scripts::{Cancel, CancelRequest};
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
    let call = Cancel {
        producer: &inner.id,
    }
    .call(
        &sh.scripts,
        jobs.iter().map(|j| CancelRequest {
            rid: &j.rid,
            sid: j.sid.as_deref(),
        }),
    );
    // Idempotent: a waiter already removed or a request already withdrawn is skipped.
    let call = &call;
    retry_idempotent(move || async move { call.invoke(&mut sh.conn()).await })
        .await
        .map_err(|e| Error::redis("withdrawing requests", e))?;
    Ok(())
}
