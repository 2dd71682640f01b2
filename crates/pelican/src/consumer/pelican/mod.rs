//! pelican's consumer: the consumer core on pelican's own wire (`wire.rs`), with its
//! public faces: [`Consumer`], [`Delivery`] and [`Job`] (`delivery.rs`).

mod delivery;
mod wire;

pub use delivery::{Delivery, Job};

use super::wire::Settings;
use super::{Core, HandlerError, Stopper};
use crate::codec::{Codec, Json};
use crate::config::{ConsumerConfig, QueueConfig};
use crate::error::Result;
use crate::ids;
use crate::shared::Shared;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::marker::PhantomData;
use wire::Pelican;

/// Reads requests of type `Req` from a queue and answers them with `Resp`.
pub struct Consumer<Req, Resp, C: Codec = Json> {
    core: Core<Pelican<C>, Req>,
    _types: PhantomData<fn(Resp)>,
}

impl ConsumerConfig {
    /// The settings the consumer core runs by.
    fn settings(&self) -> Settings {
        Settings {
            claim_idle: self.claim_idle,
            lease_interval: self.lease_interval(),
            reclaim_interval: self.reclaim_interval(),
            prefetch: self.prefetch,
            block: self.block,
            shutdown_timeout: self.shutdown_timeout,
            reclaim: self.reclaim,
        }
    }
}

impl<Req, Resp, C> Consumer<Req, Resp, C>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    /// Connects and starts reading. Fails with [`ErrorKind::Config`] for bad settings and
    /// [`ErrorKind::Redis`] when Redis cannot be reached.
    ///
    /// [`ErrorKind::Config`]: crate::ErrorKind::Config
    /// [`ErrorKind::Redis`]: crate::ErrorKind::Redis
    pub async fn connect(queue: QueueConfig, config: ConsumerConfig) -> Result<Self> {
        config.validate()?;
        let parts = Shared::connect(&queue).await?;
        let name = config.name.clone().unwrap_or_else(ids::consumer_name);
        let wires = parts
            .into_iter()
            .map(|shared| Pelican::new(shared, &config))
            .collect::<Vec<_>>();
        let partitions = wires.len();
        let core = Core::start(wires, config.settings(), name).await;
        tracing::debug!(queue = %queue.name, consumer = %core.name(), partitions, "consumer started");
        Ok(Consumer {
            core,
            _types: PhantomData,
        })
    }

    /// This consumer's name in the group.
    pub fn name(&self) -> &str {
        self.core.name()
    }

    /// A handle that stops [`Consumer::serve`].
    pub fn stopper(&self) -> Stopper {
        self.core.stopper()
    }

    /// The next delivery; `Ok(None)` once the consumer is stopping. An error means the
    /// consumer cannot go on ([`ErrorKind::Internal`](crate::ErrorKind::Internal): one of
    /// its tasks panicked); shut it down or drop it.
    pub async fn next(&mut self) -> Result<Option<Delivery<Req, Resp, C>>> {
        Ok(self.core.next().await?.map(Delivery::new))
    }

    /// Runs `handler` on every delivery, at most `concurrency` at a time, until
    /// [`Stopper::stop`] is called; then shuts down gracefully (see
    /// [`Consumer::shutdown`]). A handler's `Ok` is the response; `Err` says whether to
    /// fail for good or retry; a handler that panics counts as a failed delivery (the
    /// request is released for redelivery) and never stops the consumer. Returns an
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) error if one of the consumer's
    /// own tasks panicked (after shutting down as well as it can).
    pub async fn serve<F, Fut>(self, concurrency: usize, handler: F) -> Result<()>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        self.core.serve(concurrency, handler).await
    }

    /// Stops gracefully: reads nothing new, waits up to `shutdown_timeout` for the
    /// deliveries in hand to be answered, then releases whatever is left so another
    /// consumer can take it at once, and writes every pending outcome. It leaves the
    /// group if it owns nothing then; otherwise the janitor removes it once the released
    /// entries have been taken over and `consumer_gc_after` has passed. Returns an
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) error if one of the consumer's
    /// tasks had panicked.
    ///
    /// A consumer dropped without `shutdown` still writes the outcomes (and releases)
    /// already given to it, in the background; deliveries not yet answered are released
    /// when they are dropped. What it read ahead and did not hand out, and deliveries a
    /// read delivered unseen, wait `claim_idle` before another consumer takes them.
    pub async fn shutdown(self) -> Result<()> {
        self.core.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pelican_testkit::{eventually, RedisServer};
    use std::time::Duration;

    /// A partitioned consumer's readers waiting on empty streams hold one prefetch slot
    /// each, not every free one: with 2 partitions and prefetch 4 (5 slots), both
    /// readers end up blocked in XREADGROUP and 3 slots stay free. (A reader that blocked
    /// with every free slot kept the other partition's reader from reading for a whole
    /// block.)
    #[tokio::test]
    async fn readers_waiting_on_empty_partitions_hold_one_slot_each() {
        let server = RedisServer::start();
        let q = QueueConfig::new(server.url(), "one-slot").with_partitions(2);
        let cfg = ConsumerConfig::default()
            .with_prefetch(4)
            .with_block(Duration::from_secs(60))
            .with_claim_idle(Duration::from_secs(240));
        let c = Consumer::<u64, u64>::connect(q, cfg).await.unwrap();
        let client = server.client();
        eventually(
            Duration::from_secs(10),
            "both readers blocked in XREADGROUP",
            || {
                let client = client.clone();
                async move {
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let list: String = redis::cmd("CLIENT")
                        .arg("LIST")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    list.lines()
                        .filter(|l| l.contains(" cmd=xreadgroup ") && l.contains(" flags=b "))
                        .count()
                        == 2
                }
            },
        )
        .await;
        assert_eq!(c.core.free_slots(), 3);
        drop(c);
    }
}
