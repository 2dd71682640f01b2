//! Large bodies as raw bytes: a producer sends 8 MiB blobs, a consumer answers with a
//! checksum of each, both with the `Raw` codec (the bytes as they are: no JSON).
//!
//! ```text
//! cargo run -p pelican --release --example raw_bytes
//! REDIS_URL=redis://127.0.0.1:6390 cargo run -p pelican --release --example raw_bytes
//! ```
//!
//! The queue allows bodies of up to 16 MiB (`with_max_body_bytes`: the default is 4 MiB;
//! every process of a queue should use the same limit). With dedup on (the default),
//! each blob is stored beside the stream by a plain SET and read by the worker with one
//! MGET: see docs/PROTOCOL.md, "Stored bodies". The queue is removed at the end.

use pelican::{Bytes, ConsumerConfig, HandlerError, Job, ProducerConfig, Queue, QueueConfig, Raw};
use std::time::{Duration, Instant};

/// A cheap checksum (FNV-1a), as the "work" on a blob.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

async fn handle(blob: Bytes, _job: Job) -> Result<Bytes, HandlerError> {
    Ok(Bytes::from(checksum(&blob).to_le_bytes().to_vec()))
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let queue = Queue::<Bytes, Bytes, Raw>::new(
        QueueConfig::new(url, format!("example-blobs-{}", std::process::id()))
            .with_max_body_bytes(16 << 20),
    );

    let worker = queue.serve(ConsumerConfig::default(), 4, handle).await?;
    let producer = queue
        .producer(ProducerConfig::default().with_request_timeout(Duration::from_secs(60)))
        .await?;

    for i in 0..8u8 {
        let blob: Bytes = (0..8 << 20)
            .map(|j: u32| (j as u8).wrapping_add(i))
            .collect::<Vec<u8>>()
            .into();
        let (want, len) = (checksum(&blob), blob.len());
        let t = Instant::now();
        // Handed over, not encoded: the blob becomes the request body without a copy.
        let answer = producer.call_bytes(blob).await?;
        let sum = u64::from_le_bytes(answer[..8].try_into().expect("8 bytes"));
        assert_eq!(sum, want, "the worker saw other bytes");
        println!(
            "blob {i}: {} MiB there and a checksum back in {:.1} ms",
            len >> 20,
            t.elapsed().as_secs_f64() * 1e3
        );
    }

    producer.shutdown().await?;
    worker.stop().await?;
    queue.admin().await?.destroy().await?;
    Ok(())
}
