//! Fault 7, least privilege and transport security: the core scenario (two worker
//! processes, this process as producer, a worker SIGKILLed mid-run, a poison request
//! dead-lettered, `pelican stats` and `pelican dead list`) runs
//!
//! - as an ACL user allowed only the `pelican:*` keys and the commands pelican needs
//!   ([`ACL_RULES`], the line README.md documents), with nothing denied in the ACL log,
//!   while that user cannot touch any other key or run any other command;
//! - over `rediss://`, with a CA made by the `openssl` command at test time and given
//!   to the workers with `--tls-ca` (env `PELICAN_TLS_CA`) and to the producer with
//!   `QueueConfig::with_tls_root_ca_pem`.
//!
//! On a cluster: a partitioned queue as the same user on every node, over
//! `redis+cluster://`, and over `rediss+cluster://` on a cluster whose nodes speak TLS
//! only (`RedisCluster::start_tls`).

use crate::common::*;
use pelican::{Admin, QueueConfig};
use pelican_testkit::{free_port, unique_name, RedisCluster, RedisServer, TestCa};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The rules of the least-privilege user, after `ACL SETUSER <name> on ><password>`.
/// README.md ("Running with least privilege") shows the same line.
pub const ACL_RULES: &str = "resetkeys ~pelican:* resetchannels -@all \
    +ping +fcall +function|load +multi +exec \
    +get +set +getdel +append +del +exists +mget +rename +strlen +getrange +pexpire +pttl +scan \
    +xadd +xack +xdel +xclaim +xpending +xrange +xlen +xtrim +xinfo +xgroup +xread +xreadgroup \
    +client|setname +client|id +client|unblock +client|list";

const N: u64 = 2_000;
const POISON_AT: u64 = 500;
const KILL_AT: u64 = 1_000;

fn poison(i: u64) -> bool {
    i == POISON_AT
}

/// Where the core scenario connects.
struct Target {
    /// What the workers and the producer use.
    url: String,
    /// Extra environment of the workers and `pelican` commands (`PELICAN_TLS_CA`).
    env: Vec<(String, String)>,
    /// The CA for the producer and the admin handle.
    ca: Option<Vec<u8>>,
    /// A plain, privileged URL for the checks afterwards.
    check_url: String,
}

impl Target {
    fn queue(&self, name: &str) -> QueueConfig {
        let mut q = queue_config(&self.url, name);
        if let Some(ca) = &self.ca {
            q = q.with_tls_root_ca_pem(ca.clone());
        }
        q
    }

    fn pelican(&self, queue: &str, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .env_remove("REDIS_URL")
            .env_remove("PELICAN_QUEUE")
            .env_remove("PELICAN_TLS_CA")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["--redis", &self.url, "--queue", queue, "--json"])
            .args(args)
            .output()
            .expect("run pelican")
    }
}

