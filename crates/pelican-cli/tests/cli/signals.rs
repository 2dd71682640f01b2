//! SIGPIPE stays ignored: a write to a socket whose peer is gone (a Redis node killed
//! mid-write) raises it, and must be an error pelican handles, not the end of a worker
//! (found by the reliability suite's cluster failover: a worker died of SIGPIPE). A
//! reader of standard output that goes away still ends the process quietly.

use crate::support::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

/// A line of `/proc/<pid>/status`.
fn proc_status(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

#[test]
fn a_worker_ignores_sigpipe_and_keeps_serving() {
    let env = Env::new("sigpipe");
    let worker = env.spawn(&["worker"]);
    let out = env.run(&["call", r#"{"k": 1}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    let ignored = u64::from_str_radix(&proc_status(worker.pid(), "SigIgn"), 16).expect("a mask");
    assert_ne!(
        ignored & (1 << (libc::SIGPIPE - 1)),
        0,
        "the worker does not ignore SIGPIPE"
    );
    worker.signal(libc::SIGPIPE);
    let out = env.run(&["call", r#"{"k": 2}"#]);
    assert_eq!(
        out.code,
        0,
        "no answer after SIGPIPE: {out:?}\nworker stderr: {}",
        worker.stderr()
    );
    let state = proc_status(worker.pid(), "State");
    assert!(
        state.starts_with('S') || state.starts_with('R'),
        "worker state {state}"
    );
}

#[test]
fn output_to_a_reader_that_went_away_ends_quietly() {
    let env = Env::new("sigpipe-out");
    let mut child = env
        .cmd(&["stats"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pelican");
    // The reader goes away before anything is written (`pelican stats | true`).
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(libc::SIGPIPE),
        "{status}; stderr: {stderr}"
    );
    assert!(stderr.is_empty(), "it said something: {stderr}");
}
