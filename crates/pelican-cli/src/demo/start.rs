//! The start: worker processes (children of this binary) until all are ready, then the
//! producers and the admin connection.

use super::Demo;
use crate::cli::DemoArgs;
use crate::exit::{CliError, CliResult};
use crate::pool::Event;
use crate::redis_url::RedisUrl;
use pelican::{Admin, Producer, ProducerConfig};
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long the workers may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a producer waits for any one response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The command line of every worker process: `pelican worker` on the demo's queue, with
/// a handler that crashes on the poison.
pub(super) fn worker_args(
    args: &DemoArgs,
    url: &RedisUrl,
    queue: &str,
    handler: &str,
) -> Vec<String> {
    [
        "--redis",
        url.as_str(),
        "--queue",
        queue,
        "--json",
        "worker",
        "--handler",
        handler,
        "--concurrency",
        &args.concurrency.to_string(),
        "--claim-idle",
        &args.claim_idle.to_string(),
        "--max-deliveries",
        &args.max_deliveries.to_string(),
        "--verbose",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Demo {
    /// Starts the workers and waits until they serve, then connects.
    pub(super) async fn start(&mut self, started: Instant) -> CliResult {
        let workers = self.args.workers as usize;
        for _ in 0..workers {
            self.pool.spawn()?;
        }
        self.wait_ready(workers).await?;
        self.out.say(format!(
            "{workers} workers ready after {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        let cfg = ProducerConfig::default().with_request_timeout(REQUEST_TIMEOUT);
        for _ in 0..self.args.producers {
            let p = Producer::<Value, Value>::connect(self.queue.clone(), cfg.clone())
                .await
                .map_err(|e| self.error(&e))?;
            self.producers.push(p);
        }
        self.admin = Some(
            Admin::connect(self.queue.clone())
                .await
                .map_err(|e| self.error(&e))?,
        );
        Ok(())
    }

    async fn wait_ready(&mut self, n: usize) -> CliResult {
        let deadline = tokio::time::sleep(READY_TIMEOUT);
        tokio::pin!(deadline);
        while self.pool.counts().1 < n {
            tokio::select! {
                ev = self.events.recv() => {
                    let Some(ev) = ev else { break };
                    if let Event::Exited { stderr, status, .. } = &ev {
                        return Err(CliError::failure(format!(
                            "a worker process exited before it was ready ({}): {}",
                            status.map(|s| s.to_string()).unwrap_or_default(),
                            stderr.join(" | ")
                        )));
                    }
                    self.on_event(ev)?;
                }
                _ = &mut deadline => {
                    return Err(CliError::failure(format!(
                        "the worker processes were not ready within {READY_TIMEOUT:?}; run \
                         `pelican worker --queue {} -v` to see why",
                        self.queue.name
                    )));
                }
            }
        }
        Ok(())
    }
}