/// The core scenario; returns its summary.
async fn core(fault: &str, t: &Target) -> Summary {
    let queue = unique_name("core");
    let mut spec = WorkerSpec::new(&t.url, &queue)
        .handler("crash-if:poison,sleep:10")
        .concurrency(32)
        .claim_idle(800)
        .max_deliveries(2);
    spec.env = t.env.clone();
    let mut fleet = Fleet::start(spec, 2).await;
    let timeout = Duration::from_secs(60);
    let p = producer(t.queue(&queue), timeout).await;
    let progress = Progress::default();
    let mut load = LoadSpec::new("core", N, 200, timeout);
    load.poison = poison;
    let task = tokio::spawn(drive(p.clone(), load, progress.clone()));
    let started = Instant::now();
    let mut rng = Rng::new(fault);
    let mut killed = false;
    while !task.is_finished() {
        fleet.replace_crashed();
        if !killed && progress.get() >= KILL_AT {
            fleet.kill_one(&mut rng);
            killed = true;
        }
        // polling the fleet and the load's progress
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = task.await.expect("load task");
    let duration = started.elapsed();
    eprintln!("{fault}: {}", report.one_line());
    fleet.replace_crashed();

    // The operator's tools work with the same rights.
    let stats = t.pelican(&queue, &["stats"]);
    assert!(
        stats.status.success(),
        "pelican stats: {}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    if stats["dead_letters"] != 1 {
        let dead = t.pelican(&queue, &["dead", "list"]);
        panic!(
            "expected one dead letter (the poison): {stats}\n{}",
            String::from_utf8_lossy(&dead.stdout)
        );
    }
    let dead = t.pelican(&queue, &["dead", "list"]);
    assert!(
        dead.status.success(),
        "pelican dead list: {}",
        String::from_utf8_lossy(&dead.stderr)
    );
    let admin = Admin::connect(t.queue(&queue)).await.expect("admin");
    let letters = admin.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0].rid.as_deref(),
        report.poison_rids.first().map(String::as_str)
    );

    fleet.stop().await;
    p.shutdown().await.expect("producer shutdown");
    let reruns = fleet.log.lock().unwrap().redelivered;
    let left = assert_only_outcomes_remain(&t.check_url, &queue, true).await;

    assert_eq!(report.ok, N - 1, "{}", report.one_line());
    assert_eq!(report.poison_dead, 1, "{}", report.one_line());
    assert_eq!(report.lost() + report.hung + report.resolved_twice, 0);
    assert!(fleet.kills == 1 && fleet.crashes >= 2);

    let mut s = Summary::new(
        fault,
        "2 workers x 32, handler crash-if:poison,sleep:10, 200 in flight, 1 SIGKILL, 1 poison (max_deliveries 2)",
    );
    s.account(duration, N, &report, 0);
    s.reruns = reruns;
    s.set("cached_outcomes_left", left.outcomes);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_scenario_as_a_least_privilege_acl_user() {
    let _one_at_a_time = serial().await;
    let server = RedisServer::start();
    let setuser = format!("ACL SETUSER pelican on >s3cret {ACL_RULES}");
    let args: Vec<&str> = setuser.split_whitespace().collect();
    assert_eq!(server.cli(&args), "OK");
    let url = format!("redis://pelican:s3cret@127.0.0.1:{}", server.port());
    let t = Target {
        url: url.clone(),
        env: Vec::new(),
        ca: None,
        check_url: server.url(),
    };
    let readme = include_str!("../../../../README.md");
    assert!(
        readme.contains(&format!("ACL SETUSER pelican on >CHANGE-ME {ACL_RULES}\n")),
        "README.md must show the ACL line this test checks"
    );
    let s = core("core scenario as a least-privilege ACL user", &t).await;

    // Nothing pelican did was denied...
    let log = server.cli(&["ACL", "LOG"]);
    assert!(log.is_empty(), "ACL LOG is not empty:\n{log}");
    // ...and the user can do nothing outside its keys and commands.
    let mut c = raw_conn(&url).await.expect("connect as the ACL user");
    let _: () = redis::cmd("SET")
        .arg("pelican:{mine}:ok")
        .arg(1)
        .query_async(&mut c)
        .await
        .expect("its own keys are allowed");
    for cmd in [
        vec!["SET", "other:key", "1"],
        vec!["GET", "other:key"],
        vec!["DEL", "other:key"],
        vec!["XADD", "other:stream", "*", "a", "b"],
        vec!["KEYS", "*"],
        vec!["FLUSHALL"],
        vec!["CONFIG", "GET", "*"],
        vec!["EVAL", "return 1", "0"],
        vec!["SCRIPT", "FLUSH"],
        vec!["FUNCTION", "FLUSH"],
        vec!["FUNCTION", "DELETE", "anything"],
        vec!["SHUTDOWN"],
        vec!["ACL", "WHOAMI"],
        vec!["PUBLISH", "chan", "x"],
    ] {
        let mut rc = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            rc.arg(*a);
        }
        let r: redis::RedisResult<redis::Value> = rc.query_async(&mut c).await;
        let e = r.expect_err(&format!("{cmd:?} must be denied"));
        assert!(
            e.to_string().contains("NOPERM") || e.to_string().contains("permission"),
            "{cmd:?}: {e}"
        );
    }
    // A function of its own cannot reach other keys either.
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg("#!lua name=probe\nredis.register_function('probe', function(keys) return redis.call('GET', keys[1]) end)")
        .query_async(&mut c)
        .await
        .expect("FUNCTION LOAD");
    let r: redis::RedisResult<redis::Value> = redis::cmd("FCALL")
        .arg("probe")
        .arg(1)
        .arg("other:key")
        .query_async(&mut c)
        .await;
    assert!(r.is_err(), "a script read another key: {r:?}");
    assert_eq!(server.cli(&["EXISTS", "other:key"]), "0");
    s.emit();
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_scenario_over_tls_with_a_private_ca() {
    let _one_at_a_time = serial().await;
    let ca = TestCa::new();
    let tls_port = free_port();
    // The plain port stays open for the testkit's readiness probe and for the checks;
    // pelican uses only the TLS port.
    let server = RedisServer::builder()
        .arg("--tls-port")
        .arg(tls_port.to_string())
        .arg("--tls-cert-file")
        .arg(path_str(&ca.path("server.crt")))
        .arg("--tls-key-file")
        .arg(path_str(&ca.path("server.key")))
        .arg("--tls-ca-cert-file")
        .arg(path_str(&ca.path("ca.crt")))
        .arg("--tls-auth-clients")
        .arg("no")
        .start();
    let pem = std::fs::read(ca.path("ca.crt")).unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}");

    // Without the CA the handshake fails, with a clear error.
    let e = match pelican::Producer::<serde_json::Value, serde_json::Value>::connect(
        queue_config(&url, "no-ca"),
        pelican::ProducerConfig::default(),
    )
    .await
    {
        Ok(_) => panic!("a TLS connection without the CA succeeded"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), pelican::ErrorKind::Redis, "{e}");
    let t = Target {
        url,
        env: vec![("PELICAN_TLS_CA".into(), path_str(&ca.path("ca.crt")))],
        ca: Some(pem),
        check_url: server.url(),
    };
    let no_ca = Command::new(BIN)
        .args(["--redis", &t.url, "stats"])
        .env_remove("PELICAN_TLS_CA")
        .output()
        .unwrap();
    assert!(
        !no_ca.status.success(),
        "pelican stats without the CA succeeded"
    );
    let s = core("core scenario over rediss:// (TLS, private CA)", &t).await;
    // The server saw TLS clients only: its TLS port accepted them.
    let info = server.cli(&["INFO", "stats"]);
    assert!(info.contains("total_connections_received"), "{info}");
    s.emit();
}

