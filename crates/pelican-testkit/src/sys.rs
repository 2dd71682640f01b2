//! Process, port and temporary-directory plumbing shared by the server types.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};

/// Locks a mutex, ignoring poisoning: a panicking test must not break the
/// cleanup done by other handles.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh random number, from the OS.
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().expect("the OS's random number generator")
}

/// Lowest and highest port a server may get. The highest is well below
/// 65535 - 10000 because a cluster node also listens on `port + 10000`.
const SERVER_PORT_MIN: u16 = 20000;
const SERVER_PORT_MAX: u16 = 55000;

/// Ports handed out by [`pick_server_port`] and still owned by a live server of
/// this process, so two concurrent tests never race for the same port.
static RESERVED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The kernel's ephemeral port range (outgoing connections get their local ports
/// from it), so that server ports can avoid it: a port in it may be taken by a
/// client socket between our check and the server's `bind`, or while a server is
/// down for a restart.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(|s| s.parse::<u16>());
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
}

/// Picks a random port in 20000..=55000 (preferring ports outside the ephemeral
/// range) on which both `port` and `port + 10000` (the cluster bus) can be bound
/// on 127.0.0.1, and reserves it until [`release_server_port`] (for good when that is
/// never called: a port handed out by `free_port`).
pub(crate) fn pick_server_port() -> u16 {
    let (lo, hi) = match ephemeral_range() {
        // Typical Linux: ephemeral 32768..=60999 -> servers get 20000..=32767.
        Some((elo, _)) if elo > SERVER_PORT_MIN + 1000 => {
            (SERVER_PORT_MIN, SERVER_PORT_MAX.min(elo - 1))
        }
        Some((_, ehi)) if ehi < SERVER_PORT_MAX - 1000 => {
            (SERVER_PORT_MIN.max(ehi + 1), SERVER_PORT_MAX)
        }
        _ => (SERVER_PORT_MIN, SERVER_PORT_MAX),
    };
    let span = u64::from(hi - lo) + 1;
    for _ in 0..1000 {
        let port = lo + (random_u64() % span) as u16;
        let mut reserved = lock(&RESERVED_PORTS);
        let reserved = reserved.get_or_insert_with(HashSet::new);
        if reserved.contains(&port) || !bindable(port) || !bindable(port + 10000) {
            continue;
        }
        reserved.insert(port);
        return port;
    }
    panic!("pelican-testkit: found no free port pair (P, P+10000) on 127.0.0.1 in {lo}..={hi}");
}

/// Gives a port obtained from [`pick_server_port`] back.
pub(crate) fn release_server_port(port: u16) {
    if let Some(set) = lock(&RESERVED_PORTS).as_mut() {
        set.remove(&port);
    }
}

/// A directory under `std::env::temp_dir()` with a unique name, removed
/// recursively on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn new(prefix: &str) -> TempDir {
        let base = std::env::temp_dir();
        let mut last_err = None;
        for _ in 0..100 {
            let path = base.join(format!(
                "pelican-testkit-{prefix}-{}-{:016x}",
                std::process::id(),
                random_u64()
            ));
            match fs::create_dir(&path) {
                Ok(()) => {
                    // Absolute, so a server's --dir and --logfile do not depend on the cwd.
                    let path = path.canonicalize().unwrap_or(path);
                    return TempDir { path };
                }
                Err(e) => last_err = Some(e),
            }
        }
        panic!(
            "pelican-testkit: cannot create a temporary directory under {}: {:?}",
            base.display(),
            last_err
        );
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns a long-running child (a server) from a dedicated thread that lives as
/// long as the process.
///
/// On Linux the child gets `PR_SET_PDEATHSIG = SIGKILL`. The kernel sends that
/// signal when the *thread* that forked the child exits, not the process; spawning
/// from one immortal thread makes it mean "when the test process dies" (a test's
/// own thread, or a tokio blocking thread, may end while the server is still in use).
pub(crate) fn spawn_server_process(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("pelican-testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    die_with_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("pelican-testkit: cannot start the process spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.send((cmd, reply_tx))
        .expect("pelican-testkit: the process spawner thread is gone");
    reply_rx
        .recv()
        .expect("pelican-testkit: the process spawner thread is gone")
}

#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::raw::{c_int, c_ulong};
    use std::os::unix::process::CommandExt;

    extern "C" {
        fn prctl(option: c_int, ...) -> c_int;
    }
    const PR_SET_PDEATHSIG: c_int = 1;
    const SIGKILL: c_ulong = 9;

    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl(2), which is async-signal-safe; it does not allocate or take locks.
    unsafe {
        cmd.pre_exec(|| {
            if prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

/// The last `lines` lines of a file, or a note that it could not be read.
pub(crate) fn file_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            if all.is_empty() {
                format!("--- {} (empty) ---", path.display())
            } else {
                format!(
                    "--- tail of {} ---\n{}",
                    path.display(),
                    all[start..].join("\n")
                )
            }
        }
        Err(e) => format!("--- {} unreadable: {e} ---", path.display()),
    }
}
