//! Handlers in any language: `pelican worker --exec | --http` and `pelican nitro worker
//! --exec | --http` driving real python3 programs: the examples of `examples/`, and this
//! directory's misbehaving child (`child.py`) and endpoint (`endpoint.py`).

mod exec;
mod http;
mod nitro;

use crate::support::*;
use pelican_testkit::eventually_sync;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// `python3`, checked once: these tests cannot run without it.
pub fn python3() -> &'static str {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let ok = Command::new("python3")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "python3 is not on PATH: the --exec and --http tests run Python programs \
             (standard library only); install python3 (e.g. apt-get install python3)"
        );
    });
    "python3"
}

/// A Python program of `examples/` at the repository's root.
pub fn example(name: &str) -> String {
    format!("{}/../../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A Python program of this directory.
pub fn script(name: &str) -> String {
    format!("{}/tests/cli/external/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The `--exec` value that runs a Python program.
pub fn exec_python(path: &str) -> String {
    format!("{} '{path}'", python3())
}

/// A Python HTTP server of the test's own, its URL read from its first line of output.
pub struct Server {
    pub proc: Proc,
    pub url: String,
}

impl Server {
    /// Starts `path PORT` (0: a free port).
    pub fn start(path: &str, port: u16) -> Server {
        let mut cmd = Command::new(python3());
        cmd.arg(path).arg(port.to_string());
        let proc = Proc::spawn(cmd);
        eventually_sync(Duration::from_secs(20), "the HTTP server's URL", || {
            proc.stdout().contains('\n')
        });
        let url = proc.stdout().lines().next().unwrap().trim().to_string();
        Server { proc, url }
    }

    /// Asserts it got `n` calls for request `rid`, once its log has been read that far
    /// (the log line is written before the answer, but read by the test a moment later).
    pub fn assert_calls(&self, rid: &str, n: usize) {
        let what = format!("{n} call(s) of {rid} in the endpoint's log");
        eventually_sync(Duration::from_secs(10), &what, || self.calls(rid) >= n);
        assert_eq!(self.calls(rid), n, "{rid}: {}", self.proc.stderr());
    }

    /// How many calls it got for request `rid` (its stderr log).
    pub fn calls(&self, rid: &str) -> usize {
        let marker = format!("call {rid} delivery ");
        self.proc
            .stderr()
            .lines()
            .filter(|l| l.starts_with(&marker))
            .count()
    }
}

/// The pids of the `--exec` children a worker's stderr shows (`[pid N]` of their log
/// lines), each once, in order of appearance.
pub fn child_pids(stderr: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for l in stderr.lines() {
        if let Some(rest) = l.split("[pid ").nth(1) {
            if let Some(pid) = rest.split(']').next().and_then(|p| p.parse().ok()) {
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
    }
    pids
}

/// The pid of the child that logged `working on <rid>`.
pub fn pid_working_on(stderr: &str, rid: &str) -> Option<i32> {
    let marker = format!("] working on {rid} delivery");
    stderr
        .lines()
        .find(|l| l.contains(&marker))
        .and_then(|l| child_pids(l).first().copied())
}

/// Whether process `pid` exists.
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The handled lines of a `--verbose` worker (one per handler run).
pub fn handled(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| {
            ["ok ", "failed ", "retry "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect()
}
