//! One producer per queue, made on the first call that names the queue and shared by
//! every connection after it: thousands of waiting callers cost one reply stream, not
//! thousands. A producer is `Producer<Bytes, Bytes, Raw>`: the gateway passes bodies
//! through as they came (JSON checked and compacted first, `input.rs`), so it serves a
//! queue of JSON requests and a queue of raw bytes alike.

use crate::cli::Global;
use crate::http::{ApiError, Kind};
use pelican::{Bytes, Producer, ProducerConfig, Raw};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// The gateway's producer of one queue.
pub type GatewayProducer = Producer<Bytes, Bytes, Raw>;

/// After a producer could not connect (Redis down), calls naming its queue are refused at
/// once for this long, rather than each waiting for a connection to time out.
const RETRY_CONNECT_AFTER: Duration = Duration::from_secs(1);

/// A queue's producer, once connected.
#[derive(Default)]
pub struct Slot {
    producer: OnceCell<GatewayProducer>,
    /// The last failed attempt to connect, and its error.
    failed: Mutex<Option<(Instant, ApiError)>>,
}

/// The queues served and their producers.
pub struct Queues {
    global: Global,
    /// Only these, when not empty.
    allowed: Vec<String>,
    max_timeout: Duration,
    /// The queues' `max_body_bytes` (a queue setting of the command line: the same for
    /// every queue).
    max_body_bytes: usize,
    slots: RwLock<HashMap<String, Arc<Slot>>>,
}

impl Queues {
    /// Queues on `global`'s Redis, with its queue settings; `allowed` empty: any queue.
    /// Checks the settings and the names in `allowed`.
    pub fn new(
        global: &Global,
        allowed: Vec<String>,
        max_timeout: Duration,
    ) -> Result<Queues, ApiError> {
        let mut queues = Queues {
            global: global.clone(),
            allowed,
            max_timeout,
            max_body_bytes: 0,
            slots: RwLock::new(HashMap::new()),
        };
        for q in &queues.allowed {
            queues.config(q)?;
        }
        queues.max_body_bytes = queues.config("gateway-check")?.max_body_bytes;
        Ok(queues)
    }

    /// Largest body a call may bring.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// The queue's configuration: 400 for a name that cannot be a queue's.
    fn config(&self, name: &str) -> Result<pelican::QueueConfig, ApiError> {
        pelican::QueueConfig::new(self.global.redis.as_str(), name)
            .validate()
            .map_err(|e| {
                ApiError::new(
                    Kind::BadRequest,
                    format!("{name:?} is not a queue name: {}", e.message()),
                )
            })?;
        let mut g = self.global.clone();
        g.queue = name.to_string();
        g.queue_config()
            .map_err(|e| ApiError::new(Kind::BadRequest, e.message))
    }

    /// Queue `name`'s slot: 400 for a bad name, 404 for a queue this gateway does not
    /// serve. The name is checked once, when its slot is made.
    pub fn slot(&self, name: &str) -> Result<Arc<Slot>, ApiError> {
        if let Some(slot) = self.slots.read().expect("slots lock").get(name) {
            return Ok(slot.clone());
        }
        self.check(name)?;
        Ok(self
            .slots
            .write()
            .expect("slots lock")
            .entry(name.to_string())
            .or_default()
            .clone())
    }

    /// The producer of queue `name` (its `slot`), connected on first use: 503 while
    /// Redis cannot be reached.
    pub async fn producer(&self, name: &str, slot: &Slot) -> Result<GatewayProducer, ApiError> {
        if let Some(p) = slot.producer.get() {
            return Ok(p.clone());
        }
        if let Some((at, e)) = slot.failed.lock().expect("slot lock").as_ref() {
            if at.elapsed() < RETRY_CONNECT_AFTER {
                return Err(e.clone());
            }
        }
        let made = slot
            .producer
            .get_or_try_init(|| async {
                let queue = self.config(name)?;
                // Every call brings its own timeout (CallOptions); the producer's is the
                // longest one allowed.
                let config = ProducerConfig::default().with_request_timeout(self.max_timeout);
                let p = Producer::connect(queue, config).await.map_err(|e| {
                    let e = ApiError::from(&e);
                    *slot.failed.lock().expect("slot lock") = Some((Instant::now(), e.clone()));
                    e
                })?;
                tracing::info!(queue = name, producer = p.id(), "gateway: serving a queue");
                Ok::<_, ApiError>(p)
            })
            .await?;
        Ok(made.clone())
    }

    /// A name this gateway serves.
    fn check(&self, name: &str) -> Result<(), ApiError> {
        self.config(name)?;
        if !self.allowed.is_empty() && !self.allowed.iter().any(|q| q == name) {
            return Err(ApiError::new(
                Kind::NotFound,
                format!(
                    "this gateway serves queues {} only, not {name:?}",
                    self.allowed.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// Stops every producer: requests still waited for are withdrawn unless another
    /// producer waits for them too (detached ones are not: they run).
    pub async fn shutdown(&self) {
        let slots: Vec<(String, Arc<Slot>)> =
            self.slots.write().expect("slots lock").drain().collect();
        for (name, slot) in slots {
            let Some(slot) = Arc::into_inner(slot) else {
                continue;
            };
            if let Some(p) = slot.producer.into_inner() {
                if let Err(e) = p.shutdown().await {
                    tracing::warn!(queue = name, error = %format_args!("{e:#}"), "gateway: stopping a producer");
                }
            }
        }
    }
}
