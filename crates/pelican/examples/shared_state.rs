//! A handler with shared state: a client of another service and a cache, built once and
//! shared by every request the worker serves at once.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example shared_state
//! ```
//!
//! `Queue::serve` (like `Consumer::serve`) takes one handler (`Fn(Req, Job) -> Future`) and runs it for up to
//! `concurrency` requests at once, so what the handler uses is shared: put it in an
//! `Arc`, move a clone into the closure, and clone that again into each request's
//! `async move` block (a clone of an `Arc` is one counter increment, not a copy). State
//! that changes goes behind a lock (or an atomic); hold a `std::sync::Mutex` only between
//! awaits, as below, never across one.

use pelican::{ConsumerConfig, HandlerError, ProducerConfig, Queue, QueueConfig};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Thumbnail {
    image: String,
    width: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Done {
    url: String,
    source_bytes: usize,
}

/// A stand-in for a client of the image store (an HTTP client, an S3 client, a database
/// pool): made once, cloned or shared by every handler run.
struct ImageStore {
    fetches: AtomicU64,
}

impl ImageStore {
    async fn fetch(&self, image: &str) -> Result<Vec<u8>, String> {
        if image.is_empty() {
            return Err("no image named".into());
        }
        self.fetches.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await; // the network
        Ok(vec![0; 1000 + image.len()])
    }
}

/// What every handler run shares.
struct AppState {
    store: ImageStore,
    /// Source images fetched already, by name (a cache across requests: pelican's own
    /// cache answers identical requests; this one serves different thumbnails of one
    /// image).
    sources: Mutex<HashMap<String, Arc<Vec<u8>>>>,
}

impl AppState {
    async fn thumbnail(&self, req: Thumbnail) -> Result<Done, HandlerError> {
        let cached = self.sources.lock().unwrap().get(&req.image).cloned();
        let source = match cached {
            Some(s) => s,
            None => {
                // No lock held across the await: other requests go on meanwhile.
                let fetched = self.store.fetch(&req.image).await.map_err(|e| {
                    // Bad input: fail for good (a passing fault would be `retry`).
                    HandlerError::fail(format!("cannot fetch {:?}: {e}", req.image))
                })?;
                let fetched = Arc::new(fetched);
                self.sources
                    .lock()
                    .unwrap()
                    .insert(req.image.clone(), fetched.clone());
                fetched
            }
        };
        Ok(Done {
            url: format!("https://cdn.example/{}-{}w", req.image, req.width),
            source_bytes: source.len(),
        })
    }
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let queue = Queue::<Thumbnail, Done>::new(QueueConfig::new(
        url,
        format!("example-shared-{}", std::process::id()),
    ));

    let state = Arc::new(AppState {
        store: ImageStore {
            fetches: AtomicU64::new(0),
        },
        sources: Mutex::new(HashMap::new()),
    });

    let handler_state = state.clone();
    let worker = queue
        .serve(ConsumerConfig::default(), 8, move |req: Thumbnail, _job| {
            // One clone per request, moved into its future.
            let state = handler_state.clone();
            async move { state.thumbnail(req).await }
        })
        .await?;

    let producer = queue.producer(ProducerConfig::default()).await?;
    // A first thumbnail of each image fetches it; then the other widths, at once, use the
    // shared cache (a request for an image not fetched yet would fetch it again).
    for image in ["cat.png", "dog.png"] {
        let req = Thumbnail {
            image: image.into(),
            width: 64,
        };
        let done = producer.call(&req).await?;
        println!("{} (from {} source bytes)", done.url, done.source_bytes);
    }
    let mut calls = Vec::new();
    for image in ["cat.png", "dog.png"] {
        for width in [128, 256] {
            let producer = producer.clone();
            let req = Thumbnail {
                image: image.into(),
                width,
            };
            calls.push(tokio::spawn(async move { producer.call(&req).await }));
        }
    }
    for call in calls {
        let done = call.await.expect("the call task panicked")?;
        println!("{} (from {} source bytes)", done.url, done.source_bytes);
    }
    match producer
        .call(&Thumbnail {
            image: String::new(),
            width: 64,
        })
        .await
    {
        Err(e) => println!("no image: {e}"),
        Ok(done) => println!("unexpected: {}", done.url),
    }
    println!(
        "source images fetched: {} (the rest came from the shared cache)",
        state.store.fetches.load(Ordering::Relaxed)
    );

    producer.shutdown().await?;
    worker.stop().await?;
    queue.admin().await?.destroy().await?;
    Ok(())
}
