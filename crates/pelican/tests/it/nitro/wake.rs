//! The consumer core's wake-ups on Nitro's wire: a request its handler gives back is
//! read again at once, and an idle consumer stops at once, whatever `block` and the
//! reclaim interval are (before the core was shared, the Nitro consumer waited for its
//! reclaim interval, up to 5 s, and a stop for its read's block).

use super::*;
use pelican::nitro::Producer;
use pelican_testkit::eventually;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Far longer than anything here should take.
const BLOCK: Duration = Duration::from_secs(10);
/// What "at once" is allowed to take here (a tenth of the block).
const PROMPT: Duration = Duration::from_secs(1);

/// Reads block 10 s and idle entries are looked for every 30 s (idletime 60 s).
fn long_waits() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_idletime(Duration::from_secs(60))
        .with_block(BLOCK)
        .with_reclaim_interval(Duration::from_secs(30))
        .with_shutdown_timeout(Duration::from_millis(100))
}

/// How many clients are blocked in `XREADGROUP` on `env`'s server.
fn blocked_readers(env: &Env) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut env.conn())
        .unwrap();
    list.lines()
        .filter(|l| {
            let flags = l.split(' ').find_map(|f| f.strip_prefix("flags="));
            l.contains(" cmd=xreadgroup ") && flags.is_some_and(|f| f.contains('b'))
        })
        .count()
}

/// The stream and its group, made as Nitro's producers make them: the consumer's first
/// look for idle entries finds the group, and its reads block for the whole 10 s.
fn create_group(env: &Env) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&env.stream)
        .arg(&env.stream)
        .arg("$")
        .arg("MKSTREAM")
        .query(&mut env.conn())
        .unwrap();
}

async fn until_blocked(env: &Env) {
    eventually(Duration::from_secs(10), "the reader blocked", || async {
        blocked_readers(env) == 1
    })
    .await;
}

/// A request whose handler asks for a retry on its first delivery is delivered again and
/// answered within [`PROMPT`], while the consumer's read blocks for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_back_is_read_again_at_once() {
    let env = Env::new("nitro-wake-retry");
    create_group(&env);
    let deliveries = Arc::new(AtomicU32::new(0));
    let d = deliveries.clone();
    let w = Worker::spawn(env.config(), long_waits(), 2, move |r: Req, job: Job| {
        let d = d.clone();
        async move {
            d.fetch_add(1, Ordering::SeqCst);
            if job.delivery_count() == 1 {
                return Err(HandlerError::retry("not yet"));
            }
            Ok(Req {
                i: r.i,
                data: format!("delivery {}", job.delivery_count()),
            })
        }
    })
    .await;
    let p = Producer::<Req, Req>::connect(env.config(), producer_config())
        .await
        .unwrap();
    until_blocked(&env).await;
    for i in 0..3 {
        let t = Instant::now();
        let r = p.call(&req(i)).await.unwrap();
        let took = t.elapsed();
        assert_eq!(
            r.data, "delivery 2",
            "request {i} answered on its second delivery"
        );
        assert!(took < PROMPT, "request {i} given back once took {took:?}");
    }
    assert_eq!(deliveries.load(Ordering::SeqCst), 6);
    w.stop().await;
    p.shutdown().await.unwrap();
}

/// An idle consumer blocked in its read stops within [`PROMPT`], not when its 10 s block
/// runs out, and leaves the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_stops_at_once() {
    let env = Env::new("nitro-wake-stop");
    create_group(&env);
    let w = Worker::echo(env.config(), long_waits(), Runs::default()).await;
    let name = w.name.clone();
    until_blocked(&env).await;
    let t = Instant::now();
    w.stop().await;
    let took = t.elapsed();
    assert!(took < PROMPT, "the stop took {took:?}");
    assert_eq!(blocked_readers(&env), 0);
    assert!(
        !env.consumers().iter().any(|(n, _)| *n == name),
        "{:?}",
        env.consumers()
    );
}
