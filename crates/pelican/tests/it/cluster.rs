//! Redis Cluster: one queue over `redis+cluster://`, and hash slots computed as Redis does.

use crate::common::*;
use pelican::{Admin, Producer, QueueConfig};
use pelican_testkit::{unique_name, RedisCluster};
use std::time::Duration;

fn cluster_url(c: &RedisCluster) -> String {
    let seeds: Vec<String> = c.ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("redis+cluster://{}", seeds.join(","))
}

#[tokio::test]
async fn a_queue_on_a_cluster_round_trips() {
    let cluster = RedisCluster::start(3);
    let q = QueueConfig::new(cluster_url(&cluster), unique_name("on-cluster"))
        .with_janitor_interval(Duration::from_millis(200));
    let (w, runs) = Worker::counting(&q, fast_consumer(), "w").await;
    let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer())
        .await
        .unwrap();
    for i in 0..50 {
        let r = p.call(&Req::new(i, "c")).await.unwrap();
        assert_eq!((r.i, r.by.as_str()), (i, "w"));
    }
    // Dedup holds on the cluster as on one node.
    let seven = Req::new(7, "c");
    let (a, b) = tokio::join!(p.call(&seven), p.call(&seven));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(runs.total(), 50);
    let st = Admin::connect(q.clone())
        .await
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(st.consumers.len(), 1);
    // Found by SCAN on the node of the queue's slot (SCAN names no key to route by).
    assert_eq!(st.cached_results, 50);
    w.stop().await;
    p.shutdown().await.unwrap();
}
