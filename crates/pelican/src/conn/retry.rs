//! Retrying: backoff for reconnect loops, and more tries for idempotent commands that
//! failed on a dropped connection or went unanswered.

use std::time::Duration;

/// How long an idempotent command may go unanswered before it is sent again. Redis
/// answers pelican's commands in microseconds to milliseconds; a command sent as its
/// connection is being closed by the other end (a restart, a killed client, a proxy)
/// can instead wait for the whole command timeout in the client library's multiplexed
/// connection (seen with redis-rs 1.8.1: one stall in every 3 to 5 runs of 400 `CLIENT
/// KILL`s). The reconnected connection answers at once.
const QUIET: Duration = Duration::from_secs(2);

/// Tries of an idempotent command, the last one waiting for the full command timeout.
const TRIES: usize = 3;

/// Runs `op`, an idempotent command, again if it failed on a dropped connection or
/// had no answer within [`QUIET`] (at most [`TRIES`] tries; the last one waits for the
/// command timeout). A `ConnectionManager` (RESP2) learns that its connection died only
/// from the first command that fails on it, and reconnects in the background; a command
/// that is safe to repeat need not fail its caller, or wait, for that.
pub(crate) async fn retry_idempotent<T, Fut>(mut op: impl FnMut() -> Fut) -> redis::RedisResult<T>
where
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    for _ in 1..TRIES {
        match tokio::time::timeout(QUIET, op()).await {
            Ok(Err(e)) if e.is_connection_dropped() => {}
            Ok(r) => return r,
            Err(_) => {
                tracing::debug!(quiet = ?QUIET, "no answer to an idempotent command; sending it again");
            }
        }
    }
    op().await
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
