//! One typed handle on a queue: its producers and consumers take their request and
//! response types from it, so the two sides cannot disagree on them by accident.

use crate::admin::Admin;
use crate::codec::{Codec, Json};
use crate::config::{ConsumerConfig, ProducerConfig, QueueConfig};
use crate::consumer::{Consumer, HandlerError, Job, Stopper};
use crate::error::{Error, ErrorKind, Result};
use crate::producer::Producer;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::marker::PhantomData;

/// A queue whose requests are `Req` and responses `Resp`, both encoded with `C`: the one
/// place the types are named. Creating it connects to nothing; cloning it is cheap.
///
/// ```no_run
/// use pelican::{ConsumerConfig, ProducerConfig, Queue, QueueConfig};
///
/// # async fn example() -> pelican::Result<()> {
/// let squares = Queue::<u64, u64>::new(QueueConfig::new("redis://127.0.0.1:6379", "squares"));
///
/// let worker = squares
///     .serve(ConsumerConfig::default(), 8, |n: u64, _job| async move { Ok(n * n) })
///     .await?;
/// let producer = squares.producer(ProducerConfig::default()).await?;
/// assert_eq!(producer.call(&12).await?, 144);
///
/// worker.stop().await?;
/// producer.shutdown().await
/// # }
/// ```
///
/// [`Producer::connect`] and [`Consumer::connect`] stay the way to build either side
/// alone.
pub struct Queue<Req, Resp, C: Codec = Json> {
    config: QueueConfig,
    _types: PhantomData<fn(Req) -> (Resp, C)>,
}

impl<Req, Resp, C: Codec> Clone for Queue<Req, Resp, C> {
    fn clone(&self) -> Self {
        Queue {
            config: self.config.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp, C: Codec> std::fmt::Debug for Queue<Req, Resp, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("config", &self.config)
            .field("req", &std::any::type_name::<Req>())
            .field("resp", &std::any::type_name::<Resp>())
            .field("codec", &std::any::type_name::<C>())
            .finish()
    }
}

impl<Req, Resp, C: Codec> Queue<Req, Resp, C> {
    /// The queue `config` describes, with requests `Req` and responses `Resp`.
    pub fn new(config: QueueConfig) -> Self {
        Queue {
            config,
            _types: PhantomData,
        }
    }

    /// Where the queue lives and its settings.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// An operator's handle on the queue ([`Admin::connect`]).
    pub async fn admin(&self) -> Result<Admin> {
        Admin::connect(self.config.clone()).await
    }
}

impl<Req, Resp, C> Queue<Req, Resp, C>
where
    Req: Serialize,
    Resp: DeserializeOwned,
    C: Codec,
{
    /// A producer of this queue ([`Producer::connect`]).
    pub async fn producer(&self, config: ProducerConfig) -> Result<Producer<Req, Resp, C>> {
        Producer::connect(self.config.clone(), config).await
    }
}

impl<Req, Resp, C> Queue<Req, Resp, C>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    C: Codec,
{
    /// A consumer of this queue ([`Consumer::connect`]), to [`Consumer::serve`] or to
    /// take deliveries one by one ([`Consumer::next`]).
    pub async fn consumer(&self, config: ConsumerConfig) -> Result<Consumer<Req, Resp, C>> {
        Consumer::connect(self.config.clone(), config).await
    }

    /// Connects a consumer and runs `handler` on every delivery, at most `concurrency` at
    /// a time, in a task of its own ([`Consumer::serve`] in `tokio::spawn`), until
    /// [`Worker::stop`]. Must be called within a Tokio runtime.
    pub async fn serve<F, Fut>(
        &self,
        config: ConsumerConfig,
        concurrency: usize,
        handler: F,
    ) -> Result<Worker>
    where
        F: Fn(Req, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Resp, HandlerError>> + Send + 'static,
    {
        let consumer = self.consumer(config).await?;
        let name = consumer.name().to_string();
        let stopper = consumer.stopper();
        let task = tokio::spawn(consumer.serve(concurrency, handler));
        Ok(Worker {
            name,
            stopper,
            task,
        })
    }
}

/// A consumer serving in a task of its own ([`Queue::serve`]). Dropping it leaves the
/// consumer serving; [`Worker::stop`] stops it gracefully.
#[must_use = "a dropped Worker keeps serving; stop it with Worker::stop"]
#[derive(Debug)]
pub struct Worker {
    name: String,
    stopper: Stopper,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Worker {
    /// The consumer's name in the group.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle that stops the worker from elsewhere (a signal handler); then
    /// [`Worker::wait`] returns.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Stops gracefully (see [`Consumer::shutdown`]) and waits until it has.
    pub async fn stop(self) -> Result<()> {
        self.stopper.stop();
        self.wait().await
    }

    /// Waits until the worker ends: stopped through a [`Stopper`], or failed (an
    /// [`ErrorKind::Internal`] error: one of the consumer's own tasks panicked).
    pub async fn wait(self) -> Result<()> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(Error::new(
                ErrorKind::Internal,
                format!("the worker's task ended abnormally: {e}"),
            )),
        }
    }
}
