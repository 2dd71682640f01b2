//! Is Redis there? Every subcommand asks before it starts, so a missing server gets one
//! clear message. And for the demo: a throwaway `redis-server` on a free loopback port.

use crate::exit::{CliError, CliResult};
use pelican::admin::redacted_url;
use redis::{AsyncConnectionConfig, ConnectionAddr};
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the reachability probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a throwaway server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a probe failed.
#[derive(Debug)]
pub enum Unreachable {
    /// Nothing listens there (refused, no route, timed out).
    Down(String),
    /// Something answered but refused us (authentication, protocol).
    Refused(String),
}

/// Connects to `url` and sends PING. The URL must have been validated.
pub async fn probe(url: &str) -> Result<(), Unreachable> {
    let client = redis::Client::open(url).map_err(|e| Unreachable::Refused(e.to_string()))?;
    let cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PROBE_TIMEOUT))
        .set_response_timeout(Some(PROBE_TIMEOUT));
    let attempt = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(PROBE_TIMEOUT * 2, attempt).await {
        Err(_) => Err(Unreachable::Down("no answer within 6 s".into())),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.is_connection_refusal() || e.is_timeout() || e.is_io_error() => {
            Err(Unreachable::Down(short_cause(&e)))
        }
        Ok(Err(e)) => Err(Unreachable::Refused(e.to_string())),
    }
}

fn short_cause(e: &redis::RedisError) -> String {
    if e.is_connection_refusal() {
        "connection refused".into()
    } else if e.is_timeout() {
        "timed out".into()
    } else {
        e.to_string()
    }
}

/// The port of a TCP URL, for advice.
fn port_of(url: &str) -> Option<u16> {
    let client = redis::Client::open(url).ok()?;
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(_, port) => Some(*port),
        _ => None,
    }
}

/// The error for a Redis that did not answer, with what to do about it.
pub fn unreachable_error(url: &str, why: &Unreachable) -> CliError {
    let shown = redacted_url(url);
    match why {
        Unreachable::Down(cause) => {
            let start = match port_of(url) {
                Some(p) => format!("`redis-server --port {p}`"),
                None => "`redis-server`".to_string(),
            };
            CliError::failure(format!(
                "cannot reach Redis at {shown}: {cause}. Start one with {start} or pass \
                 --redis URL (or set REDIS_URL)"
            ))
        }
        Unreachable::Refused(cause) => CliError::failure(format!(
            "Redis at {shown} did not accept the connection: {cause}. If it needs a password, \
             put it in the URL: redis://user:password@host:port"
        )),
    }
}

/// Fails with a clear message unless Redis answers PING at `url`.
pub async fn require(url: &str) -> CliResult {
    probe(url).await.map_err(|why| unreachable_error(url, &why))
}

/// Where `redis-server` is, if it is on PATH.
pub fn find_redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The advice when there is no Redis and no redis-server to start.
pub fn how_to_get_redis(url: &str, why: &Unreachable) -> CliError {
    let cause = match why {
        Unreachable::Down(c) | Unreachable::Refused(c) => c,
    };
    CliError::failure(format!(
        "cannot reach Redis at {} ({cause}), and redis-server is not on PATH, so the demo \
         cannot start a throwaway one. Install Redis 7.0 or newer (Debian/Ubuntu: \
         `sudo apt-get install redis-server`; macOS: `brew install redis`) or run one with \
         `docker run -p 6379:6379 redis:7`, then run `pelican demo` again (or pass --redis URL)",
        redacted_url(url)
    ))
}

/// A `redis-server` child on a free loopback port, without persistence, in a temporary
/// directory. Killed (and its directory removed) on Drop; on Linux it also dies with this
/// process if that is killed.
pub struct LocalRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl LocalRedis {
    /// Starts one and waits until it answers PING.
    pub async fn start(binary: &Path) -> CliResult<LocalRedis> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port()
                .map_err(|e| CliError::failure(format!("cannot find a free port: {e}")))?;
            match LocalRedis::spawn(binary, port).await {
                Ok(r) => return Ok(r),
                Err(why) => last = why,
            }
        }
        Err(CliError::failure(format!(
            "could not start a throwaway redis-server ({}): {last}. Start Redis yourself and \
             pass --redis URL",
            binary.display()
        )))
    }

    async fn spawn(binary: &Path, port: u16) -> Result<LocalRedis, String> {
        let dir =
            std::env::temp_dir().join(format!("pelican-redis-{}-{}", std::process::id(), port));
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let out = fs::File::create(dir.join("stdio.log")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(binary);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--dir"])
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        crate::process::detach(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        let mut server = LocalRedis { child, port, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("it exited ({status}): {}", server.log_tail()));
            }
            if probe(&server.url()).await.is_ok() {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "it did not answer PING within {START_TIMEOUT:?}: {}",
                    server.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        for f in ["stdio.log", "redis.log"] {
            if let Ok(t) = fs::read_to_string(self.dir.join(f)) {
                text.push_str(&t);
            }
        }
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A port that is free on 127.0.0.1 now, below the kernel's ephemeral range (so an
/// outgoing connection does not take it before the server binds it).
///
/// The command's only port picker, and deliberately not shared with the tests':
/// `pelican-testkit` (whose `free_port` every test uses) is a test-only crate the binary
/// cannot depend on, and a port picker is no business of the library's public API. This
/// one runs once per demo and retries with another port if the server cannot bind.
fn free_port() -> io::Result<u16> {
    let (lo, hi) = (20_000u16, 32_000u16);
    let seed = std::process::id() as u64 ^ now_nanos();
    let mut x = seed | 1;
    for _ in 0..200 {
        // xorshift: good enough to spread tries over the range
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = lo + (x % u64::from(hi - lo)) as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    // fall back to whatever the kernel picks
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_names_the_port() {
        let e = unreachable_error(
            "redis://127.0.0.1:6399",
            &Unreachable::Down("connection refused".into()),
        );
        assert!(e.message.contains("redis-server --port 6399"), "{e}");
        assert!(e.message.contains("--redis URL"), "{e}");
    }
}
