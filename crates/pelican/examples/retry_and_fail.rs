//! What a handler's errors mean, and what the caller gets.
//!
//! - A retry (`HandlerError::retry`, or a bare `?` on the handler's own error): a passing
//!   failure (a timeout, a busy dependency). The request goes back to the queue and is
//!   delivered again, to any consumer; every delivery counts, and after `max_deliveries`
//!   it is dead-lettered: the caller gets `ErrorKind::Dead` and an operator finds it in
//!   the dead letters (`pelican dead list`).
//! - A failure (`HandlerError::fail`, or `.or_fail()?` on an error): the request itself is
//!   bad; trying again cannot help. The caller gets `ErrorKind::Remote` with the
//!   handler's message, at once.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example retry_and_fail
//! ```
//!
//! The queue is named after this process and removed at the end.

use pelican::{
    ConsumerConfig, ErrorKind, HandlerError, HandlerResultExt, Job, ProducerConfig, Queue,
    QueueConfig,
};
use serde::{Deserialize, Serialize};
use std::fmt;
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

/// The payment gateway's error, a `std::error::Error` as a client library's would be.
#[derive(Debug)]
struct GatewayError(&'static str);

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gateway: {}", self.0)
    }
}

impl std::error::Error for GatewayError {}

/// Stands in for a payment gateway: it times out once for orders starting with "slow",
/// and is never reachable for orders starting with "down".
fn gateway(order: &str, attempt: u32) -> Result<(), GatewayError> {
    let outcome = match order {
        o if o.starts_with("slow") && attempt == 1 => Err(GatewayError("timed out")),
        o if o.starts_with("down") => Err(GatewayError("unavailable")),
        _ => Ok(()),
    };
    if let Err(e) = &outcome {
        println!("  handler: {order} delivery {attempt}: {e}: retry");
    }
    outcome
}

/// Checks an order; its error is only a message.
fn validate(req: &Charge) -> Result<(), String> {
    if req.cents <= 0 {
        println!("  handler: {} is invalid: fail", req.order);
        return Err(format!(
            "order {}: the amount must be positive, got {} cents",
            req.order, req.cents
        ));
    }
    Ok(())
}

async fn charge(req: Charge, job: Job) -> Result<Receipt, HandlerError> {
    let attempt = job.delivery_count();
    // A bad request fails for good: no retry can fix it.
    validate(&req).or_fail()?;
    // The gateway's errors are passing ones: a bare `?` retries.
    gateway(&req.order, attempt)?;
    println!("  handler: {} delivery {attempt}: charged", req.order);
    Ok(Receipt {
        order: req.order,
        attempt,
    })
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let queue = Queue::<Charge, Receipt>::new(QueueConfig::new(
        url,
        format!("example-charge-{}", std::process::id()),
    ));

    let worker = queue
        .serve(
            ConsumerConfig::default().with_max_deliveries(MAX_DELIVERIES),
            4,
            charge,
        )
        .await?;
    let producer = queue
        .producer(ProducerConfig::default().with_request_timeout(Duration::from_secs(60)))
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
    let admin = queue.admin().await?;
    for letter in admin.dead_letters(10).await? {
        println!(
            "dead letter {}: {} deliveries, reason: {}, body: {}",
            letter.id, letter.deliveries, letter.reason, letter.body_preview
        );
    }

    producer.shutdown().await?;
    worker.stop().await?;
    admin.destroy().await?;
    Ok(())
}
