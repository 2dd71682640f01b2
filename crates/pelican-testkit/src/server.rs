//! A single `redis-server` child process.

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Addr, Reply, RespConn};
use crate::sys::{self, TempDir};
use crate::tls::TlsFiles;

/// How long one start attempt may take until the server answers `PONG`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Start attempts (the first one plus three retries).
const START_ATTEMPTS: usize = 4;
/// Timeout for each readiness probe (connect, write, read).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Name of the Unix socket of a TLS server inside its directory.
const SOCKET_FILE: &str = "redis.sock";
/// Name of the server log file inside its directory.
const LOG_FILE: &str = "redis.log";
/// stdout/stderr of the server go here (config errors are only printed there).
const STDIO_FILE: &str = "stdio.log";

/// Panics with the message used whenever a required binary is missing.
/// The environment variable that names the server binary the tests start instead of
/// `redis-server` on PATH (e.g. a Valkey or another Redis version's `redis-server`).
pub const SERVER_ENV: &str = "PELICAN_TEST_REDIS_SERVER";

/// The server binary: `$PELICAN_TEST_REDIS_SERVER`, or `redis-server` on PATH.
pub fn server_binary() -> String {
    std::env::var(SERVER_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

pub(crate) fn binary_missing(name: &str) -> ! {
    panic!(
        "{name} not found on PATH: install redis (apt-get install redis-server) \
         or put the redis binaries on PATH; pelican-testkit needs real Redis processes \
         and never skips tests"
    )
}

/// Runs `redis-cli -h 127.0.0.1 -p PORT args...` (with `--tls --cacert CA` for a TLS
/// port); returns stdout trimmed, panics with stderr when redis-cli cannot be run or
/// exits unsuccessfully.
pub(crate) fn run_cli(port: u16, tls: Option<&TlsFiles>, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(cli_tls_args(tls))
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == io::ErrorKind::NotFound => binary_missing("redis-cli"),
        Err(e) => panic!("cannot run redis-cli: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        panic!(
            "`redis-cli -p {port}{} {}` failed ({}):\nstderr: {}\nstdout: {}",
            if tls.is_some() { " --tls" } else { "" },
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            stdout.trim()
        );
    }
    stdout.trim().to_string()
}

/// `--tls --cacert CA` for a TLS server, nothing for a plain one.
pub(crate) fn cli_tls_args(tls: Option<&TlsFiles>) -> Vec<std::ffi::OsString> {
    match tls {
        Some(t) => vec![
            "--tls".into(),
            "--cacert".into(),
            t.ca_cert.clone().into_os_string(),
        ],
        None => Vec::new(),
    }
}

/// Builder for a [`RedisServer`] with non-default settings; see [`RedisServer::builder`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until .start() is called"]
pub struct RedisServerBuilder {
    appendonly: bool,
    args: Vec<String>,
    port: Option<u16>,
    tls: Option<TlsFiles>,
}

impl RedisServerBuilder {
    /// When true, runs with `--appendonly yes --appendfsync always`, so every
    /// acknowledged write survives a SIGKILL ([`RedisServer::kill`]); default false
    /// (`--appendonly no`).
    pub fn appendonly(mut self, on: bool) -> Self {
        self.appendonly = on;
        self
    }

    /// Appends one raw command-line argument, e.g. `.arg("--maxmemory").arg("10mb")`.
    /// Extra arguments come after the defaults, so they override them.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Uses this fixed port instead of a random free one. Start attempts are then
    /// retried on the same port.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Serves clients over TLS only: the port ([`RedisServer::port`]) is a TLS port
    /// (`--tls-port P --port 0`), with `files` as certificate, key and CA, and clients
    /// are not asked for a certificate (`--tls-auth-clients no`; an [`arg`](Self::arg)
    /// can override it). The testkit itself reaches the server through a Unix socket in
    /// its directory (`--unixsocket DIR/redis.sock --unixsocketperm 700`), so there is no
    /// plain-text TCP port at all; [`RedisServer::cli`] goes over TLS.
    ///
    /// The server binary must be built with TLS support (`BUILD_TLS=yes`); without it
    /// [`start`](Self::start) panics and says so.
    pub fn tls(mut self, files: &TlsFiles) -> Self {
        self.tls = Some(files.clone());
        self
    }

    /// Starts the server and waits (10 s per attempt, up to 4 attempts on fresh
    /// ports) until it answers `PING` with `PONG`; panics with the server log tail
    /// when it never becomes ready.
    pub fn start(self) -> RedisServer {
        let mut args = Vec::new();
        if self.appendonly {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        args.extend(self.args);
        let dir = TempDir::new("redis");
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let (port, reserved) = match self.port {
                Some(p) => (p, false),
                None => (sys::pick_server_port(), true),
            };
            match spawn_ready(port, dir.path(), &args, self.tls.as_ref()) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        reserved,
                        pid: child.id(),
                        child: Some(child),
                        args,
                        tls: self.tls,
                        dir,
                    }
                }
                Err(why) => {
                    if reserved {
                        sys::release_server_port(port);
                    }
                    failures.push(format!("attempt {attempt} on port {port}: {why}"));
                }
            }
        }
        panic!(
            "redis-server did not become ready after {START_ATTEMPTS} attempts:\n{}\n{}{}",
            failures.join("\n"),
            log_tails(dir.path()),
            tls_hint(self.tls.as_ref())
        );
    }
}

