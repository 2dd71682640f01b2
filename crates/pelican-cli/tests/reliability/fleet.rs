//! `pelican worker` processes: started with `--verbose --json` so every handler run is
//! reported on stdout, watched (their stderr's warnings, lease losses, panics), SIGKILLed
//! or stopped gracefully, and SIGKILLed on Drop (also on panic; and by the kernel if this
//! process dies: PR_SET_PDEATHSIG).

#![allow(dead_code)]

use crate::common::{Rng, BIN};
use serde_json::Value as Json;
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How to start `pelican worker`.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub url: String,
    pub queue: String,
    pub handler: String,
    pub concurrency: u32,
    pub claim_idle_ms: u64,
    pub max_deliveries: u32,
    /// Extra environment (e.g. `PELICAN_TLS_CA`).
    pub env: Vec<(String, String)>,
    /// Count handler runs per request id (`HandledLog::by_rid`). Off where memory is
    /// measured: a million ids would be the test's own growth.
    pub per_rid: bool,
}

impl WorkerSpec {
    pub fn new(url: &str, queue: &str) -> WorkerSpec {
        WorkerSpec {
            url: url.to_string(),
            queue: queue.to_string(),
            handler: "echo".into(),
            concurrency: 16,
            claim_idle_ms: 1000,
            max_deliveries: 5,
            env: Vec::new(),
            per_rid: true,
        }
    }

