//! `pelican dashboard`: the JSON API and its rules (`api`), and the page in a real
//! headless Chromium (`browser`, driven over the DevTools protocol by `cdp`).

mod api;
mod browser;
mod cdp;
mod hostile;
pub mod http;

use crate::support::{pelican, Env, Proc};
use pelican_testkit::{eventually_sync, free_port, unique_name, RedisCluster};
use std::process::Command;
use std::time::Duration;

/// Generous: the machine is shared with other builds.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running `pelican dashboard` on a free loopback port.
pub struct Dashboard {
    pub proc: Proc,
    pub addr: String,
    /// The token of the printed login link (none when read-only).
    pub token: Option<String>,
}

impl Dashboard {
    /// Starts `pelican dashboard --listen 127.0.0.1:PORT extra...` on `env`'s server and
    /// waits until it answers.
    pub fn start(env: &Env, extra: &[&str]) -> Dashboard {
        Dashboard::start_with(|args| env.spawn(args), extra)
    }

    /// Starts `pelican ... dashboard --listen 127.0.0.1:PORT extra...` with `spawn`
    /// (which adds the global options) and waits until it answers.
    pub fn start_with(spawn: impl FnOnce(&[&str]) -> Proc, extra: &[&str]) -> Dashboard {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["dashboard", "--listen", &addr];
        args.extend_from_slice(extra);
        let proc = spawn(&args);
        eventually_sync(DEADLINE, "the dashboard to announce itself", || {
            proc.stdout().contains("stop with Ctrl-C")
        });
        let out = proc.stdout();
        assert!(out.contains(&format!("at http://{addr}/")), "{out}");
        let token = out
            .split("/login?token=")
            .nth(1)
            .map(|rest| rest.split_whitespace().next().unwrap().to_string());
        eventually_sync(DEADLINE, "the dashboard to answer", || {
            http::get(&addr, "/api/info").status == 200
        });
        Dashboard { proc, addr, token }
    }

    /// `http://ADDR/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Waits until `/api/queues` lists `queue`; returns its entry.
    pub fn wait_for_queue(&self, queue: &str) -> serde_json::Value {
        let mut found = serde_json::Value::Null;
        eventually_sync(DEADLINE, &format!("queue {queue} on the dashboard"), || {
            let a = http::get(&self.addr, "/api/queues");
            if let Some(q) = a.json()["queues"]
                .as_array()
                .and_then(|qs| qs.iter().find(|q| q["name"] == queue))
            {
                found = q.clone();
                true
            } else {
                false
            }
        });
        found
    }
}

/// A 3-master Redis Cluster and a queue of [`ClusterQueue::PARTITIONS`] partitions on it.
pub struct ClusterQueue {
    pub cluster: RedisCluster,
    pub queue: pelican::QueueConfig,
}

impl ClusterQueue {
    pub const PARTITIONS: u32 = 3;

    pub fn start(name: &str) -> ClusterQueue {
        let cluster = RedisCluster::start(3);
        let queue = pelican::QueueConfig::new(cluster.cluster_url(), unique_name(name))
            .with_partitions(Self::PARTITIONS);
        ClusterQueue { cluster, queue }
    }

    /// `pelican --redis CLUSTER-URL --queue Q args...` with the queue's partition count.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = pelican();
        cmd.args(["--redis", &self.queue.url, "--queue", &self.queue.name])
            .env("PELICAN_PARTITIONS", Self::PARTITIONS.to_string())
            .args(args);
        cmd
    }

    pub fn spawn(&self, args: &[&str]) -> Proc {
        Proc::spawn(self.cmd(args))
    }

    /// `pelican --redis CLUSTER-URL dashboard ...` (no queue, no partition count: it
    /// finds both), started and answering.
    pub fn start_dashboard(&self, extra: &[&str]) -> Dashboard {
        Dashboard::start_with(
            |args| {
                let mut cmd = pelican();
                cmd.args(["--redis", &self.queue.url]).args(args);
                Proc::spawn(cmd)
            },
            extra,
        )
    }

    /// A connection routed by key.
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.cluster.urls())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Puts a dead letter into partition `p`'s dead-letter stream, as [`bury`] does;
    /// returns its id as the dashboard lists it (`p/<stream id>`).
    pub fn bury(&self, p: u32, rid: &str, body: &str) -> String {
        let keys = self.queue.partition_keys(p);
        let id = add_dead_letter(&mut self.conn(), &keys, rid, body);
        format!("{p}/{id}")
    }

    /// `XLEN` of partition `p`'s dead letters.
    pub fn dead_letters(&self, p: u32) -> u64 {
        redis::cmd("XLEN")
            .arg(self.queue.partition_keys(p).dead())
            .query(&mut self.conn())
            .unwrap()
    }

    /// A request id that lands in partition `p`.
    pub fn id_in(&self, p: u32, tag: &str) -> String {
        (0..)
            .map(|i| format!("{tag}-{i}"))
            .find(|id| self.queue.partition_of(id) == p)
            .expect("some id lands in every partition")
    }
}

/// Puts a dead letter straight into `queue`'s dead-letter stream, as a consumer would
/// have (reason, deliveries, last consumer, the original fields); returns its id.
pub fn bury(env: &Env, queue_keys: &pelican::admin::Keys, rid: &str, body: &str) -> String {
    let mut c = redis::Client::open(env.server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    add_dead_letter(&mut c, queue_keys, rid, body)
}

fn add_dead_letter(
    c: &mut impl redis::ConnectionLike,
    queue_keys: &pelican::admin::Keys,
    rid: &str,
    body: &str,
) -> String {
    redis::cmd("XADD")
        .arg(queue_keys.dead())
        .arg("*")
        .arg("entry")
        .arg("1-1")
        .arg("reason")
        .arg("handler crashed 3 times (test poison)")
        .arg("deliveries")
        .arg(3)
        .arg("consumer")
        .arg("worker-a")
        .arg("dead_at")
        .arg(now_ms() - 90_000)
        .arg("rid")
        .arg(rid)
        .arg("from")
        .arg("")
        .arg("index")
        .arg("0")
        .arg("body")
        .arg(body)
        .query(c)
        .unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `XLEN` of a key.
pub fn xlen(env: &Env, key: &str) -> u64 {
    let mut c = redis::Client::open(env.server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("XLEN").arg(key).query(&mut c).unwrap()
}
