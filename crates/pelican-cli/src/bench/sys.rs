//! What the processes cost, from /proc (Linux), measured the way the BullMQ peer's
//! `cpu.js` does: CPU over a window in % of one core (2 cores: at most 200) for the whole
//! machine, each process of the bench and redis-server, and `other` = everything else
//! (noise: a run with `other` well above ~5 was disturbed). Plus each role's minor page
//! faults over the window (pages the kernel handed a process fresh) and resident memory.

use std::time::Instant;

/// One process whose CPU is counted, under a role name (several pids may share a role:
/// the worker processes).
#[derive(Debug, Clone)]
pub struct Watched {
    /// `producer`, `worker`, `redis`.
    pub role: &'static str,
    /// Its pid; `None` when unknown (counted as unreadable).
    pub pid: Option<u32>,
}

/// The clock ticks per second of /proc figures (USER_HZ).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// Busy ticks of the whole machine (all cores), from the first line of /proc/stat.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some(total - idle)
}

/// What a process has used so far: CPU (utime + stime) in ticks, and minor page faults.
#[derive(Debug, Clone, Copy)]
struct Used {
    ticks: u64,
    faults: u64,
}

fn process_used(pid: u32) -> Option<Used> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let n = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(Used {
        ticks: n(11)? + n(12)?,
        faults: n(7)?,
    })
}

/// Resident memory of a process in kB (VmRSS of /proc/<pid>/status).
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// The most resident memory a process has had in kB (VmHWM of /proc/<pid>/status).
pub fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM:")
}

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The short name of a process (/proc/<pid>/comm).
pub fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// CPU counters at the start of a window.
#[derive(Debug)]
pub struct CpuWindow {
    at: Instant,
    machine: Option<u64>,
    procs: Vec<(Watched, Option<Used>)>,
}

/// CPU use over a window, in % of one core.
#[derive(Debug, Clone, Default)]
pub struct CpuSplit {
    /// The whole machine.
    pub machine: Option<f64>,
    /// Per role, in the order the roles were first watched; `None` if unreadable.
    pub roles: Vec<(&'static str, Option<f64>)>,
    /// The machine minus every watched process.
    pub other: Option<f64>,
    /// Minor page faults per role over the window; `None` if unreadable.
    pub faults: Vec<(&'static str, Option<u64>)>,
}

impl CpuWindow {
    /// Starts a window over these processes.
    pub fn start(watched: &[Watched]) -> CpuWindow {
        CpuWindow {
            at: Instant::now(),
            machine: machine_busy_ticks(),
            procs: watched
                .iter()
                .map(|w| (w.clone(), w.pid.and_then(process_used)))
                .collect(),
        }
    }

    /// Ends the window.
    pub fn stop(&self) -> CpuSplit {
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let hz = ticks_per_second();
        let pct = |ticks: u64| round1(ticks as f64 / hz / secs * 100.0);
        let machine_ticks = self
            .machine
            .zip(machine_busy_ticks())
            .map(|(a, b)| b.saturating_sub(a));
        let mut roles: Vec<(&'static str, Option<u64>)> = Vec::new();
        let mut faults: Vec<(&'static str, Option<u64>)> = Vec::new();
        for (w, before) in &self.procs {
            let used = before.zip(w.pid.and_then(process_used));
            let ticks = used.map(|(a, b)| b.ticks.saturating_sub(a.ticks));
            let fresh = used.map(|(a, b)| b.faults.saturating_sub(a.faults));
            add(&mut roles, w.role, ticks);
            add(&mut faults, w.role, fresh);
        }
        // Like cpu.js: what is not known is left in `other`.
        let mine: u64 = roles.iter().filter_map(|(_, t)| *t).sum();
        CpuSplit {
            machine: machine_ticks.map(pct),
            roles: roles.iter().map(|(r, t)| (*r, t.map(pct))).collect(),
            other: machine_ticks.map(|m| round1(pct(m) - pct(mine))),
            faults,
        }
    }
}

/// Adds `v` to `role`'s sum (unknown once any part is): per-role figures of several
/// processes (the workers).
pub fn add(sums: &mut Vec<(&'static str, Option<u64>)>, role: &'static str, v: Option<u64>) {
    match sums.iter_mut().find(|(r, _)| *r == role) {
        Some((_, sum)) => *sum = sum.zip(v).map(|(a, b)| a + b),
        None => sums.push((role, v)),
    }
}

impl CpuSplit {
    /// `machine 182.0, producer 48.1, ...` for humans.
    pub fn line(&self) -> String {
        let show = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1}"));
        let mut parts = vec![format!("machine {}", show(self.machine))];
        for (role, v) in &self.roles {
            parts.push(format!("{role} {}", show(*v)));
        }
        parts.push(format!("other {}", show(self.other)));
        parts.join(", ")
    }
}

/// Rounds to one decimal.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_visible() {
        let me = std::process::id();
        // Resident memory first, then the peak: other tests run in threads of this process
        // and may grow it between the two reads, which only raises the peak read second.
        // Since Linux 6.2 both are sums of per-CPU counters read without their per-CPU
        // parts, so the peak can read a little under a resident size read just before
        // (seen: a test run on 6.18); a few MB of slack, far under either value.
        let rss = rss_kb(me).unwrap();
        assert!(rss > 0);
        assert!(peak_rss_kb(me).unwrap() + 4096 >= rss);
        assert!(process_used(me).is_some());
        assert!(machine_busy_ticks().is_some());
        let w = CpuWindow::start(&[
            Watched {
                role: "producer",
                pid: Some(me),
            },
            Watched {
                role: "worker",
                pid: Some(me),
            },
            Watched {
                role: "worker",
                pid: None,
            },
        ]);
        let split = w.stop();
        let roles: Vec<&str> = split.roles.iter().map(|(r, _)| *r).collect();
        assert_eq!(roles, ["producer", "worker"]);
        // an unreadable worker makes the worker sum unknown, not wrong
        assert_eq!(split.roles[1].1, None);
        assert_eq!(split.faults[1].1, None);
        assert!(split.faults[0].1.is_some());
        assert!(split.machine.is_some());
        assert!(split.line().starts_with("machine "));
    }
}
