//! The one error type of the crate.

use std::fmt;
use std::sync::Arc;

/// What went wrong, in terms a caller can act on. See [`Error::is_retryable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No outcome arrived before the request's timeout.
    Timeout,
    /// The handler failed the request for good ([`crate::Delivery::fail`]); the message is its.
    Remote,
    /// The request was dead-lettered: it was delivered `max_deliveries` times without an
    /// outcome (its consumers died or kept retrying), or it could not be decoded.
    Dead,
    /// The request's deadline passed before any consumer solved it.
    Expired,
    /// The request was withdrawn before it was solved (producer shut down, or withdrawn by hand).
    Cancelled,
    /// Redis answered with an error, or could not be reached.
    Redis,
    /// A request or response could not be encoded or decoded.
    Codec,
    /// A body is larger than the configured maximum.
    TooLarge,
    /// Invalid configuration: a bad URL, queue name, request id or setting.
    Config,
    /// The producer or consumer has been shut down.
    Shutdown,
    /// A bug in pelican: one of its background tasks panicked (the message says which).
    /// The producer or consumer cannot go on; drop it and connect a new one.
    Internal,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Remote => "remote error",
            ErrorKind::Dead => "dead-lettered",
            ErrorKind::Expired => "expired",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Redis => "redis error",
            ErrorKind::Codec => "codec error",
            ErrorKind::TooLarge => "too large",
            ErrorKind::Config => "configuration error",
            ErrorKind::Shutdown => "shut down",
            ErrorKind::Internal => "internal error",
        }
    }
}

/// The error of every fallible pelican operation: a [`ErrorKind`], a message and, where
/// there is one, the underlying error as [`std::error::Error::source`].
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config, message)
    }

    pub(crate) fn redis(context: &str, err: redis::RedisError) -> Self {
        Error::new(ErrorKind::Redis, format!("{context}: {err}")).with_source(err)
    }

    pub(crate) fn codec(
        context: &str,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::new(ErrorKind::Codec, format!("{context}: {err}")).with_source(err)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message (for [`ErrorKind::Remote`], the handler's own words).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether submitting the same request again may succeed: timeouts, expiry,
    /// cancellation and Redis faults are passing; remote errors, dead letters, bad input
    /// and configuration are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Timeout | ErrorKind::Expired | ErrorKind::Cancelled | ErrorKind::Redis
        )
    }

    /// Whether this is a timeout (local [`ErrorKind::Timeout`] or [`ErrorKind::Expired`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, ErrorKind::Timeout | ErrorKind::Expired)
    }

    /// Whether the outcome came from the queue's side: the handler's error, a dead
    /// letter, an expiry or a withdrawal recorded in Redis.
    pub fn is_remote(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Remote | ErrorKind::Dead | ErrorKind::Expired | ErrorKind::Cancelled
        )
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
