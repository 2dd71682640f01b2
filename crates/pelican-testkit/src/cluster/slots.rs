//! Reshardings: a slot of a [`RedisCluster`] moved to another master with its keys, at
//! once or in two steps (the slot held half moved in between).

use std::thread;
use std::time::{Duration, Instant};

use super::{slot_owner_seen_by, RedisCluster, CLUSTER_OK_TIMEOUT};
use crate::resp::{Reply, RespConn};
use crate::server::RedisServer;

impl RedisCluster {
    /// Moves the slot of `key`, with every key in it, from the master that serves it to
    /// node `to` (another master), as a resharding does: [`begin_slot_move`] then
    /// [`finish_slot_move`] at once. Returns the index of the node it left.
    ///
    /// [`begin_slot_move`]: Self::begin_slot_move
    /// [`finish_slot_move`]: Self::finish_slot_move
    pub fn move_slot_of(&self, key: &str, to: usize) -> usize {
        let moving = self.begin_slot_move(key, to);
        self.finish_slot_move(&moving);
        moving.from
    }

    /// Starts moving the slot of `key` to node `to` (another master): `CLUSTER SETSLOT
    /// ... IMPORTING` on `to`, `MIGRATING` on the master that serves it. Until
    /// [`finish_slot_move`](Self::finish_slot_move), clients get `ASK` for keys the
    /// source does not have and `TRYAGAIN` for commands and scripts over several keys
    /// of the slot when one of them is missing. On a cluster with replicas, `to` must be
    /// one of [`masters`](Self::masters); the replicas follow their masters. Panics with
    /// the reply on failure.
    pub fn begin_slot_move(&self, key: &str, to: usize) -> SlotMove {
        let slot = self.cli(&["CLUSTER", "KEYSLOT", key]);
        let from = self.master_of(key);
        assert_ne!(from, to, "{key} is on node {to} already");
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let id = |node: &RedisServer| {
            node_command(node, &["CLUSTER", "MYID"])
                .text()
                .expect("CLUSTER MYID answers the node's id")
        };
        let (src_id, dst_id) = (id(src), id(dst));
        node_command(dst, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
        node_command(src, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
        SlotMove {
            slot,
            from,
            to,
            to_id: dst_id,
        }
    }

    /// Finishes a [`begin_slot_move`](Self::begin_slot_move): `MIGRATE`s the slot's keys
    /// in batches of 100, then `CLUSTER SETSLOT ... NODE` on the new owner, the old one
    /// and every other master (what `redis-cli --cluster reshard` does), and waits (20 s
    /// deadline) until every node names the new owner as the slot's master.
    pub fn finish_slot_move(&self, moving: &SlotMove) {
        let SlotMove {
            slot,
            from,
            to,
            to_id,
        } = moving;
        let (src, dst) = (&self.nodes[*from], &self.nodes[*to]);
        let port = dst.port().to_string();
        loop {
            let Reply::Array(Some(keys)) =
                node_command(src, &["CLUSTER", "GETKEYSINSLOT", slot, "100"])
            else {
                panic!("CLUSTER GETKEYSINSLOT answers an array");
            };
            if keys.is_empty() {
                break;
            }
            let keys: Vec<String> = keys.iter().filter_map(Reply::text).collect();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            node_command(src, &args);
        }
        node_command(dst, &["CLUSTER", "SETSLOT", slot, "NODE", to_id]);
        node_command(src, &["CLUSTER", "SETSLOT", slot, "NODE", to_id]);
        // Every other master (a replica refuses SETSLOT: it learns from its master).
        for i in self.masters() {
            if i != *from && i != *to {
                node_command(&self.nodes[i], &["CLUSTER", "SETSLOT", slot, "NODE", to_id]);
            }
        }
        let slot: u16 = slot.parse().expect("CLUSTER KEYSLOT answers a number");
        let start = Instant::now();
        while !self
            .live()
            .all(|n| slot_owner_seen_by(&n.probe_addr(), slot) == Some(dst.port()))
        {
            assert!(
                start.elapsed() < CLUSTER_OK_TIMEOUT,
                "the nodes do not all name port {} as the master of slot {slot}",
                dst.port()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A slot being moved between two masters ([`RedisCluster::begin_slot_move`]).
#[derive(Debug)]
pub struct SlotMove {
    slot: String,
    /// The index of the node the slot leaves.
    pub from: usize,
    /// The index of the node it goes to.
    pub to: usize,
    to_id: String,
}

/// Runs one command on `node` (its probe address), panicking with the reply when it is
/// an error.
fn node_command(node: &RedisServer, args: &[&str]) -> Reply {
    let mut c = RespConn::connect(&node.probe_addr(), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connecting to port {}: {e}", node.port()));
    match c.command(args) {
        Ok(Reply::Error(e)) => panic!("{args:?} on port {}: {e}", node.port()),
        Ok(r) => r,
        Err(e) => panic!("{args:?} on port {}: {e}", node.port()),
    }
}
