//! `--exec`: a pool of long-lived child processes, each speaking the line protocol
//! (`line.rs`) and supervised by a task of its own (`child.rs`). A request goes to the
//! ready child with the fewest requests in hand; `--concurrency` (enforced by the
//! consumer's `serve`) is the total in flight, spread over the children.

use super::child::{self, Child};
use super::{line, Body, Request, Settings};
use crate::exit::{CliError, CliResult};
use pelican::HandlerError;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the pool's tasks and its callers share.
pub struct Shared {
    /// The command and its arguments.
    pub argv: Vec<String>,
    pub settings: Settings,
    /// How long a child may take to write its hello.
    pub start_timeout: Duration,
    /// The child running in each slot, while it is ready.
    pub slots: Vec<Mutex<Option<Arc<Child>>>>,
    /// Notified when a child becomes ready.
    pub ready: Notify,
    pub stop: CancellationToken,
}

/// The children of `--exec`.
pub struct Pool {
    shared: Arc<Shared>,
    supervisors: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// Starts `processes` children of `argv` and waits until each has said hello (or
    /// fails with the first one that could not start).
    pub async fn start(
        argv: Vec<String>,
        processes: usize,
        start_timeout: Duration,
        settings: Settings,
    ) -> CliResult<Pool> {
        let shared = Arc::new(Shared {
            argv,
            settings,
            start_timeout,
            slots: (0..processes).map(|_| Mutex::new(None)).collect(),
            ready: Notify::new(),
            stop: CancellationToken::new(),
        });
        if processes > shared.settings.concurrency {
            eprintln!(
                "{}: --processes {processes} is more than --concurrency {}: some children \
                 will never get a request",
                shared.settings.log_prefix, shared.settings.concurrency
            );
        }
        let mut firsts = Vec::new();
        let supervisors = (0..processes)
            .map(|slot| {
                let (tx, rx) = oneshot::channel();
                firsts.push(rx);
                tokio::spawn(child::supervise(shared.clone(), slot, Some(tx)))
            })
            .collect();
        let pool = Pool {
            shared,
            supervisors: Mutex::new(supervisors),
        };
        for rx in firsts {
            let started = rx
                .await
                .unwrap_or_else(|_| Err("its supervisor stopped".into()));
            if let Err(reason) = started {
                pool.shutdown().await;
                return Err(CliError::usage(format!(
                    "--exec: {reason}. The command must start, write the hello line \
                     {{\"pelican\": {}}} on stdout, then answer one line per request (see \
                     the README, \"From any language\")",
                    line::VERSION
                )));
            }
        }
        Ok(pool)
    }

    /// Hands `req` to a child and waits for its answer. No ready child within the
    /// handler timeout, or no answer within it (the child is then taken for hung and
    /// restarted), or the child's end: a retry.
    pub async fn call(&self, req: Request) -> Result<Body, HandlerError> {
        let s = &self.shared;
        let timeout = s.settings.handler_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut line = line::request(&req);
        let (child, rx) = loop {
            let notified = s.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(c) = self.pick() {
                match c.send(&req.id, line) {
                    Ok(rx) => break (c, rx),
                    // It went away between the pick and the send: pick again.
                    Err(l) => {
                        line = l;
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(HandlerError::retry(format!(
                        "no --exec child was ready within --handler-timeout ({} ms)",
                        timeout.as_millis()
                    )));
                }
                _ = s.stop.cancelled() => {
                    // Released at once: another worker takes it.
                    return Err(HandlerError::RetryAfter(
                        Duration::ZERO,
                        "the worker is stopping".into(),
                    ));
                }
            }
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(HandlerError::retry(format!(
                "child {} (pid {}) went away",
                child.slot, child.pid
            ))),
            Err(_) => {
                let why = format!(
                    "child {} (pid {}) did not answer request {:?} within --handler-timeout \
                     ({} ms): taken for hung",
                    child.slot,
                    child.pid,
                    req.id,
                    timeout.as_millis()
                );
                child.fail(why.clone());
                Err(HandlerError::retry(why))
            }
        }
    }

    /// The ready child with the fewest requests in hand.
    fn pick(&self) -> Option<Arc<Child>> {
        self.shared
            .slots
            .iter()
            .filter_map(|slot| {
                let c = slot.lock().unwrap().clone()?;
                Some((c.load()?, c))
            })
            .min_by_key(|(load, _)| *load)
            .map(|(_, c)| c)
    }

    /// Stops every child (stdin closed and SIGTERM, SIGKILL after a grace period) and
    /// waits for their supervisors.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        let supervisors = std::mem::take(&mut *self.supervisors.lock().unwrap());
        for s in supervisors {
            let _ = s.await;
        }
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--exec {:?} x {} processes",
            self.shared.argv.join(" "),
            self.shared.slots.len()
        )
    }
}

/// Splits a command line into words as a POSIX shell would, without running one:
/// blanks separate words, 'single quotes' keep everything, "double quotes" keep all but
/// `\"` and `\\`, a backslash outside quotes keeps the next character. No variables,
/// globs, pipes or redirections (for those: `--exec "sh -c '...'"`).
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("a ' is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("a \" is not closed".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("a \" is not closed".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err("it ends with a lone backslash".into()),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if words.is_empty() {
        return Err("no command given".into());
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_as_a_shell_would() {
        let w = |s: &str| split_words(s).unwrap();
        assert_eq!(w("python3 w.py"), ["python3", "w.py"]);
        assert_eq!(
            w("  a   'b c'  \"d \\\" e\" f\\ g ''"),
            ["a", "b c", "d \" e", "f g", ""]
        );
        assert_eq!(w("sh -c 'exec x \"$1\"'"), ["sh", "-c", "exec x \"$1\""]);
        assert_eq!(w(r#""a\nb""#), ["a\\nb"]);
        for bad in ["", "   ", "'open", "\"open", "end\\"] {
            assert!(split_words(bad).is_err(), "{bad:?}");
        }
    }
}
