//! Tests for `RedisCluster`.

use std::time::Instant;

use pelican_testkit::{RedisCluster, TestCa};

#[test]
fn three_masters_reach_ok_and_serve_a_hash_tag() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3);
    eprintln!("cluster ready in {:?}", started.elapsed());

    assert_eq!(cluster.ports().len(), 3);
    assert_eq!(
        cluster.urls(),
        cluster
            .ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
    );
    for node in cluster.nodes() {
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_known_nodes:3"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }

    // Same hash tag => same slot, so multi-key commands work; -c follows MOVED.
    assert_eq!(cluster.cli(&["SET", "{pelican}:a", "1"]), "OK");
    assert_eq!(
        cluster.cli(&["MSET", "{pelican}:b", "2", "{pelican}:c", "3"]),
        "OK"
    );
    assert_eq!(
        cluster.cli(&["MGET", "{pelican}:a", "{pelican}:b", "{pelican}:c"]),
        "1\n2\n3"
    );
    // Reachable through every node (redirects for two of them).
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["-c", "GET", "{pelican}:a"]), "1");
    }
    // Different slots are refused for multi-key commands.
    assert!(cluster
        .cli(&["MSET", "a", "1", "b", "2"])
        .contains("CROSSSLOT"));
}

#[test]
fn a_replica_takes_over_from_a_killed_master() {
    let mut cluster = RedisCluster::start_with(3, 1, &["--appendonly", "yes"]);
    assert_eq!(cluster.nodes().len(), 6);
    assert!(cluster
        .cluster_url()
        .starts_with("redis+cluster://127.0.0.1:"));
    // The write and its WAIT on one connection to the key's master: WAIT waits for the
    // replicas to acknowledge the writes of its own connection (on another connection,
    // or another node, it answers at once, and the kill could outrun the replication).
    let mut on_master = cluster.nodes()[cluster.master_of("{k}x")].sync_connection();
    let _: () = redis::cmd("SET")
        .arg("{k}x")
        .arg("1")
        .query(&mut on_master)
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut on_master)
        .unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the write");
    drop(on_master);
    let victim = cluster.kill_master_of("{k}x");
    assert!(!cluster.nodes()[victim].is_running());
    let heir = cluster.master_of("{k}x");
    assert_ne!(heir, victim);
    // The replica had the write: it acknowledged it before the kill.
    assert_eq!(cluster.cli(&["GET", "{k}x"]), "1");
}

#[test]
fn a_tls_only_cluster_forms_and_names_its_tls_ports() {
    let ca = TestCa::new();
    let started = Instant::now();
    let cluster = RedisCluster::start_tls(3, 0, &[], &ca.files());
    eprintln!("TLS cluster ready in {:?}", started.elapsed());

    let seeds: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    assert_eq!(
        cluster.cluster_url(),
        format!("rediss+cluster://{}", seeds.join(","))
    );
    assert_eq!(cluster.tls(), Some(&ca.files()));
    for node in cluster.nodes() {
        assert!(node.url().starts_with("rediss://127.0.0.1:"));
        // No plain-text port: the port is the TLS one.
        assert_eq!(node.cli(&["CONFIG", "GET", "port"]), "port\n0");
        assert_eq!(
            node.cli(&["CONFIG", "GET", "tls-port"]),
            format!("tls-port\n{}", node.port())
        );
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        // CLUSTER SLOTS (asked over TLS) names the TLS ports only.
        let slots = node.cli(&["CLUSTER", "SLOTS"]);
        for p in cluster.ports() {
            assert!(slots.contains(&format!("\n{p}\n")), "{p} in {slots}");
        }
    }
    // -c follows MOVED over TLS; master_of reads the topology through the Unix sockets.
    assert_eq!(cluster.cli(&["SET", "{pelican}:a", "1"]), "OK");
    assert_eq!(cluster.cli(&["GET", "{pelican}:a"]), "1");
    let owner = cluster.master_of("{pelican}:a");
    assert_eq!(cluster.nodes()[owner].cli(&["GET", "{pelican}:a"]), "1");
}
