//! `pelican bench`: a short run end to end (performance is not asserted), its clean-up,
//! and its refusals.

use crate::support::*;
use pelican_testkit::{free_port, RedisServer};
use std::time::Duration;

/// Processes whose command line mentions `needle` (the bench's workers carry the queue).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

fn bench(server: &RedisServer, args: &[&str]) -> Out {
    let mut cmd = pelican();
    cmd.args(["--redis", &server.url(), "bench"]).args(args);
    run(cmd)
}

#[test]
fn bench_json_checks_every_answer_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let out = bench(
        &server,
        &[
            "--json",
            "--requests",
            "2000",
            "--latency-requests",
            "200",
            "--inflight",
            "100",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim().lines().count(), 1, "one line: {out:?}");
    assert!(
        out.stdout.starts_with(r#"{"system":"pelican","version":""#),
        "{out:?}"
    );
    let v = out.json();
    for field in [
        "throughput_rps",
        "tp_p50_ms",
        "tp_p99_ms",
        "lat_p50_ms",
        "lat_p99_ms",
        "redis_cmds_per_req",
    ] {
        assert!(v[field].as_f64().is_some_and(|x| x > 0.0), "{field}: {v}");
    }
    assert_eq!(v["dedup"], true, "{v}");
    assert_eq!(v["requests"], 2000, "{v}");
    assert_eq!(v["inflight"], 100, "{v}");
    assert_eq!(v["latency_requests"], 200, "{v}");
    assert_eq!(v["workers"], 1, "{v}");
    assert_eq!(v["concurrency"], 64, "{v}");
    assert_eq!(v["payload_bytes"], 64, "{v}");
    // warm-up + throughput + latency, every one checked
    assert_eq!(v["answers_checked"], 1000 + 2000 + 200, "{v}");
    assert_eq!(v["bad_answers"], 0, "{v}");
    for role in ["machine", "producer", "worker", "redis", "other"] {
        assert!(
            v["tp_cpu_pct"].get(role).is_some(),
            "tp_cpu_pct.{role}: {v}"
        );
    }
    for at in ["rss_kb_start", "rss_kb_end"] {
        for role in ["producer", "worker"] {
            assert!(
                v[at][role].as_u64().is_some_and(|kb| kb > 0),
                "{at}.{role}: {v}"
            );
        }
    }
    assert!(
        v["redis_cmds"].as_object().is_some_and(|m| !m.is_empty()),
        "{v}"
    );

    let queue = v["queue"].as_str().expect("queue name").to_string();
    assert!(queue.starts_with("bench-"), "{v}");
    assert_eq!(v["keys_left"], 0, "{v}");
    let left = server.cli(&["--scan", "--pattern", &format!("*{queue}*")]);
    assert!(left.trim().is_empty(), "keys of {queue} left: {left}");
    let workers = processes_mentioning(&queue);
    assert!(
        workers.is_empty(),
        "bench workers still running: {workers:?}"
    );
}

#[test]
fn bench_without_dedup_prints_a_table() {
    let server = RedisServer::start();
    let out = bench(
        &server,
        &[
            "--no-dedup",
            "--requests",
            "500",
            "--inflight",
            "50",
            "--latency-requests",
            "50",
            "--warmup",
            "100",
            "--workers",
            "2",
            "--concurrency",
            "8",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    for want in [
        "dedup off, 2 worker processes x concurrency 8 (prefetch 16)",
        "| throughput |",
        "| latency    |",
        "Redis per request",
        "650 answers checked, all right",
        "none left",
    ] {
        assert!(out.stdout.contains(want), "{want:?} in {}", out.stdout);
    }
    let left = server.cli(&["--scan", "--pattern", "*bench-*"]);
    assert!(left.trim().is_empty(), "keys left: {left}");
}

#[test]
fn bench_refuses_remote_and_missing_servers() {
    let out = run({
        let mut cmd = pelican();
        cmd.args(["--redis", "redis://192.0.2.1:6379", "bench"]);
        cmd
    });
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("loopback"), "{out:?}");

    let url = format!("redis://127.0.0.1:{}", free_port());
    let out = run({
        let mut cmd = pelican();
        cmd.args(["--redis", &url, "bench", "--json"]);
        cmd
    });
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("cannot reach Redis"), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// `--response-bytes`: raw answers of that size, every one checked byte for byte by the
/// producer (a worker answering short would count as a bad answer and fail the run); the
/// structs workloads refuse it with a usage error.
#[test]
fn large_answers_are_checked_and_need_the_raw_codec() {
    let server = RedisServer::start();
    for dedup in [&[][..], &["--no-dedup"][..]] {
        let mut args = vec![
            "--json",
            "--codec",
            "raw",
            "--payload-bytes",
            "100",
            "--response-bytes",
            "100000",
            "--requests",
            "300",
            "--latency-requests",
            "20",
            "--inflight",
            "50",
            "--warmup",
            "30",
        ];
        args.extend_from_slice(dedup);
        let out = bench(&server, &args);
        assert_eq!(out.code, 0, "{out:?}");
        let v = out.json();
        assert_eq!(v["response_bytes"], 100000, "{v}");
        assert_eq!(v["bad_answers"], 0, "{v}");
        assert_eq!(v["answers_checked"], 300 + 20 + 30, "{v}");
    }
    let out = bench(&server, &["--response-bytes", "10"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--codec raw"), "{out:?}");
}

/// 16 MiB bodies end to end (the queue's limit raised by the bench to fit), raw and
/// JSON, and 16 MiB answers (stored answers), dedup on and off: every answer checked,
/// and the producer's and the worker's peak memory stays a small multiple of the bodies
/// in flight (4 x 16 MiB), far from one copy per request.
#[test]
fn sixteen_mib_bodies_and_answers_keep_memory_bounded() {
    let server = RedisServer::start();
    const MIB: u64 = 1 << 20;
    // 24 requests, 4 at a time, every answer checked; peak memory a small multiple of
    // what is in flight (4 x 16 MiB).
    let run = |what: &str, shape: &[&str]| {
        let mut args = vec![
            "--json",
            "--requests",
            "24",
            "--inflight",
            "4",
            "--concurrency",
            "2",
            "--prefetch",
            "4",
            "--warmup",
            "4",
            "--latency-requests",
            "2",
        ];
        args.extend_from_slice(shape);
        // A debug build moves 16 MiB JSON bodies slowly (seconds each on a busy 2-core
        // machine): this test is about memory, so it gets time.
        let mut cmd = pelican();
        cmd.args(["--redis", &server.url(), "bench"]).args(&args);
        let out = Proc::spawn(cmd).wait(Duration::from_secs(240));
        assert_eq!(out.code, 0, "{what}: {out:?}");
        let v = out.json();
        assert_eq!(v["answers_checked"], 24 + 4 + 2, "{what}: {v}");
        assert_eq!(v["bad_answers"], 0, "{what}: {v}");
        let in_flight_kb = 4 * 16 * MIB / 1024;
        for role in ["producer", "worker"] {
            let peak = v["rss_kb_peak"][role].as_u64().expect("peak rss");
            assert!(
                peak < 6 * in_flight_kb,
                "{what}: {role} peaked at {peak} kB, bodies in flight {in_flight_kb} kB: {v}"
            );
        }
        v
    };
    for codec in ["raw", "json"] {
        let v = run(codec, &["--codec", codec, "--payload-bytes", "16777216"]);
        assert_eq!(v["codec"], codec, "{v}");
    }
    // 16 MiB answers to small requests (stored answers), with dedup on (kept for the
    // result ttl, shortened here) and off (deleted once read).
    let answers = [
        "--codec",
        "raw",
        "--payload-bytes",
        "100",
        "--response-bytes",
        "16777216",
        "--result-ttl",
        "2000",
    ];
    run("answers, dedup on", &answers);
    run(
        "answers, dedup off",
        &[&answers[..], &["--no-dedup"]].concat(),
    );
}

/// 100 KB bodies, dedup on and off: the bench's processes keep the memory they free
/// (`malloc.rs`), so the worker takes fresh pages from the kernel only as its memory
/// grows, not again for every body. With glibc's defaults (`GLIBC_TUNABLES` with any malloc
/// setting turns ours off) this run with dedup faulted 132-141 MB in while the worker grew
/// by 2-3 MB; release builds, 3-12 fresh pages per request
/// (docs/benchmarks/2026-12-03-3f1306c-kept-memory.md).
#[test]
fn a_worker_of_100_kb_bodies_takes_fresh_pages_only_as_it_grows() {
    let server = RedisServer::start();
    const REQUESTS: f64 = 3000.0;
    for extra in [&[][..], &["--no-dedup"][..]] {
        let mut args = vec![
            "--json",
            "--codec",
            "raw",
            "--payload-bytes",
            "100000",
            "--requests",
            "3000",
            "--inflight",
            "100",
            "--warmup",
            "500",
            "--latency-requests",
            "0",
        ];
        args.extend_from_slice(extra);
        let out = bench(&server, &args);
        assert_eq!(out.code, 0, "{extra:?}: {out:?}");
        let v = out.json();
        let get = |what: &str, role: &str| {
            v[what][role]
                .as_f64()
                .unwrap_or_else(|| panic!("{extra:?}: no {what} of the {role}: {v}"))
        };
        // Pages of 4 KiB (larger pages only make fewer faults).
        let faulted_kb = get("tp_faults_per_req", "worker") * REQUESTS * 4.0;
        let grown_kb = get("rss_kb_end", "worker") - get("rss_kb_start", "worker");
        assert!(
            faulted_kb - grown_kb < 4096.0,
            "{extra:?}: the worker faulted in {faulted_kb} kB and grew by {grown_kb} kB: {v}"
        );
    }
}
