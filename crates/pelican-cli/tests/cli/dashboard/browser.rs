//! The dashboard in a real headless Chromium: the overview's numbers move while load
//! runs, a click opens the queue, a click requeues a dead letter and it leaves the list,
//! a request is looked up by id; and on a Redis Cluster, a partitioned queue summed and
//! broken down per partition, its dead letters requeued and purged. Screenshots go to
//! target/dashboard-screenshots/.

use super::cdp::Browser;
use super::{bury, xlen, ClusterQueue, Dashboard};
use crate::support::Env;
use pelican::{Producer, ProducerConfig, QueueConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests of the background load, at most (it stops at the end of the test anyway).
const MAX_LOAD: u64 = 200_000;
/// Longest the background load runs.
const LOAD_FOR: Duration = Duration::from_secs(180);

fn shots() -> PathBuf {
    // tests run in the package's directory; the workspace's target/ is two levels up
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/dashboard-screenshots")
}

/// Closed-loop load of `lanes` callers until `stop` (or the caps above).
fn start_load(queue: QueueConfig, lanes: usize, stop: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let done = Arc::new(AtomicU64::new(0));
    for lane in 0..lanes {
        let (queue, stop, done) = (queue.clone(), stop.clone(), done.clone());
        tokio::spawn(async move {
            let p = Producer::<Value, Value>::connect(
                queue,
                ProducerConfig::default()
                    .with_dedup(false)
                    .with_request_timeout(Duration::from_secs(30)),
            )
            .await
            .expect("load producer");
            let start = Instant::now();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed)
                && start.elapsed() < LOAD_FOR
                && done.load(Ordering::Relaxed) < MAX_LOAD
            {
                i += 1;
                if p.call(&json!({ "lane": lane, "i": i })).await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = p.shutdown().await;
        });
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_live_numbers_and_requeues_a_dead_letter_by_click() {
    let env = Env::new("dash-web");
    let q = env.queue.clone();
    let keys = env.keys();
    let poison = bury(
        &env,
        &keys,
        "render-frame-7",
        r#"{"scene": "intro", "frame": 7, "poison": true}"#,
    );
    let other = bury(
        &env,
        &keys,
        "render-frame-9",
        r#"{"scene": "intro", "frame": 9, "poison": true}"#,
    );
    let _worker_a = env.spawn(&[
        "worker",
        "--handler",
        "sleep:40",
        "--concurrency",
        "8",
        "--name",
        "worker-a",
    ]);
    let _worker_b = env.spawn(&[
        "worker",
        "--handler",
        "sleep:40",
        "--concurrency",
        "8",
        "--name",
        "worker-b",
    ]);
    let d = Dashboard::start(&env, &[]);
    let token = d.token.clone().expect("login link");
    d.wait_for_queue(&q);

    // A request with an id of our own, answered and cached: the page looks it up later.
    let queue = QueueConfig::new(env.server.url(), q.clone());
    let caller = Producer::<Value, Value>::connect(queue.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let answer = caller
        .submit_with_id("web-lookup-1", &json!({ "look": 1 }))
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(answer, json!({ "look": 1 }));

    let stop = Arc::new(AtomicBool::new(false));
    let done = start_load(queue, 12, stop.clone());

    let mut b = Browser::launch().await;
    // The login link sets the cookie and lands on the overview.
    b.goto(&d.url(&format!("/login?token={token}"))).await;
    let card = format!("[data-queue=\"{q}\"]");
    b.wait_for(
        "the queue's card",
        &format!("location.pathname === '/' && document.querySelector('{card}')"),
    )
    .await;
    let submitted = format!("{card} [data-stat=submitted] .value");
    let first = b.text(&submitted).await.expect("a submitted count");
    b.wait_for(
        "the submitted count to change under load",
        &format!(
            "document.querySelector('{submitted}').textContent !== {}",
            json!(first)
        ),
    )
    .await;
    b.wait_for(
        "a throughput above zero",
        &format!("document.querySelector('{card} .legend.blue b').textContent !== '0'"),
    )
    .await;
    // Enough history for the charts to show a line.
    b.wait_for(
        "a few seconds of history in the chart",
        &format!("(document.querySelector('{card} polyline.line.blue')?.getAttribute('points') || '').split(' ').length >= 12"),
    )
    .await;
    let later = b.text(&submitted).await.unwrap();
    assert_ne!(first, later, "the numbers move while load runs");
    assert!(done.load(Ordering::Relaxed) > 0, "the load ran");
    assert_eq!(
        b.text(&format!("{card} [data-stat=dead_letters] .value"))
            .await
            .as_deref(),
        Some("2")
    );
    b.screenshot(&shots().join("overview.png"), false).await;

    // Open the queue with a click on its name.
    b.click(&format!("{card} a[data-link=queue]")).await;
    b.wait_for(
        "the queue page with its dead letters and consumers",
        &format!(
            "location.pathname === '/queues/{q}' && document.querySelector('#dead tr[data-dead-id=\"{poison}\"]') \
             && document.querySelectorAll('#consumers tr[data-consumer]').length === 2"
        ),
    )
    .await;
    b.wait_for(
        "a consumer's held requests",
        "document.querySelector('#consumers ul.held li')",
    )
    .await;
    b.wait_for(
        "the queue's chart",
        "(document.querySelector('#live polyline.line.blue')?.getAttribute('points') || '').split(' ').length >= 12",
    )
    .await;
    assert_eq!(
        b.text(&format!("tr[data-dead-id=\"{poison}\"] td.reason"))
            .await
            .as_deref(),
        Some("handler crashed 3 times (test poison)")
    );

    // Look up a request by id: typed into the box, shown as inspect shows it.
    b.click("form.lookup input").await;
    b.type_text("web-lookup-1").await;
    b.click("form.lookup button").await;
    b.wait_for(
        "the request's state",
        "document.querySelector('#lookup-result [data-state=ok]')",
    )
    .await;
    let shown = b.text("#lookup-result").await.unwrap();
    assert!(
        shown.contains("web-lookup-1") && shown.contains(r#"{"look":1}"#),
        "{shown}"
    );
    b.screenshot(&shots().join("queue.png"), true).await;

    // Requeue one dead letter with a click: it leaves the list, the other stays.
    let button = format!("tr[data-dead-id=\"{poison}\"] button[data-action=requeue]");
    b.wait_for(
        "the requeue button to be enabled",
        &format!("!document.querySelector('{button}').disabled"),
    )
    .await;
    b.click(&button).await;
    b.wait_for(
        "the requeued letter to leave the list",
        &format!("!document.querySelector('tr[data-dead-id=\"{poison}\"]')"),
    )
    .await;
    b.wait_for("the toast", "!document.getElementById('toast').hidden")
        .await;
    assert!(b
        .text("#toast")
        .await
        .unwrap()
        .contains(&format!("Requeued {poison}")));
    // The list is read again from Redis: without it, with the other one.
    b.wait_for(
        "the list to be read again",
        &format!("document.getElementById('dead-count').textContent === '1' && document.querySelector('tr[data-dead-id=\"{other}\"]')"),
    )
    .await;
    assert_eq!(
        b.eval(&format!(
            "!!document.querySelector('tr[data-dead-id=\"{poison}\"]')"
        ))
        .await,
        json!(false)
    );
    assert_eq!(xlen(&env, keys.dead()), 1, "one dead letter left in Redis");
    b.screenshot(&shots().join("queue-after-requeue.png"), true)
        .await;

    stop.store(true, Ordering::Relaxed);
    caller.shutdown().await.unwrap();
}

/// The same page on a 3-master Redis Cluster, for a queue of 3 partitions under load:
/// the overview's figures are the partitions' sums, the queue page breaks them down per
/// partition (with the master serving each), and a dead letter of partition 2 is
/// requeued by a click, the rest purged by two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_on_a_cluster_sums_the_partitions_and_requeues_from_any() {
    let cq = ClusterQueue::start("dash-web-cluster");
    let q = cq.queue.name.clone();
    let poison = cq.bury(2, "frame-2", r#"{"frame": 2, "poison": true}"#);
    let other = cq.bury(1, "frame-1", r#"{"frame": 1, "poison": true}"#);
    let _worker = cq.spawn(&[
        "worker",
        "--handler",
        "sleep:40",
        "--concurrency",
        "8",
        "--name",
        "worker-c",
    ]);
    let d = cq.start_dashboard(&[]);
    let token = d.token.clone().expect("login link");
    d.wait_for_queue(&q);
    let stop = Arc::new(AtomicBool::new(false));
    let done = start_load(cq.queue.clone(), 8, stop.clone());

    let mut b = Browser::launch().await;
    b.goto(&d.url(&format!("/login?token={token}"))).await;
    let card = format!("[data-queue=\"{q}\"]");
    b.wait_for(
        "the queue's card, with its partitions",
        &format!("document.querySelector('{card} .badge')?.textContent === '3 partitions'"),
    )
    .await;
    let submitted = format!("{card} [data-stat=submitted] .value");
    let first = b.text(&submitted).await.expect("a submitted count");
    b.wait_for(
        "the submitted count to change under load",
        &format!(
            "document.querySelector('{submitted}').textContent !== {}",
            json!(first)
        ),
    )
    .await;
    assert_eq!(
        b.text(&format!("{card} [data-stat=dead_letters] .value"))
            .await
            .as_deref(),
        Some("2"),
        "dead letters of partitions 1 and 2, summed"
    );
    b.screenshot(&shots().join("cluster-overview.png"), false)
        .await;

    b.click(&format!("{card} a[data-link=queue]")).await;
    b.wait_for(
        "the queue page with its partitions",
        "document.querySelectorAll('#partitions tr[data-partition]').length === 3",
    )
    .await;
    // Each partition on the master that serves it; one consumer in each.
    for p in 0..3 {
        let tag = cq.queue.partition_keys(p).stream().to_string();
        let master = cq.cluster.master_of(&tag);
        let node = format!("127.0.0.1:{}", cq.cluster.nodes()[master].port());
        let row = format!("#partitions tr[data-partition=\"{}\"]", tag_of(&tag));
        b.wait_for(
            &format!("partition {p}'s row"),
            &format!(
                "document.querySelector('{row} [data-col=node]')?.textContent === {} \
                 && document.querySelector('{row} [data-col=consumers]')?.textContent === '1'",
                json!(node)
            ),
        )
        .await;
    }
    // The figures on top are the rows' sums (one sample draws both).
    let sums = b
        .eval(
            "(() => { const n = (s) => Number(s.replace(/,/g, '')); \
             const col = (c) => [...document.querySelectorAll(`#partitions [data-col=${c}]`)].reduce((a, e) => a + n(e.textContent), 0); \
             const top = (k) => n(document.querySelector(`#live [data-stat=${k}] .value`).textContent); \
             return [col('submitted'), top('submitted'), col('dead_letters'), top('dead_letters'), col('queued'), top('queued')]; })()",
        )
        .await;
    let sums: Vec<u64> = serde_json::from_value(sums).unwrap();
    assert_eq!(
        (sums[0], sums[2], sums[4]),
        (sums[1], sums[3], sums[5]),
        "submitted, dead letters, queued: the rows add up to the top: {sums:?}"
    );
    assert_eq!(sums[3], 2);
    assert!(sums[1] > 0, "{sums:?}");
    b.wait_for(
        "the dead letters of both partitions",
        &format!(
            "document.querySelector('#dead tr[data-dead-id=\"{poison}\"]') \
             && document.querySelector('#dead tr[data-dead-id=\"{other}\"]')"
        ),
    )
    .await;
    b.screenshot(&shots().join("cluster-queue.png"), true).await;

    // Requeue partition 2's letter with a click.
    let button = format!("tr[data-dead-id=\"{poison}\"] button[data-action=requeue]");
    b.wait_for(
        "the requeue button to be enabled",
        &format!("!document.querySelector('{button}').disabled"),
    )
    .await;
    b.click(&button).await;
    b.wait_for(
        "the requeued letter to leave the list",
        &format!(
            "!document.querySelector('tr[data-dead-id=\"{poison}\"]') \
             && document.getElementById('dead-count').textContent === '1'"
        ),
    )
    .await;
    assert_eq!(cq.dead_letters(2), 0, "partition 2's letter left Redis");
    assert_eq!(cq.dead_letters(1), 1);

    // Purge the rest: a first click arms the button, a second deletes.
    b.click("button[data-action=purge]").await;
    b.wait_for(
        "the purge button armed",
        "document.querySelector('button[data-action=purge]').classList.contains('armed')",
    )
    .await;
    b.click("button[data-action=purge]").await;
    b.wait_for(
        "no dead letters left",
        "document.getElementById('dead-count').textContent === '0' \
         && document.querySelector('#dead [data-empty=dead]')",
    )
    .await;
    assert_eq!((cq.dead_letters(1), cq.dead_letters(2)), (0, 0));
    assert!(done.load(Ordering::Relaxed) > 0, "the load ran");
    stop.store(true, Ordering::Relaxed);
}

/// The key tag of a partition's key (`{tag}`).
fn tag_of(key: &str) -> &str {
    let open = key.find('{').unwrap() + 1;
    let close = open + key[open..].find('}').unwrap();
    &key[open..close]
}
