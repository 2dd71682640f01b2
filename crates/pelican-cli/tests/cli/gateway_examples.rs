//! The examples of other languages that call the gateway (`examples/`), run as a
//! newcomer would run them.

use crate::gateway::{worker, Gateway};
use crate::support::Env;
use std::path::Path;
use std::process::Command;

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// `examples/gateway_call.py` (Python, standard library only): a call, the asynchronous
/// form, and an error read from its JSON.
#[test]
fn the_python_caller_runs() {
    let env = Env::new("gw-py");
    let _w = worker(&env, "fail-if:bad", &[]);
    let gw = Gateway::start(&env, &[]);
    let out = Command::new("python3")
        .arg(example("gateway_call.py"))
        .env("PELICAN_GATEWAY", format!("http://{}", gw.addr))
        .env("PELICAN_QUEUE", &env.queue)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "answer: {'n': 12}",
        "served: new",
        "async answer: {'n': 13}",
        "error kind: remote",
    ] {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
}

/// `examples/gateway_call.sh` (curl).
#[test]
fn the_curl_caller_runs() {
    let env = Env::new("gw-sh");
    let _w = worker(&env, "echo", &[]);
    let gw = Gateway::start(&env, &[]);
    let out = Command::new("sh")
        .arg(example("gateway_call.sh"))
        .env("PELICAN_GATEWAY", format!("http://{}", gw.addr))
        .env("PELICAN_QUEUE", &env.queue)
        .output()
        .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains(r#"{"n":12}"#), "{stdout}");
    assert!(stdout.contains("pelican-served: new"), "{stdout}");
}
