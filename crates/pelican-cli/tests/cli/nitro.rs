//! `pelican nitro worker | call | stats` against real processes and a client of Nitro's
//! wire format (`pelican_testkit::nitro`, raw commands as Nitro's Go code sends them).

use crate::support::*;
use pelican_testkit::nitro::{Answer, NitroProducer};
use pelican_testkit::{eventually_sync, unique_name, RedisServer};
use redis::Value;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

/// A server and a stream of the test's own.
struct Nitro {
    server: RedisServer,
    stream: String,
}

impl Nitro {
    fn new(prefix: &str) -> Nitro {
        Nitro {
            server: RedisServer::start(),
            stream: unique_name(prefix),
        }
    }

    /// `pelican --redis URL nitro <sub> --stream S args...`.
    fn cmd(&self, sub: &str, args: &[&str]) -> Command {
        let mut cmd = pelican();
        cmd.args([
            "--redis",
            &self.server.url(),
            "nitro",
            sub,
            "--stream",
            &self.stream,
        ])
        .args(args);
        cmd
    }

    fn run(&self, sub: &str, args: &[&str]) -> Out {
        run(self.cmd(sub, args))
    }

    fn spawn(&self, sub: &str, args: &[&str]) -> Proc {
        Proc::spawn(self.cmd(sub, args))
    }

    fn producer(&self) -> NitroProducer {
        NitroProducer::new(&self.server.url(), &self.stream)
    }

    /// Pending entries per owner.
    fn held_by(&self, owner: &str) -> usize {
        let v: Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg("-")
            .arg("+")
            .arg(1000)
            .arg(owner)
            .query(&mut self.server.sync_connection())
            .unwrap();
        match v {
            Value::Array(a) => a.len(),
            _ => 0,
        }
    }

    fn xlen(&self) -> u64 {
        redis::cmd("XLEN")
            .arg(&self.stream)
            .query(&mut self.server.sync_connection())
            .unwrap()
    }

    /// Once every entry is answered, the dedup state left is one cached result per
    /// distinct body (no job), each expiring within the default cache TTL.
    fn assert_dedup_state_is_the_cache(&self, distinct: usize) {
        let prefix = format!("pelican-nitro:{{{}}}:", self.stream);
        assert!(self.keys(&format!("{prefix}job:*")).is_empty());
        let cached = self.keys(&format!("{prefix}done:*"));
        assert_eq!(cached.len(), distinct, "{cached:?}");
        assert_eq!(self.keys(&format!("{prefix}*")).len(), distinct);
        let max = pelican::nitro::DEFAULT_DEDUP_CACHE_TTL.as_millis() as i64;
        for key in cached {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query(&mut self.server.sync_connection())
                .unwrap();
            assert!(ttl > 0 && ttl <= max, "{key}: {ttl} ms");
        }
    }

    fn keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.server.sync_connection())
            .unwrap()
    }
}

fn handled_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("failed "))
        .collect()
}

