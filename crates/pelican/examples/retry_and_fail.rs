//! What a handler's errors mean, and what the caller gets.
//!
//! - `HandlerError::retry`: a passing failure (a timeout, a busy dependency). The request
//!   goes back to the queue and is delivered again, to any consumer; every delivery
//!   counts, and after `max_deliveries` it is dead-lettered: the caller gets
//!   `ErrorKind::Dead` and an operator finds it in the dead letters (`pelican dead list`).
//! - `HandlerError::fail`: the request itself is bad; trying again cannot help. The
//!   caller gets `ErrorKind::Remote` with the handler's message, at once.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example retry_and_fail
//! ```
//!
//! The queue is named after this process and removed at the end.

use pelican::{
    Admin, Consumer, ConsumerConfig, ErrorKind, HandlerError, Job, Producer, ProducerConfig,
    QueueConfig,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Deliveries before a request that keeps asking for a retry is dead-lettered.
const MAX_DELIVERIES: u32 = 3;

#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    order: String,
    cents: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    order: String,
    /// The delivery that succeeded.
    attempt: u32,
}

/// Stands in for a payment gateway: it times out once for orders starting with "slow",
/// and is never reachable for orders starting with "down".
fn gateway(order: &str, attempt: u32) -> Result<(), &'static str> {
    match order {
        o if o.starts_with("slow") && attempt == 1 => Err("gateway timed out"),
        o if o.starts_with("down") => Err("gateway unavailable"),
        _ => Ok(()),
    }
}

async fn charge(req: Charge, job: Job) -> Result<Receipt, HandlerError> {
    let attempt = job.delivery_count();
    // A bad request fails for good: no retry can fix it.
    if req.cents <= 0 {
        println!("  handler: {} is invalid: fail", req.order);
        return Err(HandlerError::fail(format!(
            "order {}: the amount must be positive, got {} cents",
            req.order, req.cents
        )));
    }
    // A passing error asks for a retry.
    if let Err(why) = gateway(&req.order, attempt) {
        println!("  handler: {} delivery {attempt}: {why}: retry", req.order);
        return Err(HandlerError::retry(why));
    }
    println!("  handler: {} delivery {attempt}: charged", req.order);
    Ok(Receipt {
        order: req.order,
        attempt,
    })
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let queue = QueueConfig::new(url, format!("example-charge-{}", std::process::id()));

    let consumer = Consumer::<Charge, Receipt>::connect(
        queue.clone(),
        ConsumerConfig::default().with_max_deliveries(MAX_DELIVERIES),
    )
    .await?;
    let stop = consumer.stopper();
    let serving = tokio::spawn(consumer.serve(4, charge));
    let producer = Producer::<Charge, Receipt>::connect(
        queue.clone(),
        ProducerConfig::default().with_request_timeout(Duration::from_secs(60)),
    )
    .await?;

    for (order, cents) in [("slow-1001", 2500), ("bad-1002", -5), ("down-1003", 990)] {
        let req = Charge {
            order: order.into(),
            cents,
        };
        println!("producer: charging {order}");
        match producer.call(&req).await {
            Ok(receipt) => println!(
                "producer: {} charged on delivery {}",
                receipt.order, receipt.attempt
            ),
            Err(e) if e.kind() == ErrorKind::Remote => println!(
                "producer: {order} failed for good (Remote, retryable: {}): {}",
                e.is_retryable(),
                e.message()
            ),
            Err(e) if e.kind() == ErrorKind::Dead => println!(
                "producer: {order} was dead-lettered after {MAX_DELIVERIES} deliveries \
                 (Dead, retryable: {}): {}",
                e.is_retryable(),
                e.message()
            ),
            Err(e) => return Err(e),
        }
    }

    // What an operator sees (`pelican dead list` shows the same).
    let admin = Admin::connect(queue).await?;
    for letter in admin.dead_letters(10).await? {
        println!(
            "dead letter {}: {} deliveries, reason: {}, body: {}",
            letter.id, letter.deliveries, letter.reason, letter.body_preview
        );
    }

    producer.shutdown().await?;
    stop.stop();
    serving.await.expect("the consumer task panicked")?;
    admin.destroy().await?;
    Ok(())
}
