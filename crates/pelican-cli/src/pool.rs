//! The demo's worker processes: `pelican worker` children of this binary, watched like a
//! supervisor would (their data lines become events; an exit is reported so the demo can
//! start a replacement).

use crate::exit::{CliError, CliResult};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// Lines of a worker's stderr kept for messages.
const STDERR_TAIL: usize = 8;

/// What a worker process did.
#[derive(Debug)]
pub enum Event {
    /// It connected and serves (its consumer name).
    Ready { slot: usize, consumer: String },
    /// It handled one request (its delivery number: above 1 when taken over).
    Handled { delivery: u64 },
    /// It exited; `stderr` holds its last lines.
    Exited {
        slot: usize,
        pid: u32,
        status: Option<ExitStatus>,
        stderr: Vec<String>,
    },
}

/// One worker process.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Its pid.
    pub pid: u32,
    /// Its consumer name, once it reported ready.
    pub consumer: Option<String>,
}

/// The worker processes of one demo run, numbered from 1 in start order.
pub struct Pool {
    exe: PathBuf,
    args: Vec<String>,
    tx: mpsc::UnboundedSender<Event>,
    live: HashMap<usize, Worker>,
    started: usize,
}

impl Pool {
    /// A pool that starts `exe args...`; events arrive on the returned receiver.
    pub fn new(exe: PathBuf, args: Vec<String>) -> (Pool, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = Pool {
            exe,
            args,
            tx,
            live: HashMap::new(),
            started: 0,
        };
        (pool, rx)
    }

    /// Starts one more worker; returns its number.
    pub fn spawn(&mut self) -> CliResult<usize> {
        let mut std_cmd = std::process::Command::new(&self.exe);
        std_cmd
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::process::detach(&mut std_cmd);
        let mut cmd = tokio::process::Command::from(std_cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            CliError::failure(format!(
                "cannot start a worker process ({}): {e}",
                self.exe.display()
            ))
        })?;
        self.started += 1;
        let slot = self.started;
        let pid = child.id().unwrap_or(0);
        self.live.insert(
            slot,
            Worker {
                pid,
                consumer: None,
            },
        );
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let tx = self.tx.clone();
        let out_task = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(ev) = parse_line(slot, &line) {
                    let _ = tx.send(ev);
                }
            }
        });
        let err_task = {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut t = tail.lock().unwrap();
                    if t.len() == STDERR_TAIL {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })
        };
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let status = child.wait().await.ok();
            // Every data line is read before the exit is reported.
            let _ = out_task.await;
            let _ = err_task.await;
            let stderr = tail.lock().unwrap().iter().cloned().collect();
            let _ = tx.send(Event::Exited {
                slot,
                pid,
                status,
                stderr,
            });
        });
        Ok(slot)
    }

    /// Records what an event says about the pool (ready: its consumer name; exited: gone).
    pub fn observe(&mut self, ev: &Event) {
        match ev {
            Event::Ready { slot, consumer } => {
                if let Some(w) = self.live.get_mut(slot) {
                    w.consumer = Some(consumer.clone());
                }
            }
            Event::Exited { slot, .. } => {
                self.live.remove(slot);
            }
            Event::Handled { .. } => {}
        }
    }

    /// The worker with this number, if it is alive.
    pub fn get(&self, slot: usize) -> Option<&Worker> {
        self.live.get(&slot)
    }

    /// The live worker whose consumer is `name`.
    pub fn by_consumer(&self, name: &str) -> Option<usize> {
        self.live
            .iter()
            .find(|(_, w)| w.consumer.as_deref() == Some(name))
            .map(|(s, _)| *s)
    }

    /// How many workers are alive, and how many of them are ready.
    pub fn counts(&self) -> (usize, usize) {
        let ready = self.live.values().filter(|w| w.consumer.is_some()).count();
        (self.live.len(), ready)
    }

    /// How many workers were started in all.
    pub fn started(&self) -> usize {
        self.started
    }

    /// Sends `signal` to one worker.
    pub fn signal(&self, slot: usize, signal: libc::c_int) -> bool {
        self.live
            .get(&slot)
            .is_some_and(|w| crate::process::signal(w.pid, signal))
    }

    /// Sends `signal` to every live worker.
    pub fn signal_all(&self, signal: libc::c_int) {
        for w in self.live.values() {
            crate::process::signal(w.pid, signal);
        }
    }
}

/// A worker's `--verbose --json` line as an event.
fn parse_line(slot: usize, line: &str) -> Option<Event> {
    let v: Value = serde_json::from_str(line).ok()?;
    match v.get("event")?.as_str()? {
        "ready" => Some(Event::Ready {
            slot,
            consumer: v.get("consumer")?.as_str()?.to_string(),
        }),
        "handled" => Some(Event::Handled {
            delivery: v.get("delivery")?.as_u64()?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_lines_become_events() {
        let ev = parse_line(
            2,
            r#"{"event":"handled","delivery":3,"outcome":"ok","rid":"x"}"#,
        );
        assert!(matches!(ev, Some(Event::Handled { delivery: 3 })));
        let ev = parse_line(1, r#"{"event":"ready","consumer":"h-1-a","pid":1}"#);
        assert!(matches!(ev, Some(Event::Ready { slot: 1, consumer }) if consumer == "h-1-a"));
        assert!(parse_line(1, "not json").is_none());
    }
}
