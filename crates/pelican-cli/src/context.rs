//! What every subcommand needs from the global options: a validated queue
//! configuration, and a Redis that answers.

use crate::cli::Global;
use crate::exit::{CliError, CliResult};
use pelican::QueueConfig;
use std::time::Duration;

impl Global {
    /// The queue's configuration, checked (bad URL or name: exit 2) before anything
    /// connects.
    pub fn queue_config(&self) -> CliResult<QueueConfig> {
        let mut q = QueueConfig::new(self.redis.as_str(), self.queue.clone());
        let set = &self.settings;
        if let Some(ms) = set.result_ttl {
            q = q.with_result_ttl(Duration::from_millis(ms));
        }
        if let Some(ms) = set.failure_ttl {
            if Duration::from_millis(ms) > q.result_ttl {
                return Err(CliError::usage(format!(
                    "--failure-ttl {ms} is longer than the result ttl ({} ms): a failure is \
                     recorded for --result-ttl, so it cannot answer longer",
                    q.result_ttl.as_millis()
                )));
            }
            q = q.with_failure_ttl(Duration::from_millis(ms));
        }
        if let Some(n) = set.max_body_bytes {
            q = q.with_max_body_bytes(n as usize);
        }
        if let Some(n) = set.dead_maxlen {
            q = q.with_dead_maxlen(n as usize);
        }
        if let Some(ms) = set.consumer_gc_after {
            q = q.with_consumer_gc_after(Duration::from_millis(ms));
        }
        if let Some(n) = set.partitions {
            q = q.with_partitions(n);
        }
        if let Some(layout) = &set.partition_layout {
            q = q.with_partition_layout(layout.parse().map_err(|e: pelican::Error| {
                CliError::usage(format!("--partition-layout: {}", e.message()))
            })?);
        }
        if let Some(lean) = self.lean_connections {
            q = q.with_lean_connections(lean);
        }
        if let Some(path) = &self.tls_ca {
            let pem = std::fs::read(path).map_err(|e| {
                CliError::usage(format!(
                    "cannot read the CA file {} (--tls-ca / PELICAN_TLS_CA): {e}",
                    path.display()
                ))
            })?;
            q = q.with_tls_root_ca_pem(pem);
        }
        q.validate().map_err(|e| match e.kind() {
            pelican::ErrorKind::Config => CliError::usage(format!(
                "{} (check --redis / REDIS_URL and --queue / PELICAN_QUEUE)",
                e.message()
            )),
            _ => CliError::from_pelican(&e, self.redis.as_str(), &self.queue),
        })?;
        Ok(q)
    }

    /// The queue's configuration, once Redis has answered PING (exit 1 with advice when
    /// it does not).
    pub async fn connectable(&self) -> CliResult<QueueConfig> {
        let q = self.queue_config()?;
        if q.url.starts_with("rediss") || q.url.contains("+cluster://") {
            // The plain probe knows nothing of the CA or of clusters; the library's own
            // connection does (and says what failed: the handshake, the certificate, the
            // server).
            pelican::Admin::connect(q.clone())
                .await
                .map_err(|e| self.error(&e))?;
        } else {
            crate::redis_local::require(&q.url).await?;
        }
        Ok(q)
    }

    /// Maps a library error, with advice for this queue.
    pub fn error(&self, err: &pelican::Error) -> CliError {
        CliError::from_pelican(err, self.redis.as_str(), &self.queue)
    }
}
