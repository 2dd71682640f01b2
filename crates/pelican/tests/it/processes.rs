//! Dedup across producers in two OS processes: the test runs its own binary again
//! as a child process whose `child_producer` test submits the same request.

use crate::common::*;
use pelican::{Producer, QueueConfig, Submitted};
use pelican_testkit::{eventually, RedisServer};
use std::process::Stdio;
use std::time::Duration;

const URL: &str = "PELICAN_CHILD_URL";
const QUEUE: &str = "PELICAN_CHILD_QUEUE";
/// What the child prints for the parent starts with this (the test harness may have
/// printed `test ... ` on the same line before it).
const MARK: &str = "PELICAN_CHILD";

fn the_request() -> Req {
    Req::new(42, "two processes")
}

/// The child's side: a producer in another process. Does nothing unless the parent
/// test started this binary with `PELICAN_CHILD_URL` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_producer() {
    let (Ok(url), Ok(name)) = (std::env::var(URL), std::env::var(QUEUE)) else {
        return;
    };
    let p = Producer::<Req, Resp>::connect(QueueConfig::new(url, name), fast_producer())
        .await
        .expect("child producer connects");
    let t = p.submit(&the_request()).await.expect("child submits");
    println!("{MARK} producer {}", p.id());
    println!("{MARK} submitted {:?}", t.submitted());
    let resp = t.await.expect("child gets the answer");
    println!("{MARK} answer {}", serde_json::to_string(&resp).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_across_two_processes() {
    let server = RedisServer::start();
    let q = queue(&server, "procs");
    let probe = Probe::new(&server, &q).await;
    let (w, runs, gate) =
        Worker::gated(&q, fast_consumer(), format!("pid {}", std::process::id())).await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    let before = probe.entries_added().await;
    let ticket = p.submit(&the_request()).await.unwrap();
    assert_eq!(ticket.submitted(), Submitted::Queued);
    let rid = ticket.request_id().to_string();

    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "processes::child_producer",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(URL, server.url())
        .env(QUEUE, &q.name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the test binary runs again");
    // The handler holds the one run until the child has joined as a second waiter.
    eventually(
        Duration::from_secs(20),
        "the child process joining the request",
        || async {
            match probe.get(&probe.req(&rid)).await {
                Some(v) => {
                    let v = String::from_utf8_lossy(&v).into_owned();
                    v.starts_with('P') && v.split(';').filter(|s| !s.is_empty()).count() == 4
                }
                None => false,
            }
        },
    )
    .await;
    gate.open();

    let answer = within(Duration::from_secs(10), "the parent's answer", ticket)
        .await
        .unwrap();
    let out = within(
        Duration::from_secs(20),
        "the child exiting",
        child.wait_with_output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |what: &str| {
        stdout
            .lines()
            .find_map(|l| Some(l.split_once(&format!("{MARK} {what} "))?.1))
            .unwrap_or_else(|| panic!("the child did not say `{what}`:\n{stdout}"))
            .to_string()
    };
    assert_ne!(line("producer"), p.id(), "two producers");
    assert_eq!(line("submitted"), "Joined");
    let child_answer: Resp = serde_json::from_str(&line("answer")).unwrap();
    assert_eq!(child_answer, answer);
    assert_eq!(answer.by, format!("pid {}", std::process::id()));
    assert_eq!(
        probe.entries_added().await - before,
        1,
        "stream entries added"
    );
    assert_eq!(runs.get(&rid), 1);
    assert_eq!(runs.total(), 1);
    w.stop().await;
}
