//! Logs as tools expect them: no colour codes in a file, colours on a terminal unless
//! `NO_COLOR`, and `--log-format json` lines that parse as JSON.

use crate::support::*;
use pelican_testkit::{eventually_sync, free_port};
use serde_json::Value;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

const ESC: u8 = 0x1b;

/// A file for a process's stderr, and what it holds.
struct StderrFile {
    path: std::path::PathBuf,
}

impl StderrFile {
    fn new(name: &str) -> StderrFile {
        let dir = std::env::temp_dir().join(pelican_testkit::unique_name("pelican-logs"));
        std::fs::create_dir_all(&dir).unwrap();
        StderrFile {
            path: dir.join(name),
        }
    }

    fn stdio(&self) -> Stdio {
        Stdio::from(File::create(&self.path).unwrap())
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    fn text(&self) -> String {
        String::from_utf8(self.bytes()).unwrap()
    }
}

impl Drop for StderrFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.path.parent().unwrap());
    }
}

/// Runs `cmd` to its end with stderr into `file`; returns the exit code.
fn run_to_file(mut cmd: Command, file: &StderrFile) -> i32 {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(file.stdio())
        .spawn()
        .expect("start pelican");
    let deadline = std::time::Instant::now() + RUN_TIMEOUT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("pelican did not exit within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A worker with debug logs, one call, a SIGTERM: every line the two wrote to their
/// files is plain text.
#[test]
fn logs_in_a_file_carry_no_colour_codes() {
    let env = Env::new("logs-file");
    let worker_log = StderrFile::new("worker.log");
    let mut worker = env
        .cmd(&["-vv", "worker"])
        .stdout(Stdio::null())
        .stderr(worker_log.stdio())
        .spawn()
        .unwrap();
    eventually_sync(Duration::from_secs(20), "the worker to start", || {
        worker_log.text().contains("serving queue")
    });
    let call_log = StderrFile::new("call.log");
    assert_eq!(
        run_to_file(env.cmd(&["-vv", "call", r#"{"n": 1}"#]), &call_log),
        0
    );
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) };
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status:?}");
    for (name, file) in [("worker", &worker_log), ("call", &call_log)] {
        let text = file.text();
        assert!(
            text.contains("DEBUG") || text.contains(" INFO "),
            "{name}: logs were written: {text}"
        );
        assert!(
            !file.bytes().contains(&ESC),
            "{name}'s log file holds escape codes: {text:?}"
        );
    }
    assert!(worker_log.text().contains("stopped after handling 1"));
}

/// Runs `pelican -v call` (no worker: it logs its submission, then times out) with
/// stderr on a new pseudo-terminal; returns what the terminal showed.
fn on_a_terminal(env: &Env, no_color: Option<&str>) -> Vec<u8> {
    let (mut master, slave) = {
        let (mut m, mut s) = (0, 0);
        // SAFETY: openpty writes two descriptors into the given ints; the other
        // arguments may be null.
        let rc = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned here alone.
        unsafe { (File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
    };
    let mut cmd = env.cmd(&["-v", "call", "--timeout", "100", "{}"]);
    match no_color {
        Some(v) => cmd.env("NO_COLOR", v),
        None => cmd.env_remove("NO_COLOR"),
    };
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    drop(cmd); // the parent's copy of the terminal's end, so reading ends with the child
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // The terminal's end reads EIO once no process holds it open.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    assert_eq!(child.wait().unwrap().code(), Some(4), "a timeout");
    reader.join().unwrap()
}

#[test]
fn a_terminal_gets_colours_unless_no_color() {
    let env = Env::new("logs-tty");
    let coloured = on_a_terminal(&env, None);
    let text = String::from_utf8_lossy(&coloured);
    assert!(text.contains("submitted"), "logs on the terminal: {text:?}");
    assert!(coloured.contains(&ESC), "colours on a terminal: {text:?}");
    // An empty NO_COLOR counts as unset (no-color.org).
    assert!(on_a_terminal(&env, Some("")).contains(&ESC));
    let plain = on_a_terminal(&env, Some("1"));
    let text = String::from_utf8_lossy(&plain);
    assert!(text.contains("submitted"), "logs on the terminal: {text:?}");
    assert!(!plain.contains(&ESC), "NO_COLOR=1: {text:?}");
}

/// Every line of stderr is one JSON object with a timestamp, a level and a message.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\nin:\n{text}"));
            for key in ["timestamp", "level", "message"] {
                assert!(v.get(key).is_some(), "no {key:?}: {l}");
            }
            v
        })
        .collect()
}

/// A worker's whole stderr with `--log-format json`: its logs at debug level, its own
/// start and stop messages, each a JSON object; so is a failing command's error.
#[test]
fn json_logs_are_one_object_per_line() {
    let env = Env::new("logs-json");
    let log = StderrFile::new("worker.json");
    let mut worker = env
        .cmd(&["--log-format", "json", "-vv", "worker", "--verbose"])
        .stdout(Stdio::null())
        .stderr(log.stdio())
        .spawn()
        .unwrap();
    eventually_sync(Duration::from_secs(20), "the worker to start", || {
        log.text().contains("serving queue")
    });
    let out = env.run(&["call", r#"{"n": 2}"#]);
    assert_eq!(out.code, 0, "{out:?}");
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) };
    assert!(worker.wait().unwrap().success());
    let lines = json_lines(&log.text());
    let messages: Vec<&str> = lines
        .iter()
        .map(|v| v["message"].as_str().unwrap_or(""))
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("serving queue")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("stopped after handling 1 requests")),
        "{messages:?}"
    );
    assert!(
        lines.iter().any(|v| v["level"] == "DEBUG"),
        "-vv: debug events are there too: {messages:?}"
    );
    // The handler's span travels with its events.
    assert!(
        lines
            .iter()
            .any(|v| v["span"]["name"] == "request" && v["span"]["rid"].is_string()),
        "an event inside the worker's request span: {lines:?}"
    );

    // The error a command ends with.
    let err = StderrFile::new("call.json");
    let code = run_to_file(
        {
            let mut c = pelican();
            c.args([
                "--log-format",
                "json",
                "--redis",
                &format!("redis://127.0.0.1:{}", free_port()),
                "call",
                "{}",
            ]);
            c
        },
        &err,
    );
    assert_ne!(code, 0);
    let lines = json_lines(&err.text());
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR", "{last}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .starts_with("pelican: cannot reach"),
        "{last}"
    );
}
