//! A Redis Cluster of master-only nodes.

use std::io;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::RespConn;
use crate::server::{binary_missing, run_cli, RedisServer};

/// How long the cluster may take to report `cluster_state:ok` on every node.
const CLUSTER_OK_TIMEOUT: Duration = Duration::from_secs(20);

/// A Redis Cluster of `masters` master nodes (no replicas) on loopback, every node
/// killed on Drop.
///
/// Each node is a [`RedisServer`] started with `--cluster-enabled yes
/// --cluster-config-file nodes.conf` in its own directory; the slots are assigned
/// with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create` requires),
    /// creates the cluster and waits (20 s deadline) until `CLUSTER INFO` says
    /// `cluster_state:ok` on every node. Panics with details on failure.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::builder()
                    .arg("--cluster-enabled")
                    .arg("yes")
                    .arg("--cluster-config-file")
                    .arg("nodes.conf")
                    .start()
            })
            .collect();
        let cluster = RedisCluster { nodes };
        cluster.create();
        cluster.wait_ok();
        cluster
    }

    fn create(&self) {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for port in self.ports() {
            cmd.arg(format!("127.0.0.1:{port}"));
        }
        cmd.arg("--cluster-replicas")
            .arg("0")
            .arg("--cluster-yes")
            .stdin(Stdio::null());
        let output = match cmd.output() {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => binary_missing("redis-cli"),
            Err(e) => panic!("cannot run redis-cli --cluster create: {e}"),
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() || !stdout.contains("All 16384 slots covered") {
            panic!(
                "`redis-cli --cluster create` on ports {:?} failed ({}):\nstdout: {}\nstderr: {}",
                self.ports(),
                output.status,
                stdout,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    fn wait_ok(&self) {
        let start = Instant::now();
        for node in &self.nodes {
            loop {
                let last = match cluster_info(node.port()) {
                    Ok(info) if info.lines().any(|l| l.trim() == "cluster_state:ok") => break,
                    Ok(info) => info,
                    Err(e) => e,
                };
                if start.elapsed() >= CLUSTER_OK_TIMEOUT {
                    panic!(
                        "cluster on ports {:?} not ok after {:?}; node {} says:\n{last}",
                        self.ports(),
                        start.elapsed(),
                        node.port()
                    );
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// `"redis://127.0.0.1:PORT"` of every node, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The port of every node, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The nodes, in start order (e.g. to [`kill`](RedisServer::kill) one of them).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to the nodes (for [`RedisServer::kill`] / [`RedisServer::restart`]).
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Runs `redis-cli -c -h 127.0.0.1 -p FIRST_NODE_PORT args...` (cluster mode:
    /// follows MOVED/ASK redirects) and returns stdout trimmed; panics like
    /// [`RedisServer::cli`].
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push("-c");
        all.extend_from_slice(args);
        run_cli(self.nodes[0].port(), &all)
    }
}

fn cluster_info(port: u16) -> Result<String, String> {
    let mut conn =
        RespConn::connect(port, Duration::from_millis(500)).map_err(|e| format!("connect: {e}"))?;
    let reply = conn
        .command(&["CLUSTER", "INFO"])
        .map_err(|e| format!("CLUSTER INFO: {e}"))?;
    reply
        .text()
        .ok_or_else(|| format!("CLUSTER INFO answered {reply:?}"))
}
