//! Exit codes, and the one error type of the command: a code and a message that says
//! what happened and what to do about it.

use pelican::ErrorKind;
use std::fmt;
use std::process::ExitCode;

/// Success.
pub const OK: u8 = 0;
/// Anything not covered below (Redis unreachable, I/O, a bug).
pub const FAILURE: u8 = 1;
/// Bad usage or configuration (clap uses 2 for usage errors too).
pub const USAGE: u8 = 2;
/// The request failed remotely: the handler said so.
pub const REMOTE: u8 = 3;
/// Timeout, expired, dead-lettered or cancelled.
pub const GAVE_UP: u8 = 4;

/// An error on its way to the user: printed on stderr, then the process exits with `code`.
#[derive(Debug)]
pub struct CliError {
    /// The exit code.
    pub code: u8,
    /// What happened and what to do about it.
    pub message: String,
}

/// `Result` with [`CliError`].
pub type CliResult<T = ()> = Result<T, CliError>;

impl CliError {
    /// An error with this exit code.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// A usage or configuration error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::new(USAGE, message)
    }

    /// Anything else (exit 1).
    pub fn failure(message: impl Into<String>) -> Self {
        CliError::new(FAILURE, message)
    }

    /// Maps a library error to its exit code and adds advice for the queue `queue` on the
    /// Redis at `url`.
    pub fn from_pelican(err: &pelican::Error, url: &str, queue: &str) -> Self {
        let msg = &with_causes(err);
        match err.kind() {
            ErrorKind::Remote => {
                CliError::new(REMOTE, format!("the request failed remotely: {msg}"))
            }
            ErrorKind::Timeout => CliError::new(
                GAVE_UP,
                format!(
                    "timeout: {msg}. Is a worker serving queue {queue:?}? Start one with \
                     `pelican worker --queue {queue}`, check `pelican stats --queue {queue}`, \
                     or raise --timeout"
                ),
            ),
            ErrorKind::Expired => CliError::new(
                GAVE_UP,
                format!(
                    "expired: {msg}. No worker started it before its deadline: start more \
                     workers (`pelican worker --queue {queue}`) or raise --timeout"
                ),
            ),
            ErrorKind::Dead => CliError::new(
                GAVE_UP,
                format!(
                    "dead-lettered: {msg}. Inspect it with `pelican dead list --queue {queue}`; \
                     once the worker is fixed, put it back with `pelican dead requeue ID`"
                ),
            ),
            ErrorKind::Cancelled => CliError::new(
                GAVE_UP,
                format!(
                    "cancelled: {msg}. It was withdrawn before a worker solved it; submit it again"
                ),
            ),
            ErrorKind::Config => CliError::usage(format!("{msg} (see `pelican --help`)")),
            ErrorKind::Codec => CliError::failure(format!(
                "{msg}. Requests and responses on this queue must be JSON: is another \
                 application using queue {queue:?}?"
            )),
            ErrorKind::TooLarge => CliError::failure(format!(
                "{msg}. Send a reference to the data (a key or a URL) instead of the data"
            )),
            ErrorKind::Redis => CliError::failure(format!(
                "redis error: {msg}. Check that the server at {} is Redis 7.0 or newer and reachable \
                 (`redis-cli -u URL ping`){}",
                pelican::admin::redacted_url(url),
                if url.starts_with("rediss+cluster://") {
                    "; a TLS cluster must name its TLS ports in CLUSTER SLOTS \
                     (nodes with `tls-cluster yes`, or TLS only with `port 0`)"
                } else {
                    ""
                }
            )),
            _ => CliError::failure(format!("{err:#}")),
        }
    }
}

/// The error's message followed by its causes (the `source` chain), each said once.
pub fn with_causes(err: &pelican::Error) -> String {
    err.message_with_causes()
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Prints the error (if any) and turns the outcome into the process's exit code.
pub fn finish(result: CliResult) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(OK),
        Err(e) => {
            crate::logging::say(tracing::Level::ERROR, &format!("pelican: {}", e.message));
            ExitCode::from(e.code)
        }
    }
}
