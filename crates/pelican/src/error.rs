//! The one error type of the crate.

use std::fmt;
use std::sync::Arc;

/// What went wrong, in terms a caller can act on. See [`Error::is_retryable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// This caller stopped waiting: no outcome arrived within its timeout
    /// ([`crate::ProducerConfig::request_timeout`]). A decision of the caller's side: the
    /// request itself may still be solved afterwards (and with dedup, its outcome cached
    /// for the next identical request). Compare [`ErrorKind::Expired`].
    Timeout,
    /// The handler failed the request for good: [`crate::HandlerError::fail`] from a
    /// [`crate::Consumer::serve`] handler, or [`crate::Delivery::fail`]; the message is the
    /// handler's. Every caller waiting for the request gets it; a later identical request
    /// runs again, unless within [`crate::QueueConfig::failure_ttl`].
    Remote,
    /// The request was dead-lettered: it was delivered `max_deliveries` times without an
    /// outcome (its consumers died or kept retrying), or it could not be decoded.
    Dead,
    /// The queue gave the request up: its deadline (its submission plus the first
    /// submitter's `request_timeout`) passed before a consumer solved it, and a consumer,
    /// the janitor or a later submission recorded it expired; no consumer starts it any
    /// more. A caller waiting for it whose own deadline is later submits it again instead
    /// of being told. Compare [`ErrorKind::Timeout`], the caller's own wait running out.
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

impl fmt::Display for ErrorKind {
    /// The kind in words (`timeout`, `remote error`, `dead-lettered`, ...), as
    /// [`Error`]'s `Display` starts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of every fallible pelican operation: a [`ErrorKind`], a message and, where
/// there is one, the underlying error as [`std::error::Error::source`].
///
/// `{}` shows the kind and the message, which says what pelican was doing ("redis
/// error: submitting requests"); the cause is not repeated in it, so reporters that
/// print the source chain print it once. `{:#}` adds the causes:
/// "redis error: submitting requests: broken pipe".
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

    /// A Redis failure while doing `context`; `err` is the source.
    pub(crate) fn redis(context: &str, err: redis::RedisError) -> Self {
        Error::new(ErrorKind::Redis, context).with_source(err)
    }

    /// A body that could not be encoded or decoded while doing `context`; `err` is the
    /// source.
    pub(crate) fn codec(
        context: &str,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::new(ErrorKind::Codec, context).with_source(err)
    }

    /// The client library's error behind this one, if that is its cause.
    pub(crate) fn redis_source(&self) -> Option<&redis::RedisError> {
        self.source.as_deref()?.downcast_ref()
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message followed by its causes (the `source` chain), each said once (the
    /// client library's errors repeat their own source's text). `{:#}` shows this too,
    /// after the kind.
    pub fn message_with_causes(&self) -> String {
        let mut out = self.message.clone();
        let mut next = std::error::Error::source(self);
        while let Some(cause) = next {
            let text = cause.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            next = cause.source();
        }
        out
    }

    /// The human-readable message (for [`ErrorKind::Remote`], the handler's own words),
    /// without the cause: see [`std::error::Error::source`], or format with `{:#}`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether submitting the same request again may succeed.
    ///
    /// - Yes for timeouts, expiry and cancellation.
    /// - For [`ErrorKind::Redis`], yes when the fault passes: Redis could not be reached,
    ///   the connection dropped or a reply did not come in time, or the server was in a
    ///   passing state (`LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`,
    ///   `READONLY` after a failover, `MOVED`/`ASK`, `NOREPLICAS`, and `OOM` or `MISCONF`
    ///   until memory or disk are freed). No when Redis refused the command for good:
    ///   ACL denials (`NOPERM`), `NOAUTH`/`WRONGPASS`, `WRONGTYPE`, a script it cannot
    ///   load (`NOSCRIPT`, `ERR Function not found`), `ERR` and any other error reply, or an answer pelican cannot
    ///   make sense of. Sending the same again gets the same answer.
    /// - No for remote errors, dead letters, bad input and configuration.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Timeout | ErrorKind::Expired | ErrorKind::Cancelled => true,
            ErrorKind::Redis => self.redis_source().is_some_and(redis_fault_passes),
            _ => false,
        }
    }

