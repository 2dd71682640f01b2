//! One `--exec` child process: started, greeted, fed request lines, its answers matched
//! to their requests by id, its stderr forwarded, and, when it exits, hangs or writes a
//! line that is not an answer, its requests handed back and the process group killed.
//! The supervisor ([`supervise`]) restarts it with capped exponential backoff.

use super::exec::Shared;
use super::line::{self, Answer};
use super::read::{read_line, Read};
use super::Body;
use pelican::HandlerError;
use std::collections::HashMap;
use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// First pause before a restart; doubled after each child that answered nothing.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest pause between two restarts: a child that dies at once, every time, is started
/// at most every 10 s.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long a child may take to exit after SIGTERM before it gets SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long answers written just before an exit are still read.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);
/// Longest stderr line forwarded whole.
const MAX_LOG_LINE: usize = 16 << 10;

/// What a request waits for.
pub type Outcome = Result<Body, HandlerError>;

/// A running child, as callers see it.
pub struct Child {
    /// Its pid (and process group id).
    pub pid: u32,
    /// The slot it runs in (0-based).
    pub slot: usize,
    lines: mpsc::UnboundedSender<Vec<u8>>,
    state: Mutex<State>,
    failed: CancellationToken,
    reason: Mutex<Option<String>>,
    answered: AtomicU64,
}

/// The requests in its hands, by id (a list: the same request may come twice, e.g. a
/// lease lost and the request delivered here again).
struct State {
    alive: bool,
    pending: HashMap<String, Vec<oneshot::Sender<Outcome>>>,
    count: usize,
}

impl Child {
    /// Requests in its hands; `None` once it is going away.
    pub fn load(&self) -> Option<usize> {
        let st = self.state.lock().unwrap();
        st.alive.then_some(st.count)
    }

    /// Hands it the line of request `id`; `Err` gives the line back if it is going away
    /// (pick another).
    pub fn send(&self, id: &str, line: Vec<u8>) -> Result<oneshot::Receiver<Outcome>, Vec<u8>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.state.lock().unwrap();
            if !st.alive {
                return Err(line);
            }
            st.pending.entry(id.to_string()).or_default().push(tx);
            st.count += 1;
        }
        // If the writer is gone, the child is failing: its requests are handed back with
        // the reason, this one included.
        let _ = self.lines.send(line);
        Ok(rx)
    }

    /// Takes it out of service: it is killed and its requests handed back. The first
    /// reason given is the one reported.
    pub fn fail(&self, reason: String) {
        let mut r = self.reason.lock().unwrap();
        if r.is_none() {
            *r = Some(reason);
        }
        self.failed.cancel();
    }

    fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap().clone()
    }

    /// Gives an answer to the request that waits for it.
    fn dispatch(&self, a: Answer, log_prefix: &str) {
        let waiter = {
            let mut st = self.state.lock().unwrap();
            let waiter = match st.pending.get_mut(&a.id) {
                Some(list) if !list.is_empty() => Some(list.remove(0)),
                _ => None,
            };
            if waiter.is_some() {
                st.count -= 1;
                if st.pending.get(&a.id).is_some_and(Vec::is_empty) {
                    st.pending.remove(&a.id);
                }
            }
            waiter
        };
        match waiter {
            Some(tx) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send(a.outcome);
            }
            None => eprintln!(
                "{log_prefix}: child {} answered request {:?}, which it does not hold \
                 (answered twice?); the answer is ignored",
                self.pid, a.id
            ),
        }
    }

    /// Out of service: every request in its hands is handed back with `reason`.
    fn drain(&self, reason: &str) -> usize {
        let pending = {
            let mut st = self.state.lock().unwrap();
            st.alive = false;
            st.count = 0;
            std::mem::take(&mut st.pending)
        };
        let mut n = 0;
        for (_, list) in pending {
            for tx in list {
                n += 1;
                let _ = tx.send(Err(HandlerError::retry(reason.to_string())));
            }
        }
        n
    }
}

/// How one run of a child ended.
enum End {
    /// The pool is stopping.
    Stopped,
    /// It failed (the reason says how); `ready`: it had said hello.
    Failed { reason: String, ready: bool },
}

