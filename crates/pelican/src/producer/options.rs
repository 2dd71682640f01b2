//! Per-call options: a setting that differs per call is an argument of the call
//! (`CallOptions::new().with_timeout(..)`), not a second producer.

use crate::config::validate_request_id;
use crate::error::{Error, Result};
use std::time::Duration;

/// Options of one submission ([`crate::Producer::submit_with`], [`crate::Producer::call_with`]
/// and their `_bytes` forms). Unset options take the producer's settings.
///
/// ```no_run
/// # async fn example(producer: pelican::Producer<String, String>) -> pelican::Result<()> {
/// use pelican::CallOptions;
/// use std::time::Duration;
///
/// let answer = producer
///     .call_with(
///         &"resize photo 7".to_string(),
///         CallOptions::new()
///             .with_timeout(Duration::from_secs(5))
///             .with_request_id("order-1234-thumbnail"),
///     )
///     .await?;
/// # let _ = answer; Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CallOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) request_id: Option<String>,
}

impl CallOptions {
    /// No option set: the producer's settings.
    pub fn new() -> Self {
        CallOptions::default()
    }

    /// How long this call may take, from submission to outcome, instead of the
    /// producer's `request_timeout`; it is also the request's deadline in the queue.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// A request id of the caller's choosing (1 to 256 bytes, no control characters)
    /// instead of the hash of the body. With dedup on it is the dedup key: submissions
    /// with the same id share one solution, whatever their bodies (the first body to
    /// arrive is the one handled), so a caller can retry a call safely across its own
    /// restarts.
    #[must_use]
    pub fn with_request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Checks the options; a [`crate::ErrorKind::Config`] error for a zero timeout or a
    /// bad request id.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config("a call's timeout must be more than zero"));
        }
        if let Some(id) = &self.request_id {
            validate_request_id(id)?;
        }
        Ok(())
    }
}