    /// Whether this is a timeout: the caller's own ([`ErrorKind::Timeout`]) or the
    /// queue's ([`ErrorKind::Expired`]).
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

/// Whether a Redis error is one that passes: see [`Error::is_retryable`].
fn redis_fault_passes(e: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    match e.kind() {
        // I/O includes refused, reset and dropped connections, timeouts and replies
        // that were not RESP; a new connection may do better.
        K::Io | K::Parse | K::ClusterConnectionNotFound => true,
        K::Server(_) | K::Extension => matches!(
            e.code(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "TRYAGAIN"
                    | "MASTERDOWN"
                    | "CLUSTERDOWN"
                    | "READONLY"
                    | "MOVED"
                    | "ASK"
                    | "NOREPLICAS"
                    | "OOM"
                    | "MISCONF"
            )
        ),
        _ => false,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return write!(f, "{}: {}", self.kind.as_str(), self.message);
        }
        write!(f, "{}: {}", self.kind.as_str(), self.message_with_causes())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;
    use std::io::ErrorKind as Io;

    /// The client library's error for an error reply `-<line>`.
    fn reply_error(line: &str) -> redis::RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn io(kind: Io) -> redis::RedisError {
        std::io::Error::new(kind, "trouble on the wire").into()
    }

    #[test]
    fn kinds_display_as_errors_start() {
        assert_eq!(ErrorKind::Remote.to_string(), "remote error");
        assert_eq!(ErrorKind::Internal.to_string(), "internal error");
        let e = Error::new(ErrorKind::Expired, "deadline passed");
        assert!(e.to_string().starts_with(&format!("{}: ", e.kind())));
    }

    #[test]
    fn passing_faults_are_retryable_and_refusals_are_not() {
        let mut passing = vec![
            io(Io::ConnectionRefused),
            io(Io::ConnectionReset),
            io(Io::ConnectionAborted),
            io(Io::BrokenPipe),
            io(Io::UnexpectedEof),
            io(Io::TimedOut),
            io(Io::InvalidData),
        ];
        passing.extend(
            [
                "LOADING Redis is loading the dataset in memory",
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
                "TRYAGAIN Multiple keys request during rehashing of slot",
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                "CLUSTERDOWN The cluster is down",
                "READONLY You can't write against a read only replica.",
                "MOVED 3999 127.0.0.1:6381",
                "ASK 3999 127.0.0.1:6381",
                "NOREPLICAS Not enough good replicas to write.",
                "OOM command not allowed when used memory > 'maxmemory'.",
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            ]
            .map(reply_error),
        );
        let mut refusals = [
            "NOPERM User pelican has no permissions to run the 'fcall' command",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOSCRIPT No matching script. Please use EVAL.",
            "ERR Function not found",
            "ERR unknown command 'FROB', with args beginning with: ",
            "ERR syntax error",
            "EXECABORT Transaction discarded because of previous errors.",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "SOMETHINGNEW an error code from a later Redis",
        ]
        .map(reply_error)
        .to_vec();
        refusals.push((redis::ErrorKind::AuthenticationFailed, "no password").into());
        refusals.push((redis::ErrorKind::UnexpectedReturnType, "not a string").into());
        for e in passing {
            assert!(Error::redis("ctx", e.clone()).is_retryable(), "{e}");
        }
        for e in refusals {
            assert!(!Error::redis("ctx", e.clone()).is_retryable(), "{e}");
        }
        // A Redis answer pelican cannot make sense of comes the same way again.
        assert!(!Error::new(ErrorKind::Redis, "unexpected answer from a script").is_retryable());
        assert!(Error::new(ErrorKind::Timeout, "no outcome in time").is_retryable());
        assert!(!Error::new(ErrorKind::Remote, "the handler said no").is_retryable());
    }

    /// What a reporter that walks the `source` chain prints: each link, except one that
    /// only repeats the text of the link before (the client library's errors show their
    /// own source's text).
    fn report(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut prev = out.clone();
        let mut next = e.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if text != prev {
                out.push_str(": ");
                out.push_str(&text);
            }
            prev = text;
            next = cause.source();
        }
        out
    }

    #[test]
    fn the_cause_is_printed_once() {
        let cause = "no permissions to run the 'fcall' command";
        for e in [
            Error::redis(
                "submitting requests",
                reply_error(&format!("NOPERM {cause}")),
            ),
            Error::redis(
                "submitting requests",
                std::io::Error::new(Io::ConnectionReset, cause).into(),
            ),
            Error::codec(
                "submitting requests",
                crate::codec::CodecError(cause.to_string()),
            ),
        ] {
            assert!(!e.to_string().contains(cause), "{e}");
            assert!(e.source().is_some_and(|s| s.to_string().contains(cause)));
            let chain = report(&e);
            assert_eq!(chain.matches(cause).count(), 1, "{chain}");
            let alt = format!("{e:#}");
            assert_eq!(alt.matches(cause).count(), 1, "{alt}");
            assert!(alt.starts_with(&format!("{e}: ")), "{alt}");
        }
    }
}
