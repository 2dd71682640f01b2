//! `pelican nitro worker --exec | --http`: Nitro's streams served by the Python examples,
//! through the same handlers as `pelican worker`'s.

use super::*;
use pelican_testkit::nitro::{Answer, NitroProducer};
use pelican_testkit::{unique_name, RedisServer};
use serde_json::{json, Value};

/// Serves a stream with `handler_args`, sends a good and a bad request as Nitro's
/// producers do, and checks the result key and the error key's text.
fn serve_and_check(handler_args: &[&str]) {
    let server = RedisServer::start();
    let stream = unique_name("nitro-ext");
    let url = server.url();
    let mut args = vec!["--redis", &url, "nitro", "worker", "--stream", &stream];
    args.extend_from_slice(handler_args);
    args.push("--verbose");
    let mut cmd = pelican();
    cmd.args(&args);
    let w = Proc::spawn(cmd);
    let mut p = NitroProducer::new(&server.url(), &stream);
    let good = p.produce(r#"{"n": 4}"#);
    let bad = p.produce(r#"{"x": 1}"#);
    let answers = p.await_all(&[good.clone(), bad.clone()], Duration::from_secs(60));
    let Answer::Result(json_text) = &answers[&good] else {
        panic!("{:?}\n{}", answers[&good], w.stderr());
    };
    let v: Value = serde_json::from_str(json_text).unwrap();
    assert_eq!(v, json!({"n": 4, "square": 16}));
    assert_eq!(
        answers[&bad],
        Answer::Error(r#"expected {"n": <number>}"#.into())
    );
    w.signal(libc::SIGTERM);
    let out = w.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(handled(&out.stdout).len(), 2, "{out:?}");
    assert!(child_pids(&out.stderr).iter().all(|p| !alive(*p)));
}

#[test]
fn nitro_streams_are_served_by_an_exec_child() {
    let exec = exec_python(&example("exec_worker.py"));
    serve_and_check(&["--exec", &exec, "--processes", "2"]);
}

#[test]
fn nitro_streams_are_served_by_an_http_endpoint() {
    let mut cmd = Command::new(python3());
    cmd.args([&example("http_worker.py"), "--port", "0"]);
    let server = Proc::spawn(cmd);
    eventually_sync(Duration::from_secs(20), "the example's URL", || {
        server.stdout().contains('\n')
    });
    let url = server.stdout().trim().to_string();
    serve_and_check(&["--http", &url]);
}
