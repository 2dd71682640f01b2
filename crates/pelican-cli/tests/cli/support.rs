//! Running the binary: one-shot commands with a deadline, and background processes
//! whose output is collected while they run and which are killed on Drop.

use pelican_testkit::{unique_name, RedisServer};
use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_pelican");

/// Longest a one-shot command may run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A `pelican` command with a clean environment (no REDIS_URL, PELICAN_QUEUE, RUST_LOG).
pub fn pelican() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("REDIS_URL")
        .env_remove("PELICAN_QUEUE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

/// What a finished command did. `code` is the exit code, or 128 + signal.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Stdout parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// A running `pelican` process; killed on Drop.
pub struct Proc {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

fn collect(mut r: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

impl Proc {
    /// Starts `cmd` with piped output.
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pelican");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Proc {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// What it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits until it exits (panics after `timeout`, killing it).
    pub fn wait(mut self, timeout: Duration) -> Out {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "pelican did not exit within {timeout:?}\nstdout: {}\nstderr: {}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Out {
            code,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: self.stderr.lock().unwrap().clone(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` to its end.
pub fn run(cmd: Command) -> Out {
    Proc::spawn(cmd).wait(RUN_TIMEOUT)
}

/// A redis-server of the test's own and a fresh queue name.
pub struct Env {
    pub server: RedisServer,
    pub queue: String,
}

impl Env {
    /// Starts the server.
    pub fn new(prefix: &str) -> Env {
        Env {
            server: RedisServer::start(),
            queue: unique_name(prefix),
        }
    }

    /// The queue's Redis keys, as the command names them (it uses the default prefix).
    pub fn keys(&self) -> pelican::admin::Keys {
        pelican::QueueConfig::new(self.server.url(), self.queue.clone()).keys()
    }

    /// `pelican --redis URL --queue Q args...`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = pelican();
        cmd.args(["--redis", &self.server.url(), "--queue", &self.queue])
            .args(args);
        cmd
    }

    /// Runs a command to its end.
    pub fn run(&self, args: &[&str]) -> Out {
        run(self.cmd(args))
    }

    /// Starts a command in the background.
    pub fn spawn(&self, args: &[&str]) -> Proc {
        Proc::spawn(self.cmd(args))
    }

    /// `stats --json`, parsed.
    pub fn stats(&self) -> Value {
        let out = self.run(&["--json", "stats"]);
        assert_eq!(out.code, 0, "{out:?}");
        out.json()
    }
}
