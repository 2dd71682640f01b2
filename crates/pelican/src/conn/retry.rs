//! Retrying: backoff for reconnect loops, and one more try for idempotent commands that
//! failed on a dropped connection.

use std::time::Duration;

/// Runs `op`, an idempotent command, once more if it failed on a dropped connection.
/// A `ConnectionManager` (RESP2) learns that its connection died only from the first
/// command that fails on it, and reconnects in the background; a command that is
/// safe to repeat need not fail its caller for that.
pub(crate) async fn retry_if_dropped<T, Fut>(mut op: impl FnMut() -> Fut) -> redis::RedisResult<T>
where
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    match op().await {
        Err(e) if e.is_connection_dropped() => op().await,
        r => r,
    }
}

/// Exponential backoff for reconnect loops: 50 ms doubling up to 2 s.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(50))
    }
    pub(crate) fn reset(&mut self) {
        self.0 = Duration::from_millis(50);
    }
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        d
    }
}
