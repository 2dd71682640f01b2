//! A producer and a consumer of one typed request/response, in one process.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example request_reply
//! REDIS_URL=redis://127.0.0.1:6390 cargo run -p pelican --example request_reply
//! ```
//!
//! In a real deployment the consumer runs in worker processes (see the `worker` example)
//! and the producer in the application that needs the answers; here they share one
//! process so the whole round trip fits on a screen. The queue is named after this
//! process and removed at the end, so a run leaves nothing behind.

use pelican::{ConsumerConfig, HandlerError, Job, ProducerConfig, Queue, QueueConfig};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The request: what to resize, and to what size.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Resize {
    image: String,
    width: u32,
    height: u32,
}

/// The response.
#[derive(Debug, Serialize, Deserialize)]
struct Resized {
    url: String,
    bytes: u64,
}

/// The handler: `Ok` is the response; an `Err` would say whether to retry or fail for
/// good (see the `retry_and_fail` example).
async fn resize(req: Resize, job: Job) -> Result<Resized, HandlerError> {
    println!(
        "  consumer: resizing {} to {}x{} (request {}, delivery {})",
        req.image,
        req.width,
        req.height,
        job.request_id(),
        job.delivery_count()
    );
    tokio::time::sleep(Duration::from_millis(200)).await; // the work
    Ok(Resized {
        url: format!(
            "https://cdn.example/{}-{}x{}",
            req.image, req.width, req.height
        ),
        bytes: u64::from(req.width) * u64::from(req.height) * 4,
    })
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // The queue and its types: producers and consumers made from it agree on them.
    let queue = Queue::<Resize, Resized>::new(QueueConfig::new(
        url,
        format!("example-resize-{}", std::process::id()),
    ));

    // A worker: a consumer serving at most 4 requests at a time, until stopped.
    let worker = queue.serve(ConsumerConfig::default(), 4, resize).await?;

    // A producer.
    let producer = queue
        .producer(ProducerConfig::default().with_request_timeout(Duration::from_secs(30)))
        .await?;

    // `call` submits and waits for the response.
    let cat = Resize {
        image: "cat.png".into(),
        width: 640,
        height: 480,
    };
    let resized = producer.call(&cat).await?;
    println!("producer: {} is {} bytes", resized.url, resized.bytes);

    // `submit` returns a ticket to await later. Two identical requests in flight are
    // solved once: the second submission joins the first.
    let dog = Resize {
        image: "dog.png".into(),
        width: 320,
        height: 200,
    };
    let first = producer.submit(&dog).await?;
    let second = producer.submit(&dog).await?;
    println!(
        "producer: submitted dog.png twice: {:?}, then {:?}",
        first.submitted(),
        second.submitted()
    );
    let (a, b) = (first.await?, second.await?);
    println!("producer: both got {} ({} bytes)", a.url, b.bytes);

    // And a repeat within result_ttl (5 minutes by default) is answered from the cache.
    let again = producer.submit(&cat).await?;
    println!("producer: cat.png again: {:?}", again.submitted());
    again.await?;

    // Stop in order: the producer, then the consumer (it finishes what it holds).
    producer.shutdown().await?;
    worker.stop().await?;
    queue.admin().await?.destroy().await?;
    Ok(())
}