/// Runs slot `slot` until the pool stops: starts the child, restarts it after every
/// failure with capped exponential backoff. `first` hears how the first start went.
pub async fn supervise(
    shared: Arc<Shared>,
    slot: usize,
    mut first: Option<oneshot::Sender<Result<(), String>>>,
) {
    let prefix = shared.settings.log_prefix;
    let mut backoff = BACKOFF_START;
    loop {
        let (end, answered) = run_once(&shared, slot, &mut first).await;
        let reason = match end {
            End::Stopped => return,
            End::Failed { reason, ready } => {
                if let Some(tx) = first.take() {
                    let _ = tx.send(Err(reason));
                    // The pool will not start: stop here.
                    return;
                }
                if !ready {
                    format!("{reason} (before its hello)")
                } else {
                    reason
                }
            }
        };
        if answered > 0 {
            backoff = BACKOFF_START;
        }
        eprintln!(
            "{prefix}: {reason}; restarting it in {} ms",
            backoff.as_millis()
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shared.stop.cancelled() => return,
        }
        if answered == 0 {
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

/// One child, from its start to its end. Returns how it ended and how many requests it
/// answered.
async fn run_once(
    shared: &Arc<Shared>,
    slot: usize,
    first: &mut Option<oneshot::Sender<Result<(), String>>>,
) -> (End, u64) {
    let s = &shared.settings;
    let failed = |reason: String| {
        (
            End::Failed {
                reason,
                ready: false,
            },
            0,
        )
    };
    let mut cmd = std::process::Command::new(&shared.argv[0]);
    cmd.args(&shared.argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::process::detach(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut proc = match cmd.spawn() {
        Ok(p) => p,
        Err(e) => {
            return failed(format!(
                "child {slot}: cannot start {:?}: {e}",
                shared.argv[0]
            ))
        }
    };
    let pid = proc.id().unwrap_or(0);
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (proc.stdin.take(), proc.stdout.take(), proc.stderr.take())
    else {
        unreachable!("the three are piped");
    };
    tokio::spawn(forward_stderr(stderr, s.log_prefix, pid));
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = exit_tx.send(proc.wait().await);
    });
    let mut exit = Exit {
        rx: Some(exit_rx),
        status: None,
    };
    let mut stdout = BufReader::with_capacity(64 << 10, stdout);
    let who = format!("child {slot} (pid {pid})");
    // The line limit: the largest body, base64-encoded, with room for the rest.
    let max_line = s.max_body_bytes / 3 * 4 + (64 << 10);
    let mut buf = Vec::with_capacity(4096);

    // The hellos: ours first, then the child's, within the start timeout. `None`: the
    // child closed a pipe (most likely it exited: its exit status says how).
    let hello = line::hello(s.kind, s.concurrency, slot);
    let greeted = tokio::time::timeout(shared.start_timeout, async {
        if stdin.write_all(&hello).await.is_err() {
            return Err(None);
        }
        loop {
            match read_line(&mut stdout, &mut buf, max_line, false).await {
                Ok(Read::Line) if buf.trim_ascii().is_empty() => continue,
                Ok(Read::Line) => {
                    return line::check_hello(&buf).map_err(|e| Some(format!("{who}: {e}")))
                }
                Ok(Read::TooLong) => {
                    return Err(Some(format!(
                        "{who}: its first line is over {max_line} bytes"
                    )))
                }
                Ok(Read::Eof) | Err(_) => return Err(None),
            }
        }
    });
    let greeted = tokio::select! {
        g = greeted => g.unwrap_or_else(|_| Err(Some(format!(
            "{who} did not write its hello {{\"pelican\": {}}} within --start-timeout ({} ms)",
            line::VERSION,
            shared.start_timeout.as_millis()
        )))),
        _ = shared.stop.cancelled() => {
            kill_group(pid, &mut exit).await;
            return (End::Stopped, 0);
        }
    };
    if let Err(reason) = greeted {
        let reason = match reason {
            Some(r) => r,
            None => match tokio::time::timeout(KILL_GRACE, exit.wait()).await {
                Ok(Some(st)) => format!("{who} {}", exit_text(st)),
                _ => format!("{who} closed its stdin or stdout"),
            },
        };
        kill_group(pid, &mut exit).await;
        return failed(reason);
    }

    let (lines_tx, lines_rx) = mpsc::unbounded_channel();
    let child = Arc::new(Child {
        pid,
        slot,
        lines: lines_tx,
        state: Mutex::new(State {
            alive: true,
            pending: HashMap::new(),
            count: 0,
        }),
        failed: CancellationToken::new(),
        reason: Mutex::new(None),
        answered: AtomicU64::new(0),
    });
    tokio::spawn(write_lines(stdin, lines_rx, child.clone(), who.clone()));
    *shared.slots[slot].lock().unwrap() = Some(child.clone());
    shared.ready.notify_waiters();
    if let Some(tx) = first.take() {
        let _ = tx.send(Ok(()));
    }

    let end = loop {
        tokio::select! {
            r = read_line(&mut stdout, &mut buf, max_line, false) => match r {
                Ok(Read::Line) if buf.trim_ascii().is_empty() => {}
                Ok(Read::Line) => match line::answer(&buf, s.kind) {
                    Ok(a) => child.dispatch(a, s.log_prefix),
                    Err(e) => child.fail(format!("{who} wrote {e}; answers only on stdout, logs on stderr")),
                },
                Ok(Read::TooLong) => child.fail(format!("{who} wrote a line over {max_line} bytes")),
                Ok(Read::Eof) | Err(_) => {
                    let st = tokio::time::timeout(DRAIN_AFTER_EXIT, exit.wait()).await;
                    break match st {
                        Ok(Some(st)) => format!("{who} {}", exit_text(st)),
                        _ => format!("{who} closed its stdout"),
                    };
                }
            },
            st = exit.wait() => {
                // Answers written just before the exit are still in the pipe: read them.
                let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, async {
                    while let Ok(Read::Line) = read_line(&mut stdout, &mut buf, max_line, false).await {
                        if let Ok(a) = line::answer(&buf, s.kind) {
                            child.dispatch(a, s.log_prefix);
                        }
                    }
                }).await;
                break match st {
                    Some(st) => format!("{who} {}", exit_text(st)),
                    None => format!("{who} is gone"),
                };
            }
            _ = child.failed.cancelled() => break child.reason().unwrap_or_default(),
            _ = shared.stop.cancelled() => {
                shared.slots[slot].lock().unwrap().take();
                // Its stdin closes with the writer (EOF: a polite child exits by itself).
                child.failed.cancel();
                kill_group(pid, &mut exit).await;
                child.drain("the worker is stopping");
                return (End::Stopped, child.answered.load(Ordering::Relaxed));
            }
        }
    };
    shared.slots[slot].lock().unwrap().take();
    child.failed.cancel();
    let handed_back = child.drain(&end);
    kill_group(pid, &mut exit).await;
    let reason = if handed_back > 0 {
        format!("{end}; {handed_back} request(s) in its hands handed back")
    } else {
        end
    };
    (
        End::Failed {
            reason,
            ready: true,
        },
        child.answered.load(Ordering::Relaxed),
    )
}

/// Feeds the child its request lines; a write that fails takes it out of service.
async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    child: Arc<Child>,
    who: String,
) {
    loop {
        let line = tokio::select! {
            l = rx.recv() => match l {
                Some(l) => l,
                None => return,
            },
            // Dropping stdin closes it: the child reads EOF.
            _ = child.failed.cancelled() => return,
        };
        if let Err(e) = stdin.write_all(&line).await {
            child.fail(format!("{who} does not read its stdin any more ({e})"));
            return;
        }
    }
}

/// Forwards the child's stderr line by line, prefixed with its pid.
async fn forward_stderr(stderr: tokio::process::ChildStderr, prefix: &'static str, pid: u32) {
    let mut r = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut r, &mut buf, MAX_LOG_LINE, true).await {
            Ok(Read::Line) => log(prefix, pid, &buf, ""),
            Ok(Read::TooLong) => log(prefix, pid, &buf, "..."),
            Ok(Read::Eof) | Err(_) => return,
        }
    }
}