/// A redis-server child process on a free loopback port, SIGKILLed on Drop, its data
/// dir removed.
///
/// Started as `redis-server --port P --bind 127.0.0.1 --dir DIR --save "" --appendonly
/// no --daemonize no --logfile DIR/redis.log` plus any builder arguments. `P` is a
/// random free port in 20000..=55000 for which `P + 10000` (the cluster bus) is free
/// too. A TLS server ([`RedisServerBuilder::tls`]) gets `--port 0 --tls-port P` and a
/// Unix socket in its directory instead.
pub struct RedisServer {
    port: u16,
    /// Whether `port` came from the process-wide reservation table.
    reserved: bool,
    pid: u32,
    child: Option<Child>,
    /// Arguments after the fixed ones (persistence settings and builder args).
    args: Vec<String>,
    /// Set for a TLS-only server ([`RedisServerBuilder::tls`]).
    tls: Option<TlsFiles>,
    dir: TempDir,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("dir", &self.dir.path())
            .field("args", &self.args)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl RedisServer {
    /// Starts a server with the defaults (`--save "" --appendonly no`, loopback, free
    /// port) and waits until it answers `PONG`.
    pub fn start() -> RedisServer {
        RedisServer::builder().start()
    }

    /// A builder for non-default settings (append-only file, extra arguments, fixed port).
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port on 127.0.0.1 (stays the same across [`restart`](Self::restart)); a
    /// TLS port for a server started with [`RedisServerBuilder::tls`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"redis://127.0.0.1:PORT"`, or `"rediss://127.0.0.1:PORT"` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The certificate files of a TLS server ([`RedisServerBuilder::tls`]), `None` for a
    /// plain one.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Where the testkit's own probes connect: the TCP port, or a TLS server's Unix socket.
    pub(crate) fn probe_addr(&self) -> Addr {
        probe_addr(self.port, self.dir.path(), self.tls.as_ref())
    }

    /// A `redis::Client` for [`url`](Self::url). For a TLS server it needs the `redis`
    /// crate's TLS support and must trust the CA, which this client does not: use
    /// [`cli`](Self::cli) there.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("pelican-testkit: invalid redis url")
    }

    /// A blocking connection (connect timeout 5 s); panics when the server does not
    /// accept it.
    pub fn sync_connection(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to redis-server on port {}: {e}", self.port))
    }