/// What a cluster needs besides [`ACL_RULES`]: the topology (`CLUSTER SLOTS`), asked by
/// the client library and by the connections that follow a partition's slot. README.md
/// documents it.
pub const ACL_RULES_CLUSTER_EXTRA: &str = "+cluster|slots";

/// The same least-privilege user, created on every node of a 3-master cluster, runs a
/// partitioned queue (workers, a producer, a dead letter, stats): nothing denied on any
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_queue_on_a_cluster_as_a_least_privilege_acl_user() {
    let _one_at_a_time = serial().await;
    let cluster = RedisCluster::start(3);
    let setuser = format!("ACL SETUSER pelican on >s3cret {ACL_RULES} {ACL_RULES_CLUSTER_EXTRA}");
    let args: Vec<&str> = setuser.split_whitespace().collect();
    for node in cluster.nodes() {
        assert_eq!(node.cli(&args), "OK");
    }
    let readme = include_str!("../../../../README.md");
    assert!(
        readme.contains(ACL_RULES_CLUSTER_EXTRA),
        "README.md must say what a cluster needs besides the ACL line"
    );
    let seeds: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+cluster://pelican:s3cret@{}", seeds.join(","));
    let q = QueueConfig::new(url, unique_name("acl-cluster"))
        .with_partitions(6)
        .with_janitor_interval(Duration::from_millis(200));
    let consumer = pelican::Consumer::<serde_json::Value, serde_json::Value>::connect(
        q.clone(),
        pelican::ConsumerConfig::default()
            .with_claim_idle(Duration::from_millis(600))
            .with_max_deliveries(1),
    )
    .await
    .expect("consumer as the ACL user");
    let stop = consumer.stopper();
    let worker = tokio::spawn(consumer.serve(4, |r: serde_json::Value, _| async move {
        if r["poison"] == true {
            Err(pelican::HandlerError::retry("poison"))
        } else {
            Ok(r)
        }
    }));
    let p = pelican::Producer::<serde_json::Value, serde_json::Value>::connect(
        q.clone(),
        pelican::ProducerConfig::default().with_request_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("producer as the ACL user");
    for i in 0..60 {
        let r = p
            .call(&serde_json::json!({ "i": i }))
            .await
            .expect("answered");
        assert_eq!(r["i"], i);
    }
    let dead = p
        .call(&serde_json::json!({ "poison": true }))
        .await
        .unwrap_err();
    assert_eq!(dead.kind(), pelican::ErrorKind::Dead);
    let admin = Admin::connect(q.clone())
        .await
        .expect("admin as the ACL user");
    let st = admin.stats().await.expect("stats as the ACL user");
    assert_eq!(st.dead_letters, 1);
    assert_eq!(st.partitions.len(), 6);
    assert_eq!(admin.dead_letters(10).await.unwrap().len(), 1);
    stop.stop();
    worker.await.unwrap().expect("worker stops cleanly");
    p.shutdown().await.unwrap();
    for node in cluster.nodes() {
        let log = node.cli(&["ACL", "LOG"]);
        assert!(
            log.is_empty(),
            "ACL LOG of node {} is not empty:\n{log}",
            node.port()
        );
    }
}

/// Both at once on a cluster: 3 masters that speak TLS only (plain port 0 on every node;
/// the cluster bus and replication over TLS too, `RedisCluster::start_tls`), the
/// least-privilege user on every node, and a queue with 3 partitions over
/// `rediss+cluster://user:password@...`: a consumer and a producer of the library do 50
/// round trips with dedup on (and 10 duplicates that share their answers),
/// `pelican stats --json` and the admin's stats work over it, nothing is denied on any
/// node. Without the CA the connection fails with an error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_queue_on_a_tls_only_cluster_as_a_least_privilege_acl_user() {
    const REQUESTS: u64 = 50;
    let _one_at_a_time = serial().await;
    let started = Instant::now();
    let ca = TestCa::new();
    let cluster = RedisCluster::start_tls(3, 0, &[], &ca.files());
    let setuser = format!("ACL SETUSER pelican on >s3cret {ACL_RULES} {ACL_RULES_CLUSTER_EXTRA}");
    let args: Vec<&str> = setuser.split_whitespace().collect();
    for node in cluster.nodes() {
        assert_eq!(node.cli(&args), "OK");
        // TLS only: the node has no plain-text port a client could use, and the port
        // the URL names is its TLS port.
        assert_eq!(
            node.cli(&["CONFIG", "GET", "port"]),
            "port\n0",
            "node {} has a plain-text port",
            node.port()
        );
        assert_eq!(
            node.cli(&["CONFIG", "GET", "tls-port"]),
            format!("tls-port\n{}", node.port())
        );
        assert_eq!(
            node.cli(&["CONFIG", "GET", "tls-cluster"]),
            "tls-cluster\nyes"
        );
    }
    let url =
        cluster
            .cluster_url()
            .replacen("rediss+cluster://", "rediss+cluster://pelican:s3cret@", 1);
    assert!(url.starts_with("rediss+cluster://pelican:s3cret@127.0.0.1:"));
    let name = unique_name("tls-cluster");
    let q = QueueConfig::new(url.clone(), name.clone())
        .with_partitions(3)
        .with_tls_root_ca_pem(ca.files().ca_pem());

    // Without the CA the handshake fails, with an error and in bounded time.
    let no_ca = tokio::time::timeout(
        Duration::from_secs(30),
        pelican::Producer::<serde_json::Value, serde_json::Value>::connect(
            QueueConfig::new(url.clone(), name.clone()).with_partitions(3),
            pelican::ProducerConfig::default(),
        ),
    )
    .await
    .expect("connecting without the CA must fail, not hang");
    match no_ca {
        Ok(_) => panic!("a TLS cluster connection without the CA succeeded"),
        Err(e) => assert_eq!(e.kind(), pelican::ErrorKind::Redis, "{e}"),
    }

    let consumer = pelican::Consumer::<serde_json::Value, serde_json::Value>::connect(
        q.clone(),
        pelican::ConsumerConfig::default(),
    )
    .await
    .expect("consumer over rediss+cluster:// as the ACL user");
    let stop = consumer.stopper();
    let worker = tokio::spawn(consumer.serve(8, |r: serde_json::Value, _| async move {
        Ok(serde_json::json!({ "echo": r }))
    }));
    let p = pelican::Producer::<serde_json::Value, serde_json::Value>::connect(
        q.clone(),
        pelican::ProducerConfig::default()
            .with_dedup(true)
            .with_request_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("producer over rediss+cluster:// as the ACL user");
    // 50 distinct requests and 10 duplicates of the first ones, all in flight at once;
    // every fifth one is large enough to be stored beside the stream (MGET, RENAME).
    let calls = (0..REQUESTS).chain(0..10).map(|i| {
        let p = p.clone();
        async move {
            let pad = if i % 5 == 0 {
                "x".repeat(20_000)
            } else {
                String::new()
            };
            let body = serde_json::json!({ "i": i, "pad": pad });
            let r = p.call(&body).await;
            (body, r)
        }
    });
    for (body, r) in futures_util::future::join_all(calls).await {
        let r = r.unwrap_or_else(|e| panic!("{body} not answered: {e}"));
        assert_eq!(r["echo"], body);
    }

    let admin = Admin::connect(q.clone())
        .await
        .expect("admin over rediss+cluster:// as the ACL user");
    let st = admin.stats().await.expect("stats as the ACL user");
    assert_eq!(st.partitions.len(), 3);
    assert_eq!(
        st.entries_added, REQUESTS,
        "dedup: one entry per distinct request"
    );
    assert!(
        st.partitions.iter().all(|p| p.entries_added > 0),
        "every partition got requests: {:?}",
        st.partitions
            .iter()
            .map(|p| p.entries_added)
            .collect::<Vec<_>>()
    );
    assert_eq!(st.dead_letters, 0);

    // The operator's command, with the CA from PELICAN_TLS_CA.
    let out = Command::new(BIN)
        .env_remove("REDIS_URL")
        .env_remove("PELICAN_QUEUE")
        .env("PELICAN_TLS_CA", path_str(&ca.files().ca_cert))
        .args([
            "--redis",
            &url,
            "--queue",
            &name,
            "--partitions",
            "3",
            "--json",
        ])
        .arg("stats")
        .output()
        .expect("run pelican");
    assert!(
        out.status.success(),
        "pelican stats over rediss+cluster://: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert_eq!(stats["entries_added"], REQUESTS, "{stats}");
    assert_eq!(
        stats["partitions"].as_array().map(Vec::len),
        Some(3),
        "{stats}"
    );

    stop.stop();
    worker.await.unwrap().expect("worker stops cleanly");
    p.shutdown().await.expect("producer shutdown");
    for node in cluster.nodes() {
        let log = node.cli(&["ACL", "LOG"]);
        assert!(
            log.is_empty(),
            "ACL LOG of node {} is not empty:\n{log}",
            node.port()
        );
    }
    eprintln!(
        "TLS-only cluster, P = 3, {} round trips: {:?}",
        REQUESTS + 10,
        started.elapsed()
    );
}