/// The child's exit, awaited by a task of its own (so that reading its output and
/// waiting for its end can go on side by side).
struct Exit {
    rx: Option<oneshot::Receiver<io::Result<ExitStatus>>>,
    status: Option<ExitStatus>,
}

impl Exit {
    /// Waits for the exit (cancel-safe); `None` if it could not be waited for.
    async fn wait(&mut self) -> Option<ExitStatus> {
        if let Some(rx) = &mut self.rx {
            let r = rx.await;
            self.rx = None;
            self.status = r.ok().and_then(Result::ok);
        }
        self.status
    }

    fn is_done(&self) -> bool {
        self.rx.is_none()
    }
}

/// One line of a child's stderr on ours, whole. An error (our stderr closed) is ignored:
/// the child's output must keep flowing, or it would block on a full pipe.
fn log(prefix: &str, pid: u32, line: &[u8], more: &str) {
    use std::io::Write;
    let text = format!(
        "{prefix}: [pid {pid}] {}{more}\n",
        String::from_utf8_lossy(line)
    );
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// SIGTERM to the child's process group, SIGKILL after [`KILL_GRACE`] if the child has
/// not exited; then SIGKILL to what is left of its group (processes it started) while
/// the child is not yet reaped or only just, so the group id cannot have been reused.
async fn kill_group(pid: u32, exit: &mut Exit) {
    let Ok(group) = libc::pid_t::try_from(pid) else {
        return;
    };
    let signal_group = |sig| {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(-group, sig) }
    };
    if !exit.is_done() {
        signal_group(libc::SIGTERM);
        if tokio::time::timeout(KILL_GRACE, exit.wait()).await.is_err() {
            signal_group(libc::SIGKILL);
            exit.wait().await;
        }
    }
    signal_group(libc::SIGKILL);
}

fn exit_text(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(sig)) => format!("was killed by {}", crate::process::signal_name(sig)),
        _ => format!("exited ({st})"),
    }
}