    /// The process id of the current (or, after [`kill`](Self::kill), the last)
    /// redis-server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is running, i.e. it was not [`kill`](Self::kill)ed.
    /// (A server that crashed by itself is only noticed on the next kill/restart.)
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's working directory (`--dir`): the append-only files, `redis.log`
    /// and `stdio.log` (its stdout/stderr) live there. Removed on Drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The path of the server log file (`DIR/redis.log`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// SIGKILLs the process now and reaps it; idempotent. The data dir is kept, so
    /// [`restart`](Self::restart) finds the append-only file.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process (if running), then starts it again on the SAME port with
    /// the same dir and arguments, and waits until it answers `PONG` (i.e. after
    /// any append-only file has been loaded). Panics with the log tail on failure.
    pub fn restart(&mut self) {
        self.kill();
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            match spawn_ready(self.port, self.dir.path(), &self.args, self.tls.as_ref()) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(why) => failures.push(format!("attempt {attempt}: {why}")),
            }
        }
        panic!(
            "redis-server did not come back on port {} after {START_ATTEMPTS} attempts:\n{}\n{}",
            self.port,
            failures.join("\n"),
            log_tails(self.dir.path())
        );
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT args...` (over TLS, trusting the CA, for a
    /// TLS server) and returns its stdout trimmed (for raw/foreign-client tests). Redis error replies are not failures for
    /// redis-cli: they come back as text (e.g. `"ERR unknown command ..."`). Panics
    /// with stderr when redis-cli fails (e.g. cannot connect).
    pub fn cli(&self, args: &[&str]) -> String {
        run_cli(self.port, self.tls.as_ref(), args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if self.reserved {
            sys::release_server_port(self.port);
        }
        // `self.dir` is removed when the field is dropped, after the process is gone.
    }
}

/// Where the probes of a server on `port` with directory `dir` connect.
fn probe_addr(port: u16, dir: &Path, tls: Option<&TlsFiles>) -> Addr {
    match tls {
        Some(_) => Addr::Unix(dir.join(SOCKET_FILE)),
        None => Addr::Tcp(port),
    }
}

/// The arguments that make a server listen for TLS on `port` (its plain port is 0).
fn tls_args(port: u16, dir: &Path, tls: &TlsFiles) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = Vec::new();
    a.extend(["--tls-port".into(), port.to_string().into()]);
    a.extend([
        "--unixsocket".into(),
        dir.join(SOCKET_FILE).into_os_string(),
    ]);
    a.extend(["--unixsocketperm".into(), "700".into()]);
    a.extend(["--tls-cert-file".into(), tls.cert.clone().into_os_string()]);
    a.extend(["--tls-key-file".into(), tls.key.clone().into_os_string()]);
    a.extend([
        "--tls-ca-cert-file".into(),
        tls.ca_cert.clone().into_os_string(),
    ]);
    a.extend(["--tls-auth-clients".into(), "no".into()]);
    a
}

/// What to add to a failed TLS server's panic message.
fn tls_hint(tls: Option<&TlsFiles>) -> &'static str {
    match tls {
        Some(_) => {
            "\n(a TLS server was asked for: is this redis-server built with TLS support, \
             BUILD_TLS=yes? `redis-server --tls-port 1 --port 0` says \"Bad directive\" if not)"
        }
        None => "",
    }
}

/// Spawns `redis-server` on `port` (a TLS port when `tls` is set) and waits until it is
/// ready. On failure the child is killed and reaped and the reason returned.
fn spawn_ready(
    port: u16,
    dir: &Path,
    extra: &[String],
    tls: Option<&TlsFiles>,
) -> Result<Child, String> {
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(STDIO_FILE))
        .map_err(|e| format!("cannot open {STDIO_FILE}: {e}"))?;
    let stdio2 = stdio
        .try_clone()
        .map_err(|e| format!("cannot clone {STDIO_FILE} handle: {e}"))?;
    let binary = server_binary();
    let mut cmd = Command::new(&binary);
    // A TLS server has no plain-text port.
    let plain_port = if tls.is_some() { 0 } else { port };
    cmd.arg("--port")
        .arg(plain_port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--dir")
        .arg(dir)
        .arg("--save")
        .arg("")
        .arg("--daemonize")
        .arg("no")
        .arg("--logfile")
        .arg(dir.join(LOG_FILE))
        .args(tls.map(|t| tls_args(port, dir, t)).unwrap_or_default())
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stdio2);
    let mut child = match sys::spawn_server_process(cmd) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => binary_missing(&binary),
        Err(e) => return Err(format!("cannot spawn {binary}: {e}")),
    };
    match wait_ready(&mut child, &probe_addr(port, dir, tls)) {
        Ok(()) => Ok(child),
        Err(why) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(why)
        }
    }
}

/// Polls until the server answers `PING` with `PONG` (`-LOADING` and refused
/// connections mean "not yet") and `INFO server` reports our child's pid (so a
/// foreign server that won a race for the port is never mistaken for ours).
fn wait_ready(child: &mut Child, addr: &Addr) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(format!("redis-server exited early ({status})")),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot query the redis-server process: {e}")),
        }
        let last = match probe(addr) {
            Ok(pid) if pid == child.id() => return Ok(()),
            Ok(pid) => {
                return Err(format!(
                    "{addr:?} is served by another redis-server (pid {pid}, ours is {})",
                    child.id()
                ))
            }
            Err(why) => why,
        };
        if start.elapsed() >= READY_TIMEOUT {
            return Err(format!(
                "not ready within {READY_TIMEOUT:?}; last probe: {last}"
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// One readiness probe: `PING` must answer `PONG`; returns the server's pid.
fn probe(addr: &Addr) -> Result<u32, String> {
    let mut conn = RespConn::connect(addr, PROBE_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    match conn.command(&["PING"]).map_err(|e| format!("PING: {e}"))? {
        Reply::Status(s) if s == "PONG" => {}
        other => return Err(format!("PING answered {other:?}")),
    }
    let info = conn
        .command(&["INFO", "server"])
        .map_err(|e| format!("INFO: {e}"))?
        .text()
        .ok_or("INFO server did not return text")?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO server has no process_id".to_string())
}

fn log_tails(dir: &Path) -> String {
    format!(
        "{}\n{}",
        sys::file_tail(&dir.join(LOG_FILE), 30),
        sys::file_tail(&dir.join(STDIO_FILE), 30)
    )
}