/// Worker and call: the echo is the request byte for byte; a handler failure exits 3
/// with the error key's text; no worker exits 4; stats shows the group; a stopped worker
/// leaves the group.
#[test]
fn nitro_call_and_worker_round_trip() {
    let n = Nitro::new("nitro-rt");
    let worker = n.spawn(
        "worker",
        &["--handler", "fail-if:bad", "--verbose", "--name", "w1"],
    );
    let body = r#"{"b": 1, "a": [1,2,  3], "s": "<&>"}"#;
    let out = n.run("call", &[body]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim_end(), body, "echoed unchanged");

    let out = n.run("call", &[r#"{"bad": true}"#]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr
            .contains(r#"fail-if:bad: the request has "bad": true"#),
        "{out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");

    let stats = run({
        let mut c = n.cmd("stats", &[]);
        c.arg("--json");
        c
    });
    assert_eq!(stats.code, 0, "{stats:?}");
    let st = stats.json();
    assert_eq!(st["stream"], json!(n.stream));
    assert_eq!(st["exists"], json!(true));
    assert_eq!(st["group"]["pending"], json!(0));
    assert_eq!(st["consumers"][0]["name"], json!("w1"));
    assert_eq!(st["result_keys"], json!(0), "read answers are deleted");
    let text = n.run("stats", &[]);
    assert!(text.stdout.contains("consumers       1"), "{text:?}");

    worker.signal(libc::SIGTERM);
    let w = worker.wait(Duration::from_secs(20));
    assert_eq!(w.code, 0, "{w:?}");
    let lines = handled_lines(&w.stdout);
    assert_eq!(lines.len(), 2, "one line per handler run: {w:?}");
    assert!(
        lines[0].starts_with("ok ") && lines[0].contains("delivery=1"),
        "{w:?}"
    );
    assert!(lines[1].starts_with("failed "), "{w:?}");
    let st = run({
        let mut c = n.cmd("stats", &[]);
        c.arg("--json");
        c
    })
    .json();
    assert_eq!(st["consumers"], json!([]), "a clean exit leaves the group");

    let other = Nitro {
        server: RedisServer::start(),
        stream: unique_name("nitro-none"),
    };
    let out = other.run("call", &["--timeout", "300", r#"{"n": 1}"#]);
    assert_eq!(out.code, 4, "{out:?}");
    assert!(out.stderr.contains(pelican::nitro::TIMEOUT_TEXT), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("pelican nitro worker --stream {}", other.stream)),
        "{out:?}"
    );
    assert_eq!(other.xlen(), 0, "the timed-out request was withdrawn");

    for bad in [&["--stream", "has space", "{}"][..], &["{nope"]] {
        let mut c = pelican();
        c.args(["--redis", &n.server.url(), "nitro", "call"]);
        if bad.len() == 1 {
            c.args(["--stream", &n.stream]);
        }
        c.args(bad);
        let out = run(c);
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
    }
}

/// A worker SIGKILLed holding requests: another worker takes them over after the
/// idletime and answers every one (their second delivery).
#[test]
fn a_sigkilled_workers_requests_are_taken_over() {
    let n = Nitro::new("nitro-kill");
    let mut p = n.producer();
    let bodies: Vec<String> = (0..3)
        .map(|i| json!({"i": i, "data": "xxxx"}).to_string())
        .collect();
    let ids: Vec<String> = bodies.iter().map(|b| p.produce(b)).collect();
    let a = n.spawn(
        "worker",
        &[
            "--idletime",
            "2000",
            "--handler",
            "sleep:600000",
            "--concurrency",
            "3",
            "--name",
            "a",
        ],
    );
    eventually_sync(
        Duration::from_secs(30),
        "worker a to hold all three",
        || n.held_by("a") == 3,
    );
    a.signal(libc::SIGKILL);
    let out = a.wait(Duration::from_secs(10));
    assert_eq!(out.code, 128 + libc::SIGKILL, "{out:?}");
    let b = n.spawn(
        "worker",
        &["--idletime", "2000", "--verbose", "--name", "b"],
    );
    let answers = p.await_all(&ids, Duration::from_secs(60));
    for (id, body) in ids.iter().zip(&bodies) {
        assert_eq!(answers[id], Answer::Result(body.clone()), "{id}");
    }
    assert_eq!(n.xlen(), 0);
    b.signal(libc::SIGTERM);
    let out = b.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{out:?}");
    let lines = handled_lines(&out.stdout);
    assert_eq!(lines.len(), 3, "{out:?}");
    assert!(lines.iter().all(|l| l.contains("delivery=2")), "{out:?}");
}

/// Dedup, measured: three Nitro producers send the same five requests (15 entries); two
/// `--dedup` workers print one line per handler run: five lines in all, and every entry
/// gets its answer.
#[test]
fn dedup_handler_runs_equal_distinct_requests() {
    let n = Nitro::new("nitro-dedup");
    let distinct: Vec<String> = (0..5)
        .map(|i| json!({"i": i, "data": "same"}).to_string())
        .collect();
    let mut producers: Vec<NitroProducer> = (0..3).map(|_| n.producer()).collect();
    let mut sent = Vec::new();
    for p in producers.iter_mut() {
        sent.push(distinct.iter().map(|b| p.produce(b)).collect::<Vec<_>>());
    }
    let workers: Vec<Proc> = ["d1", "d2"]
        .iter()
        .map(|name| {
            n.spawn(
                "worker",
                &[
                    "--dedup",
                    "--handler",
                    "sleep:500",
                    "--verbose",
                    "--name",
                    name,
                ],
            )
        })
        .collect();
    for (p, ids) in producers.iter_mut().zip(&sent) {
        let answers = p.await_all(ids, Duration::from_secs(60));
        for (id, body) in ids.iter().zip(&distinct) {
            assert_eq!(answers[id], Answer::Result(body.clone()), "{id}");
        }
    }
    let mut runs = 0;
    for w in workers {
        w.signal(libc::SIGTERM);
        let out = w.wait(Duration::from_secs(20));
        assert_eq!(out.code, 0, "{out:?}");
        runs += handled_lines(&out.stdout).len();
    }
    assert_eq!(runs, 5, "handler runs = distinct requests");
    assert_eq!(n.xlen(), 0);
    n.assert_dedup_state_is_the_cache(distinct.len());
}

/// Dedup when the solving worker is SIGKILLed mid-run: the entries that joined its runs
/// are not lost; the other worker takes the jobs over after the idletime, solves each
/// distinct request once, and every entry of every producer gets its answer.
#[test]
fn dedup_survives_a_sigkilled_solver() {
    let n = Nitro::new("nitro-dedup-kill");
    let distinct: Vec<String> = (0..4)
        .map(|i| json!({"i": i, "data": "same"}).to_string())
        .collect();
    let mut producers: Vec<NitroProducer> = (0..3).map(|_| n.producer()).collect();
    let mut sent = Vec::new();
    for p in producers.iter_mut() {
        sent.push(distinct.iter().map(|b| p.produce(b)).collect::<Vec<_>>());
    }
    let a = n.spawn(
        "worker",
        &[
            "--dedup",
            "--idletime",
            "2000",
            "--handler",
            "sleep:600000",
            "--concurrency",
            "8",
            "--verbose",
            "--name",
            "solver",
        ],
    );
    // Four solvers running, eight joiners handed to the solver: all twelve are its.
    eventually_sync(
        Duration::from_secs(30),
        "the solver to hold every entry",
        || n.held_by("solver") == 12,
    );
    let jobs = n.keys(&format!("pelican-nitro:{{{}}}:job:*", n.stream));
    assert_eq!(jobs.len(), 4, "{jobs:?}");
    a.signal(libc::SIGKILL);
    let out_a = a.wait(Duration::from_secs(10));
    assert_eq!(out_a.code, 128 + libc::SIGKILL, "{out_a:?}");
    assert!(handled_lines(&out_a.stdout).is_empty(), "{out_a:?}");
    let b = n.spawn(
        "worker",
        &[
            "--dedup",
            "--idletime",
            "2000",
            "--handler",
            "sleep:200",
            "--verbose",
            "--name",
            "heir",
        ],
    );
    for (p, ids) in producers.iter_mut().zip(&sent) {
        let answers = p.await_all(ids, Duration::from_secs(60));
        for (id, body) in ids.iter().zip(&distinct) {
            assert_eq!(answers[id], Answer::Result(body.clone()), "{id}");
        }
    }
    b.signal(libc::SIGTERM);
    let out = b.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        handled_lines(&out.stdout).len(),
        4,
        "one run per distinct request: {out:?}"
    );
    assert_eq!(n.xlen(), 0);
    n.assert_dedup_state_is_the_cache(distinct.len());
}

/// Dedup across time: two Nitro producers send the same 300 requests, the second a
/// moment after the first one's first answer was written, so most of its copies arrive
/// after their twin was solved. With `--dedup` (and its default cache) every copy either
/// joins the run in flight or is answered from the cache: 300 handler runs, 600 answers.
#[test]
fn dedup_answers_repeats_of_solved_requests_from_the_cache() {
    let n = Nitro::new("nitro-dedup-cache");
    let distinct: Vec<String> = (0..300)
        .map(|i| json!({"i": i, "data": "twice"}).to_string())
        .collect();
    let workers: Vec<Proc> = ["c1", "c2"]
        .iter()
        .map(|name| n.spawn("worker", &["--dedup", "--verbose", "--name", name]))
        .collect();
    let mut first = n.producer();
    let ids_a: Vec<String> = distinct.iter().map(|b| first.produce(b)).collect();
    let key = format!("result-key:{}.{}", n.stream, ids_a[0]);
    eventually_sync(Duration::from_secs(30), "the first answer", || {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut n.server.sync_connection())
            .unwrap();
        exists
    });
    let mut second = n.producer();
    let ids_b: Vec<String> = distinct.iter().map(|b| second.produce(b)).collect();
    for (p, ids) in [(&mut first, &ids_a), (&mut second, &ids_b)] {
        let answers = p.await_all(ids, Duration::from_secs(60));
        for (id, body) in ids.iter().zip(&distinct) {
            assert_eq!(answers[id], Answer::Result(body.clone()), "{id}");
        }
    }
    let mut runs = 0;
    for w in workers {
        w.signal(libc::SIGTERM);
        let out = w.wait(Duration::from_secs(20));
        assert_eq!(out.code, 0, "{out:?}");
        runs += handled_lines(&out.stdout).len();
    }
    assert_eq!(runs, 300, "handler runs = distinct requests");
    assert_eq!(n.xlen(), 0);
    n.assert_dedup_state_is_the_cache(distinct.len());
}
