//! The bench's worker processes: children of this binary (`pelican bench --serve-worker`),
//! started before the producer, watched while it runs (a worker that dies fails the run
//! at once instead of at the request timeout) and stopped by pid at the end: SIGTERM,
//! then SIGKILL after 5 s, and reaped. A child never outlives the bench: dropping
//! [`Workers`] kills what is left, and on Linux a child also dies with the bench (see
//! `process::detach`).

use crate::exit::{CliError, CliResult};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a worker may take to connect and say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a worker gets to stop on SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The line a worker prints on stdout once it serves.
pub const READY_LINE: &str = "pelican-bench-worker-ready";

/// One running worker.
struct Worker {
    pid: u32,
    /// Resolves with its exit status (owned by its watcher task).
    exited: Option<oneshot::Receiver<Option<ExitStatus>>>,
    watcher: JoinHandle<()>,
}

/// The worker processes of one run.
pub struct Workers {
    live: Vec<Worker>,
    /// Which worker exited unexpectedly (index, status).
    deaths: mpsc::UnboundedReceiver<(usize, Option<ExitStatus>)>,
    death_tx: mpsc::UnboundedSender<(usize, Option<ExitStatus>)>,
}

impl Workers {
    /// Starts `n` workers running `exe args...` and waits until each has printed its
    /// ready line (one deadline for all).
    pub async fn start(exe: &std::path::Path, args: &[String], n: usize) -> CliResult<Workers> {
        Workers::start_with(exe, args, n, READY_LINE).await
    }

    /// [`Workers::start`] of processes that say they are ready with `ready` (a line that
    /// starts with it): the gateway of `--via-gateway`.
    pub async fn start_with(
        exe: &std::path::Path,
        args: &[String],
        n: usize,
        ready: &'static str,
    ) -> CliResult<Workers> {
        let (death_tx, deaths) = mpsc::unbounded_channel();
        let mut workers = Workers {
            live: Vec::new(),
            deaths,
            death_tx,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pending = Vec::new();
        for _ in 0..n {
            pending.push(workers.spawn(exe, args, ready)?);
        }
        for (slot, ready) in pending.into_iter().enumerate() {
            let pid = workers.live[slot].pid;
            match tokio::time::timeout_at(deadline, ready).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    // It closed stdout: it is exiting (or, oddly, not: then it is killed
                    // with the others when `workers` drops).
                    let status = match workers.live[slot].exited.as_mut() {
                        Some(rx) => tokio::time::timeout(STOP_TIMEOUT, rx)
                            .await
                            .ok()
                            .and_then(Result::ok)
                            .flatten(),
                        None => None,
                    };
                    return Err(CliError::failure(format!(
                        "the bench worker process {pid} exited during start-up ({}); its \
                         messages, if any, are above",
                        describe(status)
                    )));
                }
                Err(_) => {
                    return Err(CliError::failure(format!(
                        "the bench worker process {pid} did not get ready within \
                         {READY_TIMEOUT:?}; run with -v for its logs"
                    )))
                }
            }
        }
        Ok(workers)
    }

    /// Spawns one worker; the receiver resolves when it printed its ready line (an error
    /// when it closed stdout or exited first).
    fn spawn(
        &mut self,
        exe: &std::path::Path,
        args: &[String],
        ready: &'static str,
    ) -> CliResult<oneshot::Receiver<()>> {
        let mut std_cmd = std::process::Command::new(exe);
        std_cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        crate::process::detach(&mut std_cmd);
        let mut cmd = tokio::process::Command::from(std_cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            CliError::failure(format!(
                "cannot start the bench worker process ({}): {e}",
                exe.display()
            ))
        })?;
        let pid = child.id().unwrap_or(0);
        let slot = self.live.len();
        let stdout = child.stdout.take().expect("piped");
        let (ready_tx, ready_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let deaths = self.death_tx.clone();
        // The watcher owns the child: it reads the ready line, keeps reading stdout (a
        // closed pipe would make a later write fail in the worker) and reports the exit.
        let watcher = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut ready_tx = Some(ready_tx);
            let mut stdout_open = true;
            let status = loop {
                tokio::select! {
                    line = lines.next_line(), if stdout_open => match line {
                        Ok(Some(l)) if l.trim().starts_with(ready) => {
                            if let Some(tx) = ready_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        Ok(Some(l)) => eprintln!("bench worker {pid}: {l}"),
                        Ok(None) | Err(_) => stdout_open = false,
                    },
                    status = child.wait() => break status.ok(),
                }
            };
            // ready_tx, if still here, is dropped: start-up failed.
            drop(ready_tx);
            let _ = deaths.send((slot, status));
            let _ = exit_tx.send(status);
        });
        self.live.push(Worker {
            pid,
            exited: Some(exit_rx),
            watcher,
        });
        Ok(ready_rx)
    }

    /// The workers' pids.
    pub fn pids(&self) -> Vec<u32> {
        self.live.iter().map(|w| w.pid).collect()
    }

    /// Resolves when a worker exits while it should be serving: an error that says which
    /// and how. Pending forever while they all run.
    pub async fn died(&mut self) -> CliError {
        match self.deaths.recv().await {
            Some((slot, status)) => CliError::failure(format!(
                "the bench worker process {} exited in the middle of the run ({}); its \
                 messages, if any, are above",
                self.live[slot].pid,
                describe(status)
            )),
            None => std::future::pending().await,
        }
    }

    /// Stops every worker by pid: SIGTERM (they finish or release what they hold and
    /// leave the group), SIGKILL after 5 s, and reaps them. Returns a warning for each
    /// worker that did not stop cleanly.
    pub async fn stop(mut self) -> Vec<String> {
        for w in &mut self.live {
            // One that exited already (reported by `died`) is not signalled: its pid may
            // belong to another process by now.
            let running = match w.exited.as_mut() {
                Some(rx) => matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
                None => false,
            };
            if running {
                crate::process::signal(w.pid, libc::SIGTERM);
            } else {
                w.exited = None;
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut warnings = Vec::new();
        for w in &mut self.live {
            let Some(mut rx) = w.exited.take() else {
                continue;
            };
            let status = match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(s) => s.ok().flatten(),
                Err(_) => {
                    warnings.push(format!(
                        "bench worker {} did not stop within {STOP_TIMEOUT:?} of SIGTERM; \
                         sent SIGKILL",
                        w.pid
                    ));
                    crate::process::signal(w.pid, libc::SIGKILL);
                    match tokio::time::timeout(STOP_TIMEOUT, rx).await {
                        Ok(s) => s.ok().flatten(),
                        Err(_) => {
                            warnings.push(format!("bench worker {} survived SIGKILL", w.pid));
                            None
                        }
                    }
                }
            };
            if let Some(s) = status.filter(|s| !s.success()) {
                warnings.push(format!(
                    "bench worker {} stopped with {}",
                    w.pid,
                    describe(Some(s))
                ));
            }
        }
        self.live.clear();
        warnings
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Only on an early exit: `stop` empties the list. The watcher owns the child, and
        // aborting it drops the child, which kills it (kill_on_drop); SIGKILL by pid as
        // well, in case the watcher is not polled again.
        for w in &self.live {
            if !w.watcher.is_finished() {
                crate::process::signal(w.pid, libc::SIGKILL);
            }
            w.watcher.abort();
        }
    }
}

fn describe(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("killed by {}", crate::process::signal_name(sig)),
            _ => s.to_string(),
        },
        None => "exit status unknown".into(),
    }
}