    pub fn handler(mut self, h: &str) -> Self {
        self.handler = h.to_string();
        self
    }

    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    pub fn claim_idle(mut self, ms: u64) -> Self {
        self.claim_idle_ms = ms;
        self
    }

    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    pub fn without_per_rid_log(mut self) -> Self {
        self.per_rid = false;
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_remove("REDIS_URL")
            .env_remove("PELICAN_QUEUE")
            .env_remove("RUST_LOG")
            .env_remove("PELICAN_TLS_CA")
            .env_remove("PELICAN_LEAN_CONNECTIONS")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["--redis", &self.url, "--queue", &self.queue, "--json"])
            .args(["worker", "--verbose", "--handler", &self.handler])
            .args(["--concurrency", &self.concurrency.to_string()])
            .args(["--claim-idle", &self.claim_idle_ms.to_string()])
            .args(["--max-deliveries", &self.max_deliveries.to_string()])
            .args(["--shutdown-timeout", "5000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent. The
        // worker gets SIGKILL if this test process dies, so nothing outlives a crash.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

/// What the handlers of all workers of a fleet reported (`--verbose --json` lines).
#[derive(Default)]
pub struct HandledLog {
    /// Handler runs that finished (one line each).
    pub runs: u64,
    /// Runs of a delivery after the first (the request was taken over or retried).
    pub redelivered: u64,
    /// Highest delivery count seen.
    pub max_delivery: u64,
    /// Handler runs per request id (unless the spec turned it off).
    pub by_rid: HashMap<u128, u16>,
    per_rid: bool,
}

impl HandledLog {
    /// Requests whose handler ran more than once, and the extra runs.
    pub fn rerun(&self) -> (u64, u64) {
        let mut reqs = 0;
        let mut extra = 0;
        for n in self.by_rid.values() {
            if *n > 1 {
                reqs += 1;
                extra += u64::from(*n - 1);
            }
        }
        (reqs, extra)
    }

    /// Handler runs of one request.
    pub fn runs_of(&self, rid: &str) -> u16 {
        self.by_rid.get(&rid_key(rid)).copied().unwrap_or(0)
    }
}

/// A request id as a map key: dedup ids are 128-bit hex; anything else is hashed.
pub fn rid_key(rid: &str) -> u128 {
    if rid.len() == 32 {
        if let Ok(v) = u128::from_str_radix(rid, 16) {
            return v;
        }
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rid.hash(&mut h);
    u128::from(h.finish()) | (1u128 << 127)
}

/// Lines of a worker's stderr kept for messages.
const STDERR_TAIL: usize = 40;

/// What one worker wrote on stderr.
#[derive(Default)]
pub struct StderrLog {
    pub tail: VecDeque<String>,
    pub warnings: u64,
    pub lines: u64,
    /// Lines that say a live consumer lost a lease.
    pub leases_lost: u64,
    pub panics: u64,
}

/// One `pelican worker` process; SIGKILLed on Drop.
pub struct WorkerProc {
    pub pid: u32,
    child: Child,
    consumer: Arc<Mutex<Option<String>>>,
    stderr: Arc<Mutex<StderrLog>>,
    readers: Vec<JoinHandle<()>>,
    exited: Option<ExitStatus>,
}

impl WorkerProc {
    pub fn spawn(spec: &WorkerSpec, log: &Arc<Mutex<HandledLog>>) -> WorkerProc {
        let mut child = spec
            .command()
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        let pid = child.id();
        let consumer = Arc::new(Mutex::new(None));
        let stderr = Arc::new(Mutex::new(StderrLog::default()));
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let readers = vec![
            {
                let (consumer, log) = (consumer.clone(), log.clone());
                std::thread::spawn(move || read_stdout(out, &consumer, &log))
            },
            {
                let stderr = stderr.clone();
                std::thread::spawn(move || read_stderr(err, &stderr))
            },
        ];
        WorkerProc {
            pid,
            child,
            consumer,
            stderr,
            readers,
            exited: None,
        }
    }

    /// Its consumer name, once it said it is ready.
    pub fn consumer(&self) -> Option<String> {
        self.consumer.lock().unwrap().clone()
    }

    /// Waits until it is ready; panics with its stderr if it is not within `limit`.
    pub async fn wait_ready(&mut self, limit: Duration) {
        let start = Instant::now();
        while self.consumer().is_none() {
            if let Some(st) = self.exit_status() {
                panic!(
                    "worker {} exited before it was ready ({st}):\n{}",
                    self.pid,
                    self.stderr_tail()
                );
            }
            if start.elapsed() > limit {
                panic!(
                    "worker {} not ready within {limit:?}:\n{}",
                    self.pid,
                    self.stderr_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether it has exited (reaps it).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait");
        }
        self.exited
    }

    pub fn is_alive(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// SIGKILL now, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
    }

    /// SIGTERM, then waits for a graceful exit; panics if it does not come in `limit`.
    pub async fn terminate(&mut self, limit: Duration) -> ExitStatus {
        if let Some(st) = self.exit_status() {
            return st;
        }
        signal(self.pid, libc::SIGTERM);
        self.wait_exit(limit).await
    }

    /// Waits for it to exit (after a signal sent elsewhere); SIGKILLs it and panics
    /// after `limit`. A second SIGTERM would make it exit at once, not gracefully.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.exit_status() {
                self.join_readers();
                return st;
            }
            if start.elapsed() > limit {
                self.kill();
                panic!(
                    "worker {} did not exit within {limit:?}:\n{}",
                    self.pid,
                    self.stderr_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    pub fn stderr_tail(&self) -> String {
        let s = self.stderr.lock().unwrap();
        s.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub fn warnings(&self) -> u64 {
        self.stderr.lock().unwrap().warnings
    }

    pub fn leases_lost(&self) -> u64 {
        self.stderr.lock().unwrap().leases_lost
    }

    pub fn panics(&self) -> u64 {
        self.stderr.lock().unwrap().panics
    }

    /// Resident set size in KiB (0 once it is gone).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid)
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.kill();
        }
    }
}

fn read_stdout(
    out: std::process::ChildStdout,
    consumer: &Mutex<Option<String>>,
    log: &Mutex<HandledLog>,
) {
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let Ok(v) = serde_json::from_str::<Json>(&line) else {
            continue;
        };
        match v["event"].as_str() {
            Some("ready") => {
                *consumer.lock().unwrap() = v["consumer"].as_str().map(String::from);
            }
            Some("handled") => {
                let delivery = v["delivery"].as_u64().unwrap_or(0);
                let rid = v["rid"].as_str().unwrap_or("");
                let mut log = log.lock().unwrap();
                log.runs += 1;
                if delivery > 1 {
                    log.redelivered += 1;
                }
                log.max_delivery = log.max_delivery.max(delivery);
                if log.per_rid {
                    *log.by_rid.entry(rid_key(rid)).or_default() += 1;
                }
            }
            _ => {}
        }
    }
}

fn read_stderr(err: std::process::ChildStderr, into: &Mutex<StderrLog>) {
    for line in BufReader::new(err).lines() {
        let Ok(line) = line else { break };
        let mut s = into.lock().unwrap();
        s.lines += 1;
        if line.contains("WARN") {
            s.warnings += 1;
        }
        if line.contains("lease lost") {
            s.leases_lost += 1;
        }
        if line.contains("panicked") {
            s.panics += 1;
        }
        if s.tail.len() == STDERR_TAIL {
            s.tail.pop_front();
        }
        s.tail.push_back(line);
    }
}

/// Sends `sig` to `pid`; false if it is gone.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// Resident set size of a process in KiB, from /proc (0 when it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Worker processes serving one queue, replaced when they are killed or crash.
pub struct Fleet {
    pub spec: WorkerSpec,
    pub workers: Vec<WorkerProc>,
    pub log: Arc<Mutex<HandledLog>>,
    /// Workers this fleet SIGKILLed.
    pub kills: u64,
    /// Workers that died by themselves (crash-if) and were replaced.
    pub crashes: u64,
    /// Workers started in all.
    pub started: u64,
    /// Warnings and lease losses of workers that are gone, carried over.
    gone_warnings: u64,
    gone_leases_lost: u64,
    gone_panics: u64,
}

/// How long a worker may take to connect and say it is ready.
pub const READY_LIMIT: Duration = Duration::from_secs(20);

impl Fleet {
    /// Starts `n` workers and waits until every one is ready.
    pub async fn start(spec: WorkerSpec, n: usize) -> Fleet {
        let per_rid = spec.per_rid;
        let mut f = Fleet {
            spec,
            workers: Vec::new(),
            log: Arc::new(Mutex::new(HandledLog {
                per_rid,
                ..HandledLog::default()
            })),
            kills: 0,
            crashes: 0,
            started: 0,
            gone_warnings: 0,
            gone_leases_lost: 0,
            gone_panics: 0,
        };
        for _ in 0..n {
            f.spawn();
        }
        for w in &mut f.workers {
            w.wait_ready(READY_LIMIT).await;
        }
        f
    }

    fn spawn(&mut self) {
        self.workers.push(WorkerProc::spawn(&self.spec, &self.log));
        self.started += 1;
    }

    fn retire(&mut self, idx: usize) {
        let w = self.workers.remove(idx);
        self.gone_warnings += w.warnings();
        self.gone_leases_lost += w.leases_lost();
        self.gone_panics += w.panics();
    }

    /// SIGKILLs one random live worker and starts a replacement at once.
    pub fn kill_one(&mut self, rng: &mut Rng) -> u32 {
        let live: Vec<usize> = (0..self.workers.len())
            .filter(|i| self.workers[*i].is_alive())
            .collect();
        assert!(!live.is_empty(), "no live worker to kill");
        let idx = live[rng.range(0, live.len() as u64) as usize];
        let pid = self.workers[idx].pid;
        self.workers[idx].kill();
        self.retire(idx);
        self.kills += 1;
        self.spawn();
        pid
    }

    /// Replaces workers that died by themselves; returns how many.
    pub fn replace_crashed(&mut self) -> u64 {
        let mut n = 0;
        let mut i = 0;
        while i < self.workers.len() {
            if self.workers[i].is_alive() {
                i += 1;
            } else {
                self.retire(i);
                n += 1;
            }
        }
        for _ in 0..n {
            self.spawn();
        }
        self.crashes += n;
        n
    }

    /// Whether every worker is alive.
    pub fn all_alive(&mut self) -> bool {
        self.workers.iter_mut().all(|w| w.is_alive())
    }

    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// Total warnings on the workers' stderr, gone ones included.
    pub fn warnings(&self) -> u64 {
        self.gone_warnings + self.workers.iter().map(|w| w.warnings()).sum::<u64>()
    }

    /// Lease losses reported by the workers, gone ones included.
    pub fn leases_lost(&self) -> u64 {
        self.gone_leases_lost + self.workers.iter().map(|w| w.leases_lost()).sum::<u64>()
    }

    pub fn panics(&self) -> u64 {
        self.gone_panics + self.workers.iter().map(|w| w.panics()).sum::<u64>()
    }

    /// Every live worker's stderr tail, for failure messages.
    pub fn stderr_tails(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("--- worker {}:\n{}", w.pid, w.stderr_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops every worker gracefully (SIGTERM; they finish or release their work and
    /// leave the group); panics if one does not exit cleanly.
    pub async fn stop(&mut self) {
        for w in &self.workers {
            signal(w.pid, libc::SIGTERM);
        }
        for w in &mut self.workers {
            let st = w.wait_exit(Duration::from_secs(20)).await;
            assert!(
                st.success(),
                "worker {} exited with {st}:\n{}",
                w.pid,
                w.stderr_tail()
            );
        }
    }

    pub fn rss_kib(&self) -> Vec<u64> {
        self.workers.iter().map(|w| w.rss_kib()).collect()
    }
}
