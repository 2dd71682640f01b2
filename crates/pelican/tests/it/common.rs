//! Helpers shared by the integration tests.

#![allow(dead_code)]

use pelican::{ConsumerConfig, ProducerConfig, QueueConfig};
use pelican_testkit::{unique_name, RedisServer};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The request type of most tests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Req {
    pub i: u64,
    #[serde(default)]
    pub tag: String,
}

/// The response type of most tests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Resp {
    pub i: u64,
    pub by: String,
}

/// A queue config with short timings for tests.
pub fn queue(server: &RedisServer, name: &str) -> QueueConfig {
    QueueConfig::new(server.url(), unique_name(name))
        .with_janitor_interval(Duration::from_millis(200))
}

pub fn fast_consumer() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_claim_idle(Duration::from_millis(600))
        .with_block(Duration::from_millis(200))
        .with_shutdown_timeout(Duration::from_secs(5))
}

pub fn fast_producer() -> ProducerConfig {
    ProducerConfig::default()
        .with_request_timeout(Duration::from_secs(20))
        .with_block(Duration::from_millis(500))
}

/// Keys of a queue still present (SCAN over the queue's hash tag).
pub fn keys_of(server: &RedisServer, q: &QueueConfig) -> Vec<String> {
    let mut c = server.sync_connection();
    let pattern = format!("{}:{{{}}}:*", q.prefix, q.name);
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut c).unwrap();
    keys.sort();
    keys
}
