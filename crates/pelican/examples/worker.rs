//! A worker: serves a queue until SIGTERM or SIGINT (Ctrl-C), then shuts down gracefully.
//! It reads nothing new, lets the requests in hand finish (for up to `shutdown_timeout`)
//! and hands back whatever is still unfinished, so another worker takes it at once
//! instead of after `claim_idle`.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example worker
//! ```
//!
//! then send it requests from another terminal, with the `pelican` command (same Redis,
//! queue `example-shout`; requests and responses are JSON):
//!
//! ```text
//! cargo run -p pelican-cli -- call --queue example-shout '{"text": "hello"}'
//! ```
//!
//! and stop it with Ctrl-C or `kill PID`. A second signal is not needed: the shutdown is
//! bounded by `shutdown_timeout`.

use pelican::{ConsumerConfig, HandlerError, Job, Queue, QueueConfig};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The queue this worker serves.
const QUEUE: &str = "example-shout";
/// Requests handled at once.
const CONCURRENCY: usize = 8;
/// How long requests in hand may take to finish once a signal arrived.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
struct Shout {
    text: String,
}

#[derive(Debug, Serialize)]
struct Shouted {
    text: String,
}

async fn shout(req: Shout, job: Job) -> Result<Shouted, HandlerError> {
    println!(
        "handling {} (delivery {})",
        job.request_id(),
        job.delivery_count()
    );
    let lost = job.lease_lost();
    tokio::select! {
        // The work: slow enough to see a shutdown wait for it.
        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        // This worker lost the request (another one took it over) or is past its
        // shutdown timeout: stop working on it and hand it back.
        _ = lost.cancelled() => return Err(HandlerError::retry("lease lost")),
    }
    Ok(Shouted {
        text: req.text.to_uppercase(),
    })
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM (what `kill` and service managers send).
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Listen before connecting, so a signal that arrives meanwhile still stops gracefully.
    let stopped = tokio::spawn(stop_signal());

    let queue = Queue::<Shout, Shouted>::new(QueueConfig::new(url, QUEUE));
    let worker = queue
        .serve(
            ConsumerConfig::default().with_shutdown_timeout(SHUTDOWN_TIMEOUT),
            CONCURRENCY,
            shout,
        )
        .await?;
    println!(
        "serving queue {QUEUE} as {} (pid {}); stop with Ctrl-C",
        worker.name(),
        std::process::id()
    );

    stopped.await??;
    println!("stopping: finishing the requests in hand, handing back the rest");
    // `stop` returns once every handler finished or was cancelled at the timeout and its
    // request handed back, every outcome is written and the consumer left the group.
    worker.stop().await?;
    println!("stopped");
    Ok(())
}
