//! A Redis Cluster on loopback: masters only, or masters with replicas that take over
//! when their master is killed.

use std::io;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Addr, Reply, RespConn};
use crate::server::{binary_missing, cli_tls_args, run_cli, RedisServer};
use crate::tls::TlsFiles;

mod slots;
pub use slots::SlotMove;

/// How long the cluster may take to report `cluster_state:ok` on every node.
const CLUSTER_OK_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `redis-cli --cluster create` may take (it waits for the nodes to meet on the
/// cluster bus, with no deadline of its own).
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a replica may take to be promoted after its master died.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// `cluster-node-timeout` of clusters with replicas: how long a master may be silent
/// before its replica takes over. Short, so a failover test is quick.
const NODE_TIMEOUT_MS: &str = "1000";

/// A Redis Cluster of `masters` master nodes (no replicas) on loopback, every node
/// killed on Drop.
///
/// Each node is a [`RedisServer`] started with `--cluster-enabled yes
/// --cluster-config-file nodes.conf` in its own directory; the slots are assigned
/// with `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    replicas: usize,
    /// Nodes SIGSTOPped by [`pause_master_of`](Self::pause_master_of) and not resumed
    /// yet: left out of every probe (they would not answer).
    paused: Vec<usize>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create` requires),
    /// creates the cluster and waits (20 s deadline) until `CLUSTER INFO` says
    /// `cluster_state:ok` on every node. Panics with details on failure.
    pub fn start(masters: usize) -> RedisCluster {
        RedisCluster::start_with(masters, 0, &[])
    }

    /// Starts `masters` masters with `replicas` replicas each, every node also given
    /// `args` (e.g. `["--appendonly", "yes", "--appendfsync", "always"]`), and waits until
    /// the cluster is ok and every replica's link to its master is up. Replicas sync
    /// without delay (`repl-diskless-sync-delay 0`: else a master killed in the first
    /// seconds has no replica to promote) and a silent master is failed over after
    /// `cluster-node-timeout` 1 s.
    pub fn start_with(masters: usize, replicas: usize, args: &[&str]) -> RedisCluster {
        RedisCluster::start_inner(masters, replicas, args, None)
    }

    /// Like [`start_with`](Self::start_with), but every node speaks TLS only: each is a
    /// [`RedisServerBuilder::tls`](crate::RedisServerBuilder::tls) server (a TLS port,
    /// plain port 0) with `--tls-cluster yes --tls-replication yes`, so the cluster bus
    /// and replication use TLS too and `CLUSTER SLOTS` names the TLS ports. The cluster
    /// is created over TLS (`redis-cli --tls --cluster create`) and the readiness checks
    /// go through each node's Unix socket. [`cluster_url`](Self::cluster_url) is then a
    /// `rediss+cluster://` URL; clients must trust `tls.ca_cert`.
    ///
    /// The nodes present `tls.cert` to each other as a client certificate, so it needs
    /// extended key usage `clientAuth` as well as `serverAuth` (as [`crate::TestCa`]'s
    /// has); the server binary needs TLS support.
    pub fn start_tls(
        masters: usize,
        replicas: usize,
        args: &[&str],
        tls: &TlsFiles,
    ) -> RedisCluster {
        RedisCluster::start_inner(masters, replicas, args, Some(tls))
    }

    fn start_inner(
        masters: usize,
        replicas: usize,
        args: &[&str],
        tls: Option<&TlsFiles>,
    ) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let mut b = RedisServer::builder()
                    .arg("--cluster-enabled")
                    .arg("yes")
                    .arg("--cluster-config-file")
                    .arg("nodes.conf");
                if replicas > 0 {
                    b = b
                        .arg("--cluster-node-timeout")
                        .arg(NODE_TIMEOUT_MS)
                        .arg("--repl-diskless-sync-delay")
                        .arg("0")
                        .arg("--cluster-replica-validity-factor")
                        .arg("0");
                }
                if let Some(tls) = tls {
                    b = b
                        .tls(tls)
                        .arg("--tls-cluster")
                        .arg("yes")
                        .arg("--tls-replication")
                        .arg("yes");
                }
                for a in args {
                    b = b.arg(*a);
                }
                b.start()
            })
            .collect();
        let cluster = RedisCluster {
            nodes,
            replicas,
            paused: Vec::new(),
        };
        cluster.create();
        cluster.wait_ok();
        if replicas > 0 {
            cluster.wait_replicas_linked();
        }
        cluster
    }

    /// `redis+cluster://127.0.0.1:PORT,...`: every node as a seed
    /// (`rediss+cluster://` for a cluster started with [`start_tls`](Self::start_tls)).
    pub fn cluster_url(&self) -> String {
        let seeds: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls().is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", seeds.join(","))
    }

    /// The certificate files of a cluster started with [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.nodes.first().and_then(RedisServer::tls)
    }

    /// The index (in [`RedisCluster::nodes`]) of the master that serves `key` now.
    pub fn master_of(&self, key: &str) -> usize {
        let slot: u16 = self
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        let port = self.master_port_of_slot(slot);
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("the master is one of the nodes")
    }

    fn master_port_of_slot(&self, slot: u16) -> u16 {
        self.live()
            .find_map(|n| slot_owner_seen_by(&n.probe_addr(), slot))
            .unwrap_or_else(|| {
                panic!("no running node of the cluster knows who serves slot {slot}")
            })
    }

    /// The running nodes that answer (not paused), in start order.
    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| n.is_running() && !self.paused.contains(i))
            .map(|(_, n)| n)
    }

    /// SIGKILLs the master that serves `key` and waits (30 s deadline) until one of its
    /// replicas has taken over, every running node names it as the key's master and
    /// says `cluster_state:ok`. Returns
    /// the index of the killed node. Needs a cluster started with replicas.
    pub fn kill_master_of(&mut self, key: &str) -> usize {
        assert!(
            self.replicas > 0,
            "a failover needs a cluster with replicas"
        );
        let victim = self.master_of(key);
        let old_port = self.nodes[victim].port();
        self.nodes[victim].kill();
        self.wait_taken_over(key, old_port);
        victim
    }

    /// SIGSTOPs the master that serves `key` (the process freezes: its clients' commands
    /// wait in its sockets) and waits (30 s deadline) until one of its replicas has
    /// taken over, as for [`kill_master_of`](Self::kill_master_of): after
    /// `cluster-node-timeout`. Returns the index of the paused node, to give to
    /// [`resume`](Self::resume). Needs a cluster started with replicas.
    pub fn pause_master_of(&mut self, key: &str) -> usize {
        assert!(
            self.replicas > 0,
            "a failover needs a cluster with replicas"
        );
        let victim = self.master_of(key);
        let old_port = self.nodes[victim].port();
        assert!(
            signal(self.nodes[victim].pid(), "STOP"),
            "cannot SIGSTOP the node on port {old_port}"
        );
        self.paused.push(victim);
        self.wait_taken_over(key, old_port);
        victim
    }

    /// SIGCONTs node `node` (paused by [`pause_master_of`](Self::pause_master_of)) and
    /// waits (30 s deadline) until it has rejoined as a replica with its link up. What
    /// it acknowledged on its own once it ran again, before it learned it had been
    /// replaced, is dropped when it resyncs from the new master.
    pub fn resume(&mut self, node: usize) {
        assert!(
            self.paused.contains(&node),
            "node {node} was not paused by pause_master_of"
        );
        assert!(
            signal(self.nodes[node].pid(), "CONT"),
            "cannot SIGCONT the node on port {}",
            self.nodes[node].port()
        );
        self.paused.retain(|&n| n != node);
        self.wait_replica_linked(node);
    }

    /// Restarts node `node` (a master killed by [`kill_master_of`](Self::kill_master_of))
    /// with its data and `nodes.conf`, and waits (30 s deadline) until it has rejoined as
    /// a replica of the master that took over, with its link up.
    pub fn restart_as_replica(&mut self, node: usize) {
        self.nodes[node].restart();
        self.wait_replica_linked(node);
    }

    /// The indexes of the running masters that serve slots, in start order.
    pub fn masters(&self) -> Vec<usize> {
        let mut ports: Vec<u16> = Vec::new();
        if let Some(n) = self.live().next() {
            if let Ok(mut c) = RespConn::connect(&n.probe_addr(), Duration::from_millis(500)) {
                if let Ok(Reply::Array(Some(ranges))) = c.command(&["CLUSTER", "SLOTS"]) {
                    for r in ranges {
                        if let Reply::Array(Some(parts)) = r {
                            if let Some(Reply::Array(Some(m))) = parts.get(2) {
                                if let Some(Reply::Int(port)) = m.get(1) {
                                    ports.push(*port as u16);
                                }
                            }
                        }
                    }
                }
            }
        }
        (0..self.nodes.len())
            .filter(|&i| !self.paused.contains(&i) && self.nodes[i].is_running())
            .filter(|&i| ports.contains(&self.nodes[i].port()))
            .collect()
    }

    fn wait_replica_linked(&self, node: usize) {
        let n = &self.nodes[node];
        let start = Instant::now();
        loop {
            let info = RespConn::connect(&n.probe_addr(), Duration::from_millis(500))
                .and_then(|mut c| c.command(&["INFO", "replication"]))
                .ok()
                .and_then(|r| r.text())
                .unwrap_or_default();
            if info.lines().any(|l| l.trim() == "role:slave")
                && info.lines().any(|l| l.trim() == "master_link_status:up")
            {
                return;
            }
            if start.elapsed() >= FAILOVER_TIMEOUT {
                panic!(
                    "node on port {} did not rejoin as a linked replica within {FAILOVER_TIMEOUT:?}:\n{info}",
                    n.port()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every live node names a master other than `old_port` for `key`'s
    /// slot, the same one, and says `cluster_state:ok`.
    fn wait_taken_over(&self, key: &str, old_port: u16) {
        let start = Instant::now();
        loop {
            let slot: u16 = self
                .cli(&["CLUSTER", "KEYSLOT", key])
                .parse()
                .expect("CLUSTER KEYSLOT answers a number");
            // Every running node must name the same new master: a node that still names
            // the dead one would send clients there (redis-cli -c would follow its MOVED
            // to a closed port).
            let seen: Vec<Option<u16>> = self
                .live()
                .map(|n| slot_owner_seen_by(&n.probe_addr(), slot))
                .collect();
            let promoted = seen
                .first()
                .copied()
                .flatten()
                .filter(|&p| p != old_port && seen.iter().all(|s| *s == Some(p)));
            let all_ok = self.live().all(|n| {
                cluster_info(&n.probe_addr())
                    .is_ok_and(|i| i.lines().any(|l| l.trim() == "cluster_state:ok"))
            });
            if promoted.is_some() && all_ok {
                return;
            }
            if start.elapsed() >= FAILOVER_TIMEOUT {
                panic!(
                    "no replica took over from the master on port {old_port} within {FAILOVER_TIMEOUT:?}"
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The indexes (in [`RedisCluster::nodes`]) of the replicas of node `master`.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let port = self.nodes[master].port();
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| n.is_running() && !self.paused.contains(i))
            .filter(|(_, n)| {
                RespConn::connect(&n.probe_addr(), Duration::from_millis(500))
                    .and_then(|mut c| c.command(&["INFO", "replication"]))
                    .ok()
                    .and_then(|r| r.text())
                    .is_some_and(|i| {
                        i.lines().any(|l| l.trim() == "role:slave")
                            && i.lines().any(|l| l.trim() == format!("master_port:{port}"))
                    })
            })
            .map(|(i, _)| i)
            .collect()
    }

    fn wait_replicas_linked(&self) {
        let start = Instant::now();
        for node in &self.nodes {
            loop {
                let info = RespConn::connect(&node.probe_addr(), Duration::from_millis(500))
                    .and_then(|mut c| c.command(&["INFO", "replication"]))
                    .ok()
                    .and_then(|r| r.text())
                    .unwrap_or_default();
                let master = info.lines().any(|l| l.trim() == "role:master");
                let linked = info.lines().any(|l| l.trim() == "master_link_status:up");
                // A master is ready once it has its replicas attached.
                let replicas_attached = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n >= self.replicas);
                if (master && replicas_attached) || (!master && linked) {
                    break;
                }
                if start.elapsed() >= CLUSTER_OK_TIMEOUT {
                    let nodes = RespConn::connect(&node.probe_addr(), Duration::from_millis(500))
                        .and_then(|mut c| c.command(&["CLUSTER", "NODES"]))
                        .ok()
                        .and_then(|r| r.text())
                        .unwrap_or_default();
                    panic!(
                        "node {} of the cluster on ports {:?}: replication not up after {:?}:\n{info}\n{nodes}",
                        node.port(),
                        self.ports(),
                        start.elapsed()
                    );
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// `redis-cli --cluster create` (over TLS for a TLS cluster), killed with a clear
    /// message when it has not finished within [`CREATE_TIMEOUT`]: it waits for the nodes
    /// to meet with no deadline of its own, so nodes that cannot talk on the cluster bus
    /// (e.g. a certificate the nodes refuse as a client certificate) would hang it.
    fn create(&self) {
        let mut cmd = Command::new("redis-cli");
        cmd.args(cli_tls_args(self.tls()));
        cmd.arg("--cluster").arg("create");
        for port in self.ports() {
            cmd.arg(format!("127.0.0.1:{port}"));
        }
        cmd.arg("--cluster-replicas")
            .arg(self.replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => binary_missing("redis-cli"),
            Err(e) => panic!("cannot run redis-cli --cluster create: {e}"),
        };
        // Drained by threads, so a chatty redis-cli never blocks on a full pipe.
        let drain = |r: Option<Box<dyn io::Read + Send>>| {
            thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
        let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if start.elapsed() >= CREATE_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("cannot wait for redis-cli --cluster create: {e}"),
            }
        };
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let Some(status) = status else {
            panic!(
                "`redis-cli --cluster create` on ports {:?} did not finish within {CREATE_TIMEOUT:?}: \
                 the nodes did not meet on the cluster bus{}\nstdout: {stdout}\nstderr: {stderr}",
                self.ports(),
                if self.tls().is_some() {
                    " (with --tls-cluster, every node must accept the others' certificate \
                     as a client certificate: extended key usage clientAuth)"
                } else {
                    ""
                }
            );
        };
        if !status.success() || !stdout.contains("All 16384 slots covered") {
            panic!(
                "`redis-cli --cluster create` on ports {:?} failed ({status}):\nstdout: {stdout}\nstderr: {stderr}",
                self.ports(),
            );
        }
    }

    fn wait_ok(&self) {
        let start = Instant::now();
        for node in &self.nodes {
            loop {
                let last = match cluster_info(&node.probe_addr()) {
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

    /// Runs `redis-cli -c -h 127.0.0.1 -p PORT args...` on the first running node
    /// (cluster mode: follows MOVED/ASK redirects) and returns stdout trimmed; panics
    /// like [`RedisServer::cli`].
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push("-c");
        all.extend_from_slice(args);
        let node = self.live().next().expect("a running node");
        run_cli(node.port(), node.tls(), &all)
    }
}

/// Sends signal `sig` (`STOP`, `CONT`) to process `pid` with `kill -s`; false when it
/// failed.
fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args(["-s", sig])
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// The port of the master that serves `slot`, as the node at `addr` sees it.
fn slot_owner_seen_by(addr: &Addr, slot: u16) -> Option<u16> {
    let mut conn = RespConn::connect(addr, Duration::from_millis(500)).ok()?;
    let Ok(Reply::Array(Some(ranges))) = conn.command(&["CLUSTER", "SLOTS"]) else {
        return None;
    };
    for r in ranges {
        let Reply::Array(Some(parts)) = r else {
            continue;
        };
        if let (Some(Reply::Int(lo)), Some(Reply::Int(hi)), Some(Reply::Array(Some(m)))) =
            (parts.first(), parts.get(1), parts.get(2))
        {
            if (*lo..=*hi).contains(&i64::from(slot)) {
                if let Some(Reply::Int(port)) = m.get(1) {
                    return Some(*port as u16);
                }
            }
        }
    }
    None
}

fn cluster_info(addr: &Addr) -> Result<String, String> {
    let mut conn =
        RespConn::connect(addr, Duration::from_millis(500)).map_err(|e| format!("connect: {e}"))?;
    let reply = conn
        .command(&["CLUSTER", "INFO"])
        .map_err(|e| format!("CLUSTER INFO: {e}"))?;
    reply
        .text()
        .ok_or_else(|| format!("CLUSTER INFO answered {reply:?}"))
}
