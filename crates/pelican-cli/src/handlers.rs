//! The worker's built-in handlers, for demos and tests. Requests and responses are JSON.
//!
//! A handler is a chain of steps joined by commas, run in order; the response is the
//! request (echo) once every step has passed:
//! - `echo`: nothing more (the response is the request);
//! - `sleep:MS`: wait MS milliseconds;
//! - `fail-if:FIELD`: fail remotely when the request has `"FIELD": true`;
//! - `crash-if:FIELD`: abort the whole process at once when the request has
//!   `"FIELD": true` (to make poison requests: the request stays with the dead worker
//!   and is taken over by another after claim_idle, until it is dead-lettered).

use crate::exit::CliError;
use pelican::HandlerError;
use serde_json::Value;
use std::fmt;
use std::time::Duration;

/// One step of a handler chain.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Echo,
    Sleep(Duration),
    FailIf(String),
    CrashIf(String),
}

/// A parsed `--handler` chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    steps: Vec<Step>,
}

const HELP: &str = "use echo, sleep:MS, fail-if:FIELD or crash-if:FIELD, or several joined by \
                    commas (e.g. crash-if:poison,sleep:50)";

impl Handler {
    /// Parses a chain such as `crash-if:poison,sleep:50`.
    pub fn parse(spec: &str) -> Result<Handler, CliError> {
        let bad = |what: String| CliError::usage(format!("bad --handler {spec:?}: {what}; {HELP}"));
        let mut steps = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let (name, arg) = match part.split_once(':') {
                Some((n, a)) => (n, Some(a)),
                None => (part, None),
            };
            let field = |arg: Option<&str>| match arg {
                Some(f) if !f.is_empty() => Ok(f.to_string()),
                _ => Err(bad(format!(
                    "{name} needs a field name, as in {name}:poison"
                ))),
            };
            steps.push(match name {
                "echo" if arg.is_none() => Step::Echo,
                "sleep" => {
                    let ms: u64 = arg.and_then(|a| a.parse().ok()).ok_or_else(|| {
                        bad("sleep needs a number of milliseconds, as in sleep:50".into())
                    })?;
                    Step::Sleep(Duration::from_millis(ms))
                }
                "fail-if" => Step::FailIf(field(arg)?),
                "crash-if" => Step::CrashIf(field(arg)?),
                "" => return Err(bad("empty step".into())),
                other => return Err(bad(format!("unknown handler {other:?}"))),
            });
        }
        Ok(Handler { steps })
    }

    /// Runs the chain on one request.
    pub async fn handle(&self, req: Value) -> Result<Value, HandlerError> {
        for step in &self.steps {
            match step {
                Step::Echo => {}
                Step::Sleep(d) => tokio::time::sleep(*d).await,
                Step::FailIf(f) if flag(&req, f) => {
                    return Err(HandlerError::fail(format!(
                        "fail-if:{f}: the request has \"{f}\": true"
                    )));
                }
                Step::CrashIf(f) if flag(&req, f) => {
                    crate::logging::say(
                        tracing::Level::ERROR,
                        &format!(
                            "pelican worker: crash-if:{f}: the request has \"{f}\": true; \
                             aborting the process on purpose (another worker takes the \
                             request over after claim_idle, until it is dead-lettered)"
                        ),
                    );
                    no_core_dump();
                    std::process::abort();
                }
                Step::FailIf(_) | Step::CrashIf(_) => {}
            }
        }
        Ok(req)
    }
}

/// An abort on purpose is not worth a core dump.
fn no_core_dump() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &zero);
    }
}

fn flag(req: &Value, field: &str) -> bool {
    req.get(field) == Some(&Value::Bool(true))
}

impl fmt::Display for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Echo => "echo".into(),
                Step::Sleep(d) => format!("sleep:{}", d.as_millis()),
                Step::FailIf(x) => format!("fail-if:{x}"),
                Step::CrashIf(x) => format!("crash-if:{x}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Prints the `--verbose` line of one handler run (`pelican worker`, `pelican nitro
/// worker`): `ids` name the request (`rid`, `entry`), in the order shown.
pub fn print_handled<T>(
    json_lines: bool,
    consumer: &str,
    ids: &[(&str, &str)],
    delivery: u32,
    result: &Result<T, HandlerError>,
    took: Duration,
) {
    let (outcome, error) = match result {
        Ok(_) => ("ok", None),
        Err(HandlerError::Fail(m)) => ("failed", Some(m.as_str())),
        Err(HandlerError::Retry(m)) | Err(HandlerError::RetryAfter(_, m)) => {
            ("retry", Some(m.as_str()))
        }
        Err(_) => ("failed", None),
    };
    let ms = (took.as_secs_f64() * 10_000.0).round() / 10.0;
    if json_lines {
        let mut v = serde_json::json!({ "event": "handled", "consumer": consumer });
        for (name, id) in ids {
            v[*name] = serde_json::json!(id);
        }
        v["delivery"] = serde_json::json!(delivery);
        v["outcome"] = serde_json::json!(outcome);
        v["ms"] = serde_json::json!(ms);
        if let Some(e) = error {
            v["error"] = serde_json::json!(e);
        }
        outln!("{v}");
    } else {
        let ids: String = ids.iter().map(|(n, id)| format!("{n}={id} ")).collect();
        outln!(
            "{outcome:<6} {ids}delivery={delivery} {ms}ms{}",
            error.map(|e| format!(": {e}")).unwrap_or_default()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chains_parse_and_print() {
        let h = Handler::parse("crash-if:poison, sleep:50,fail-if:bad,echo").unwrap();
        assert_eq!(h.to_string(), "crash-if:poison,sleep:50,fail-if:bad,echo");
        for bad in [
            "",
            "nope",
            "sleep",
            "sleep:x",
            "fail-if",
            "crash-if:",
            "echo:1",
            "echo,,echo",
        ] {
            let e = Handler::parse(bad).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{bad}");
            assert!(e.message.contains("sleep:MS"), "{e}");
        }
    }

    #[tokio::test]
    async fn steps_do_what_they_say() {
        let h = Handler::parse("fail-if:bad,sleep:1").unwrap();
        let req = json!({"n": 1, "bad": false});
        assert_eq!(h.handle(req.clone()).await.unwrap(), req);
        let err = h.handle(json!({"bad": true})).await.unwrap_err();
        assert!(matches!(err, HandlerError::Fail(m) if m.contains("\"bad\": true")));
        // crash-if only fires on `true`
        let h = Handler::parse("crash-if:poison").unwrap();
        let req = json!({"poison": "yes"});
        assert_eq!(h.handle(req.clone()).await.unwrap(), req);
    }
}
