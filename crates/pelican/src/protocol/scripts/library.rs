//! pelican's scripts as one Redis function library (`FUNCTION LOAD`, called with `FCALL`).
//!
//! The library is `lib.lua`, then each script file as the body of a function of its
//! own:
//!
//! ```lua
//! redis.register_function('<library>_<script>', function(KEYS, ARGV) begin_call() <script> end)
//! ```
//!
//! A script file reads as it did when it was run with `EVALSHA` (its
//! `KEYS` and `ARGV` are the function's arguments).
//!
//! Why a library and not scripts: a script sent with `EVALSHA` runs its whole text at every
//! call, and the helpers prepended to it were made afresh each time (a closure per
//! helper, their tables, then the garbage): ~26k of Redis' instructions per call, two
//! calls per request. A library's top level runs once, when it is loaded. With one
//! request per call (requests that take seconds, the sequential bench) Redis' work per
//! request went from 374k instructions to 325k
//! (docs/benchmarks/2026-12-03-f4574d3-function-library.md).
//!
//! Versions side by side: the library's name carries a hash of its code
//! (`pelican_<16 hex digits>`), and so does each function's, so producers and consumers
//! of different versions on one Redis each call their own. A library stays until it is
//! deleted (`FUNCTION DELETE`): one per version that ran, a few tens of KB each.
//!
//! Loading: the first call a server does not know (`ERR Function not found`: a server
//! that never saw this version, a restart without persistence, a `FUNCTION FLUSH`) loads
//! the library (`FUNCTION LOAD REPLACE`, on every master of a cluster) and is sent again.

use redis::{ErrorKind, RedisError, RedisResult};
use std::sync::OnceLock;

const LIB: &str = include_str!("../../../lua/lib.lua");

/// The scripts of the library: (the function's name after the library's, its file).
const SCRIPTS: &[(&str, &str)] = &[
    ("submit", include_str!("../../../lua/submit.lua")),
    ("complete", include_str!("../../../lua/complete.lua")),
    ("reclaim", include_str!("../../../lua/reclaim.lua")),
    ("renew", include_str!("../../../lua/renew.lua")),
    ("release", include_str!("../../../lua/release.lua")),
    ("reject", include_str!("../../../lua/reject.lua")),
    ("cancel", include_str!("../../../lua/cancel.lua")),
    ("forget", include_str!("../../../lua/forget.lua")),
    ("janitor", include_str!("../../../lua/janitor.lua")),
    ("requeue", include_str!("../../../lua/requeue.lua")),
    ("watch", include_str!("../../../lua/watch.lua")),
];

/// The library: its name and its code, as `FUNCTION LOAD` takes it.
pub(crate) struct Library {
    pub(crate) name: String,
    pub(crate) code: String,
}

/// The library of this build (assembled once per process).
pub(crate) fn library() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let mut hasher = blake3::Hasher::new();
        hasher.update(LIB.as_bytes());
        for (name, body) in SCRIPTS {
            hasher.update(name.as_bytes()).update(body.as_bytes());
        }
        let hash = hasher.finalize().to_hex();
        let name = format!("pelican_{}", &hash[..16]);
        let mut code = format!("#!lua name={name}\n{LIB}\n");
        for (script, body) in SCRIPTS {
            code.push_str(&format!(
                "redis.register_function('{name}_{script}', function(KEYS, ARGV)\n\
                 begin_call()\n{body}\nend)\n"
            ));
        }
        Library { name, code }
    })
}

/// One function of the library, by its full name.
pub(crate) struct Function {
    pub(crate) name: String,
}

impl Function {
    /// The function registered for `script` (a file name without `.lua`).
    pub(crate) fn new(script: &str) -> Function {
        debug_assert!(SCRIPTS.iter().any(|(s, _)| *s == script), "{script}");
        Function {
            name: format!("{}_{script}", library().name),
        }
    }
}

/// Loads the library (on a cluster, the client library sends it to every master).
/// `REPLACE`: two processes loading it at once both succeed, and a server that has it
/// already keeps the same code.
pub(crate) async fn load(conn: &mut (impl redis::aio::ConnectionLike + Send)) -> RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&library().code)
        .query_async::<redis::Value>(conn)
        .await
        .map(drop)
}

/// Whether a call failed only because the server does not have what it calls: a
/// function of a library it has not loaded (`ERR Function not found`) or, for the
/// scripts sent with `EVALSHA` (the Nitro format's), a script it has not seen
/// (`NOSCRIPT`). Nothing of the call was done: it is sent again once it is loaded.
pub(crate) fn not_loaded(e: &RedisError) -> bool {
    match e.code() {
        Some("NOSCRIPT") => true,
        Some("ERR") => e
            .detail()
            .is_some_and(|d| d.starts_with("Function not found")),
        _ => false,
    }
}

/// The error for a server without functions (Redis before 7.0: `ERR unknown command
/// 'FCALL'`) in place of the server's own words, which do not say what to do; any other
/// error as it is. Not retryable: the same server answers the same again.
pub(crate) fn explain(e: RedisError) -> RedisError {
    let unknown = e.code() == Some("ERR")
        && e.detail().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            d.starts_with("unknown command") && d.contains("fcall")
        });
    if !unknown {
        return e;
    }
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "this server has no functions (FCALL): pelican needs Redis 7.0 or newer, or Valkey",
        e.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error Redis' error reply `line` (without its `-` and CRLF) becomes.
    fn err(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => RedisError::from(e),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_script_is_a_function_of_one_library_named_by_its_code() {
        let lib = library();
        assert!(lib.name.starts_with("pelican_") && lib.name.len() == 8 + 16);
        assert!(lib.code.starts_with(&format!("#!lua name={}\n", lib.name)));
        for (script, _) in SCRIPTS {
            let f = Function::new(script);
            assert_eq!(f.name, format!("{}_{script}", lib.name));
            assert!(lib
                .code
                .contains(&format!("register_function('{}'", f.name)));
        }
    }

    #[test]
    fn a_missing_function_or_script_is_told_from_other_errors() {
        assert!(not_loaded(&err("ERR Function not found")));
        assert!(not_loaded(&err(
            "NOSCRIPT No matching script. Please use EVAL."
        )));
        assert!(!not_loaded(&err("ERR Error running script")));
        assert!(!not_loaded(&err(
            "NOPERM this user has no permissions to run the 'fcall' command"
        )));
    }

    #[test]
    fn a_server_without_fcall_is_named_too_old() {
        // Redis 6.2's words, and 7.0's for a renamed command
        for line in [
            "ERR unknown command `FCALL`, with args beginning with: `pelican_x_submit`, ",
            "ERR unknown command 'FCALL', with args beginning with: 'pelican_x_submit' ",
        ] {
            let e = explain(err(line));
            assert_eq!(e.kind(), ErrorKind::InvalidClientConfig, "{e}");
            assert!(e.to_string().contains("Redis 7.0 or newer"), "{e}");
        }
        let other = explain(err("ERR unknown command 'FROB'"));
        assert_eq!(other.code(), Some("ERR"));
    }
}
