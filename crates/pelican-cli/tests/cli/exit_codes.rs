//! Exit codes and messages that say what to do.

use crate::support::*;
use pelican_testkit::free_port;

#[test]
fn bad_url_exits_2_with_a_clear_message() {
    for url in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "redis://:notaport",
    ] {
        for sub in [
            &["stats"][..],
            &["call", "{}"],
            &["worker"],
            &["dead", "list"],
            &["demo"],
        ] {
            let out = run({
                let mut c = pelican();
                c.args(["--redis", url]).args(sub);
                c
            });
            assert_eq!(out.code, 2, "{url} {sub:?}: {out:?}");
            assert!(out.stderr.contains("invalid Redis URL"), "{out:?}");
            assert!(out.stderr.contains("redis://"), "{out:?}");
            assert!(out.stderr.contains("--redis"), "says what to do: {out:?}");
        }
    }
    // the environment variable is read too
    let out = run({
        let mut c = pelican();
        c.env("REDIS_URL", "nope://x").arg("stats");
        c
    });
    assert_eq!(out.code, 2, "{out:?}");
}

#[test]
fn bad_queue_name_exits_2_with_a_clear_message() {
    let out = run({
        let mut c = pelican();
        c.args(["--queue", "a{b}", "stats"]);
        c
    });
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("brace"), "{out:?}");
    assert!(out.stderr.contains("--queue"), "{out:?}");
    for (q, why) in [("has space", "use only letters"), ("", "empty")] {
        let out = run({
            let mut c = pelican();
            c.env("PELICAN_QUEUE", q).args(["call", "{}"]);
            c
        });
        assert_eq!(out.code, 2, "{q:?}: {out:?}");
        assert!(out.stderr.contains(why), "{out:?}");
    }
}

#[test]
fn unreachable_redis_exits_1_and_says_how_to_start_one() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    for sub in [
        &["stats"][..],
        &["call", "{}"],
        &["worker"],
        &["dead", "purge"],
        &["demo"],
    ] {
        let out = run({
            let mut c = pelican();
            c.args(["--redis", &url]).args(sub);
            c
        });
        assert_eq!(out.code, 1, "{sub:?}: {out:?}");
        assert!(
            out.stderr
                .contains(&format!("cannot reach Redis at {url}: connection refused")),
            "{out:?}"
        );
        assert!(
            out.stderr
                .contains(&format!("`redis-server --port {port}`")),
            "{out:?}"
        );
        assert!(
            !out.stderr.contains("throwaway"),
            "only for the default URL: {out:?}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "Usage"),
        (&["frobnicate"], "unrecognized subcommand"),
        (&["call"], "JSON"),
        (&["call", "{not json"], "not valid JSON"),
        (&["call", "--timeout", "0", "{}"], "--timeout"),
        (&["worker", "--handler", "explode"], "unknown handler"),
        (&["worker", "--handler", "sleep:soon"], "sleep:MS"),
        (&["worker", "--metrics", "not-an-address"], "--metrics"),
        (&["dead", "requeue"], "ID"),
        (&["dead", "requeue", "--all", "1-0"], "cannot be used with"),
        (&["dead", "requeue", "1-0", "nope"], "not a dead-letter id"),
    ];
    for (args, want) in cases {
        let out = run({
            let mut c = pelican();
            // nothing listens here: none of these may get as far as connecting
            c.args(["--redis", &format!("redis://127.0.0.1:{}", free_port())])
                .args(*args);
            c
        });
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(want),
            "{args:?}: want {want:?} in {out:?}"
        );
    }
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["demo", "--help"],
        &["dead", "--help"],
    ] {
        let out = run({
            let mut c = pelican();
            c.args(args);
            c
        });
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert!(!out.stdout.is_empty());
    }
}

/// A command Redis refuses (here an ACL denial): exit 1, and the message says what
/// pelican was doing and Redis' own words, once.
#[test]
fn a_redis_refusal_exits_1_with_its_cause_once() {
    let env = Env::new("refused");
    let out = env.server.cli(&[
        "ACL", "SETUSER", "limited", "on", ">s3cret", "~*", "+@all", "-fcall",
    ]);
    assert_eq!(out.trim(), "OK");
    let url = format!("redis://limited:s3cret@127.0.0.1:{}", env.server.port());
    let out = run({
        let mut c = pelican();
        c.args(["--redis", &url, "--queue", &env.queue, "call", "{}"]);
        c
    });
    assert_eq!(out.code, 1, "{out:?}");
    // (the library's log lines say it too; this is the command's own message)
    let said = out
        .stderr
        .lines()
        .find(|l| l.starts_with("pelican: "))
        .unwrap_or_else(|| panic!("no message: {out:?}"));
    assert!(
        said.starts_with("pelican: redis error: submitting requests: NoPerm: "),
        "{said}"
    );
    assert_eq!(
        said.matches("no permissions to run the 'fcall' command")
            .count(),
        1,
        "{said}"
    );
}
