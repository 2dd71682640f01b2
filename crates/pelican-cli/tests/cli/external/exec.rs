//! `pelican worker --exec`: the line protocol with real python3 children, their
//! supervision (killed, garbage, poison, backoff) and a graceful stop.

use super::*;
use pelican_testkit::eventually_sync;
use serde_json::{json, Value};

/// `pelican call --id RID JSON` in the background.
fn call(env: &Env, rid: &str, body: &Value) -> Proc {
    env.spawn(&["call", "--id", rid, "--timeout", "60000", &body.to_string()])
}

/// A worker of `child.py` children.
fn child_worker(env: &Env, extra: &[&str]) -> Proc {
    let exec = exec_python(&script("child.py"));
    let mut args = vec![
        "worker",
        "--exec",
        &exec,
        "--claim-idle",
        "1000",
        "--verbose",
    ];
    args.extend_from_slice(extra);
    env.spawn(&args)
}

fn answer(p: Proc) -> Value {
    let out = p.wait(Duration::from_secs(60));
    assert_eq!(out.code, 0, "{out:?}");
    out.json()
}

/// The example answers JSON (and fails bad input for good with its message), and, with
/// `--codec raw`, bytes carried base64-encoded.
#[test]
fn the_python_example_serves_json_and_raw_queues() {
    let env = Env::new("exec-example");
    let exec = exec_python(&example("exec_worker.py"));
    let w = env.spawn(&["worker", "--exec", &exec, "--processes", "2"]);
    let out = env.run(&["call", r#"{"n": 12}"#]);
    assert_eq!(out.code, 0, "{out:?}\n{}", w.stderr());
    assert_eq!(out.json(), json!({"n": 12, "square": 144}));
    let out = env.run(&["call", r#"{"x": 1}"#]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr.contains(r#"expected {"n": <number>}"#),
        "{out:?}"
    );
    let raw = Env {
        server: pelican_testkit::RedisServer::start(),
        queue: "raw".into(),
    };
    let rw = raw.spawn(&["worker", "--exec", &exec, "--codec", "raw"]);
    // `pelican call` sends JSON text; the raw worker's child upper-cases its bytes.
    let out = raw.run(&["call", r#"{"a": "bc"}"#]);
    assert_eq!(out.code, 0, "{out:?}\n{}", rw.stderr());
    assert_eq!(out.json(), json!({"A": "BC"}));
    for p in [w, rw] {
        p.signal(libc::SIGTERM);
        let out = p.wait(Duration::from_secs(30));
        assert_eq!(out.code, 0, "{out:?}");
        let pids = child_pids(&out.stderr);
        assert!(pids.iter().all(|p| !alive(*p)), "children left: {pids:?}");
    }
}

/// A child SIGKILLed in the middle of a request: the request is handed back and
/// answered by the restarted child (its second delivery, another pid).
#[test]
fn a_child_killed_mid_request_is_restarted_and_the_request_answered() {
    let env = Env::new("exec-kill");
    let w = child_worker(&env, &[]);
    let c = call(&env, "slow-1", &json!({"sleep_ms": 600_000}));
    let mut victim = None;
    eventually_sync(Duration::from_secs(30), "the child to start on it", || {
        victim = pid_working_on(&w.stderr(), "slow-1");
        victim.is_some()
    });
    let victim = victim.unwrap();
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let a = answer(c);
    assert_eq!(a["delivery"], json!(2), "{a}");
    assert_ne!(a["pid"], json!(victim), "answered by a new child");
    let err = w.stderr();
    assert!(err.contains("was killed by SIGKILL"), "{err}");
    assert!(
        err.contains("1 request(s) in its hands handed back"),
        "{err}"
    );
    assert!(err.contains("restarting it in"), "{err}");
    let lines = handled(&w.stdout()).len();
    assert_eq!(lines, 2, "a retry, then the answer: {}", w.stdout());
}

/// A child that writes a line that is not an answer is restarted, and the request it
/// held is answered on its next delivery.
#[test]
fn a_child_that_writes_garbage_is_restarted() {
    let env = Env::new("exec-garbage");
    let w = child_worker(&env, &[]);
    let a = answer(call(&env, "g-1", &json!({"garbage": true})));
    assert_eq!(a["delivery"], json!(2), "{a}");
    let err = w.stderr();
    assert!(
        err.contains("wrote a line that is not an answer") && err.contains("this is not an answer"),
        "{err}"
    );
    assert_eq!(child_pids(&err).len(), 2, "one restart: {err}");
}

/// A child that does not answer within --handler-timeout is taken for hung: killed
/// (its process group: SIGTERM), restarted, and the request answered on its next
/// delivery by the new child.
#[test]
fn a_child_that_hangs_past_the_handler_timeout_is_restarted() {
    let env = Env::new("exec-hang");
    let w = child_worker(&env, &["--handler-timeout", "1000"]);
    let a = answer(call(&env, "hang-1", &json!({"sleep_ms": 600_000})));
    assert_eq!(a["delivery"], json!(2), "{a}");
    let err = w.stderr();
    assert!(
        err.contains(
            "did not answer request \"hang-1\" within --handler-timeout (1000 ms): taken for hung"
        ),
        "{err}"
    );
    let pids = child_pids(&err);
    assert_eq!(pids.len(), 2, "{err}");
    assert!(!alive(pids[0]), "the hung child was killed");
    assert_eq!(a["pid"], json!(pids[1]));
}

/// A request that kills every child that gets it is dead-lettered after max_deliveries
/// (its caller gets the dead error) and the children keep serving other requests.
#[test]
fn a_poison_request_that_kills_every_child_is_dead_lettered() {
    let env = Env::new("exec-poison");
    let w = child_worker(&env, &["--processes", "2", "--max-deliveries", "3"]);
    let out =
        call(&env, "poison", &json!({"exit": 3, "times": 1000})).wait(Duration::from_secs(60));
    assert_eq!(out.code, 4, "{out:?}\n{}", w.stderr());
    assert!(out.stderr.contains("dead-lettered"), "{out:?}");
    let dead = env.run(&["--json", "dead", "list"]);
    assert_eq!(dead.code, 0, "{dead:?}");
    assert!(dead.stdout.contains("poison"), "{dead:?}");
    let err = w.stderr();
    assert_eq!(
        err.matches("exited with code 3").count(),
        3,
        "one child death per delivery: {err}"
    );
    let a = answer(call(&env, "fine", &json!({"n": 1})));
    assert_eq!(a["echo"], json!({"n": 1}));
}

/// A child that dies at once every time is restarted with growing pauses (100 ms,
/// 200 ms, ... at most 10 s), not in a loop; the request waiting meanwhile is held (no
/// delivery spent on children that never said hello) and answered once a child starts.
#[test]
fn a_child_that_dies_at_once_is_restarted_with_backoff() {
    let env = Env::new("exec-backoff");
    let dir = std::env::temp_dir().join(pelican_testkit::unique_name("exec-backoff"));
    std::fs::create_dir_all(&dir).unwrap();
    let flag = dir.join("die");
    // While the flag file exists, the child exits at once, before its hello.
    let child = format!(
        "import os, sys, runpy\n\
         sys.exit(7) if os.path.exists({flag:?}) else runpy.run_path({script:?})\n",
        flag = flag.to_str().unwrap(),
        script = script("child.py"),
    );
    let path = dir.join("flaky.py");
    std::fs::write(&path, child).unwrap();
    let exec = exec_python(path.to_str().unwrap());
    let w = env.spawn(&["worker", "--exec", &exec, "--claim-idle", "1000"]);
    let a = answer(call(&env, "before", &json!({"n": 1})));
    assert_eq!(a["delivery"], json!(1));
    std::fs::write(&flag, "").unwrap();
    // Kill the child: from now on every start dies at once.
    let first = child_pids(&w.stderr());
    let a2 = call(&env, "during", &json!({"exit": 1}));
    eventually_sync(Duration::from_secs(20), "six restarts", || {
        w.stderr().matches("restarting it in").count() >= 6
    });
    let err = w.stderr();
    let pauses: Vec<u64> = err
        .lines()
        .filter_map(|l| l.split("restarting it in ").nth(1))
        .filter_map(|r| r.trim_end_matches(" ms").parse().ok())
        .collect();
    // The first restart follows a child that had answered: the backoff starts over.
    assert_eq!(&pauses[..6], [100, 100, 200, 400, 800, 1600], "{err}");
    assert!(
        err.contains("exited with code 7 (before its hello)"),
        "{err}"
    );
    std::fs::remove_file(&flag).unwrap();
    let a2 = answer(a2);
    assert_eq!(
        a2["echo"],
        json!({"exit": 1}),
        "answered once it could start"
    );
    assert!(first.iter().all(|p| !alive(*p)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM on a busy worker: the requests in the children's hands are finished and
/// answered, the worker exits 0 with its children gone, and the requests it had not
/// read are served by the next worker: every caller gets its answer.
#[test]
fn sigterm_on_a_busy_exec_worker_loses_nothing() {
    let env = Env::new("exec-term");
    let w = child_worker(&env, &["--processes", "2", "--concurrency", "4"]);
    let calls: Vec<Proc> = (0..10)
        .map(|i| {
            call(
                &env,
                &format!("t{i}"),
                &json!({"i": i, "sleep_ms": 1500, "times": 1000}),
            )
        })
        .collect();
    eventually_sync(
        Duration::from_secs(30),
        "four requests in the children's hands",
        || w.stderr().matches("] working on").count() >= 4,
    );
    w.signal(libc::SIGTERM);
    let out = w.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("stopped after handling 4 requests"),
        "{}",
        out.stderr
    );
    let pids = child_pids(&out.stderr);
    assert_eq!(pids.len(), 2, "{}", out.stderr);
    assert!(pids.iter().all(|p| !alive(*p)), "children left: {pids:?}");
    let next = child_worker(&env, &["--processes", "2", "--concurrency", "6"]);
    for (i, c) in calls.into_iter().enumerate() {
        let a = answer(c);
        assert_eq!(a["echo"]["i"], json!(i), "{a}");
        assert_eq!(a["delivery"], json!(1), "finished, not handed back: {a}");
    }
    drop(next);
}

/// SIGTERM past --shutdown-timeout: the requests still in the children's hands are
/// released, and another worker answers them.
#[test]
fn sigterm_past_the_shutdown_timeout_releases_the_requests_in_hand() {
    let env = Env::new("exec-term-release");
    let w = child_worker(&env, &["--concurrency", "2", "--shutdown-timeout", "300"]);
    let calls: Vec<Proc> = (0..2)
        .map(|i| {
            call(
                &env,
                &format!("r{i}"),
                &json!({"i": i, "sleep_ms": 600_000}),
            )
        })
        .collect();
    eventually_sync(Duration::from_secs(30), "both requests in hand", || {
        w.stderr().matches("] working on").count() >= 2
    });
    w.signal(libc::SIGTERM);
    let out = w.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(child_pids(&out.stderr).iter().all(|p| !alive(*p)));
    let _next = child_worker(&env, &[]);
    for (i, c) in calls.into_iter().enumerate() {
        let a = answer(c);
        assert_eq!(a["echo"]["i"], json!(i), "{a}");
        assert_eq!(a["delivery"], json!(2), "{a}");
    }
}

/// Bad arguments and a command that cannot start: usage errors (exit 2) before the
/// worker joins the queue.
#[test]
fn bad_exec_arguments_are_usage_errors() {
    let env = Env::new("exec-bad");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--codec".into(), "raw".into()],
            "--codec raw needs --exec or --http",
        ),
        (vec!["--processes".into(), "2".into()], "--exec"),
        (
            vec![
                "--exec".into(),
                "x".into(),
                "--http".into(),
                "http://a".into(),
            ],
            "cannot be used with",
        ),
        (
            vec![
                "--exec".into(),
                "x".into(),
                "--handler".into(),
                "echo".into(),
            ],
            "cannot be used with",
        ),
        (vec!["--exec".into(), "'open".into()], "is not closed"),
        (
            vec!["--exec".into(), "/nonexistent/program".into()],
            "cannot start",
        ),
        (
            vec![
                "--exec".into(),
                format!("{} -c 'import sys; sys.exit(5)'", python3()),
            ],
            "exited with code 5",
        ),
        (
            vec!["--exec".into(), format!("{} -c 'print(\"hi\")'", python3())],
            "is not the hello",
        ),
        (
            vec![
                "--exec".into(),
                format!("{} -c 'import time; time.sleep(60)'", python3()),
                "--start-timeout".into(),
                "300".into(),
            ],
            "within --start-timeout (300 ms)",
        ),
        (vec!["--http".into(), "https://x/".into()], "only http://"),
        (vec!["--http".into(), "not a url".into()], "not a URL"),
    ];
    for (args, says) in cases {
        let mut all = vec!["worker"];
        all.extend(args.iter().map(String::as_str));
        let out = env.run(&all);
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
    let st = env.stats();
    assert_eq!(st["consumers"], json!([]), "nobody joined: {st}");
}

/// A worker SIGKILLed with its children at work takes them along (they get SIGKILL when
/// their parent dies): nothing is left running, and the request it held is taken over by
/// another worker after claim_idle.
#[test]
fn a_sigkilled_worker_leaves_no_child_behind() {
    let env = Env::new("exec-sigkill");
    let w = child_worker(&env, &["--processes", "2"]);
    let c = call(&env, "held", &json!({"sleep_ms": 600_000}));
    eventually_sync(
        Duration::from_secs(30),
        "the request in a child's hands",
        || pid_working_on(&w.stderr(), "held").is_some(),
    );
    let pids = child_pids(&w.stderr());
    assert_eq!(pids.len(), 2, "{}", w.stderr());
    w.signal(libc::SIGKILL);
    let out = w.wait(Duration::from_secs(10));
    assert_eq!(out.code, 128 + libc::SIGKILL, "{out:?}");
    eventually_sync(Duration::from_secs(10), "the children to be gone", || {
        pids.iter().all(|p| !alive(*p))
    });
    let _next = child_worker(&env, &[]);
    let a = answer(c);
    assert_eq!(a["delivery"], json!(2), "{a}");
}
