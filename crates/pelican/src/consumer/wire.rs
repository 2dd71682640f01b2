//! What the consumer core asks of a wire format: the one trait between the core (slots,
//! read-ahead, leases, the batching writer, serve, shutdown, wake-ups) and a protocol
//! (pelican's own, `consumer/pelican/wire.rs`; Nitro's, `nitro/consumer/wire.rs`). Where
//! the stream lives and how to reach it is a [`Place`], the same for both.
//!
//! The core reads entries from one stream of a consumer group, turns each into a
//! delivery or an answer written at once ([`Wire::admit`]), hands deliveries to
//! handlers, and writes what they answer ([`Wire::complete`]) or give back
//! ([`Wire::release`]); it keeps what it holds alive ([`Wire::renew`]) and takes over idle
//! work ([`Wire::reclaim`]). A protocol says how each of those is written on its keys.

use crate::conn::{Conn, Endpoint, OwnConn};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::protocol::entry::RawEntry;
use crate::protocol::keys::Keys;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A wire format, as one partition of a queue (or one stream) connected.
pub(crate) trait Wire: Send + Sync + Sized + 'static {
    /// What a handler is told about its delivery besides the request.
    type Job: Clone + Send + Sync + 'static;
    /// What an entry let through to a handler keeps for its job.
    type Admitted: Send + 'static;
    /// An answer to write for one entry (an outcome and what the write needs of the
    /// entry).
    type Finish: Send + Sync + 'static;
    /// The reader's own parsing state, kept across reads.
    type ReadState: Default + Send + 'static;
    /// The field names of its entries (a read hands them out without a copy).
    type Fields: crate::conn::wire::FieldNames;

    /// Where its stream lives.
    fn place(&self) -> &Place;
    /// Where stored bodies live, for a wire that stores them (docs/PROTOCOL.md, "Stored
    /// bodies"): the reader fetches them after a read.
    fn stored_bodies(&self) -> Option<&Keys> {
        None
    }

    // Reading.

    /// Creates the consumer group again, after a read found it missing (`had_group`:
    /// a read had succeeded before, so it was lost).
    fn ensure_group(&self, had_group: bool) -> impl Future<Output = Result<()>> + Send;
    /// One scan for idle entries from `cursor`, claiming at most `count`, on the reader's
    /// connection `conn`. `idle`: the consumer holds nothing (it may take an entry for its
    /// last delivery).
    fn reclaim(
        &self,
        conn: &mut OwnConn,
        consumer: &str,
        settings: &Settings,
        cursor: &str,
        count: usize,
        idle: bool,
    ) -> impl Future<Output = Result<Reclaimed>> + Send;
    /// What to do with one entry read (`deliveries`: its delivery count, this one
    /// included).
    fn admit<Req: DeserializeOwned>(
        &self,
        entry: RawEntry,
        deliveries: u32,
        state: &mut Self::ReadState,
    ) -> Admit<Self, Req>;
    /// Dead-letters an entry that cannot be delivered ([`Admit::Reject`]).
    fn reject(
        &self,
        consumer: &str,
        sid: &str,
        reason: &str,
        deliveries: u32,
    ) -> impl Future<Output = ()> + Send {
        let _ = (consumer, sid, reason, deliveries);
        async {}
    }
    /// Whether entries let through go through [`Wire::join`] before a handler.
    fn joins(&self) -> bool {
        false
    }
    /// Dedup of the entries let through (id, tag): a verdict for each.
    fn join(
        &self,
        consumer: &str,
        entries: &[(Arc<str>, Option<Arc<str>>)],
    ) -> impl Future<Output = Result<Vec<Verdict>>> + Send {
        let _ = consumer;
        let n = entries.len();
        async move { Ok(vec![Verdict::Solve; n]) }
    }
    /// The job of an entry let through.
    fn job(
        &self,
        admitted: Self::Admitted,
        sid: Arc<str>,
        deliveries: u32,
        lease: crate::consumer::LeaseLost,
    ) -> Self::Job;
    /// A job's stream entry id.
    fn entry_id(job: &Self::Job) -> &Arc<str>;
    /// The span a handler of `job` runs in.
    fn span(&self, job: &Self::Job) -> tracing::Span;

    // Answering.

    /// The answer of a response, and the error to report with it when the response cannot
    /// be sent as it is (the entry is answered with an error then).
    fn respond<Resp: Serialize>(
        &self,
        job: &Self::Job,
        resp: &Resp,
    ) -> (Self::Finish, Option<Error>);
    /// The answer of a handler's failure.
    fn fail(&self, job: &Self::Job, message: String) -> Self::Finish;
    /// The outcome label of an answer (metrics).
    fn label(finish: &Self::Finish) -> &'static str;
    /// Writes the answers of `batch` (entry id, answer) in one call on the writer's
    /// connection `conn` (opened when `None`, dropped on a failure): whether each was
    /// recorded.
    fn complete(
        &self,
        conn: &mut Option<OwnConn>,
        batch: &[(&Arc<str>, &Self::Finish)],
    ) -> impl Future<Output = Result<Vec<Written>>> + Send;
    /// Hands `sids` back with an idle time of `idle_ms` (owner-checked), on the writer's
    /// connection.
    fn release(
        &self,
        conn: &mut Option<OwnConn>,
        consumer: &str,
        idle_ms: u64,
        sids: &[Arc<str>],
    ) -> impl Future<Output = Result<()>> + Send;
    /// Hands back everything `consumer` still owns, idle for `idle_ms` (shutdown): how
    /// many entries. Idempotent.
    fn release_all(
        &self,
        consumer: &str,
        idle_ms: u64,
    ) -> impl Future<Output = redis::RedisResult<u64>> + Send;
    /// Renews the leases of `held` (entry id, tag), owner-checked: the ids lost.
    /// Idempotent.
    fn renew(
        &self,
        consumer: &str,
        held: &[(Arc<str>, Option<Arc<str>>)],
    ) -> impl Future<Output = redis::RedisResult<Vec<String>>> + Send;

    // Upkeep.

    /// How often [`Wire::upkeep`] runs.
    fn upkeep_interval(&self) -> Duration;
    /// The slow housekeeping of the stream (janitor, removal of gone consumers).
    fn upkeep(&self, consumer: &str) -> impl Future<Output = ()> + Send;
}

/// Where a wire's stream lives, as the core needs it: its key and group, the shared
/// connection and how to open a task's own, the metrics, and the writers' turns.
pub(crate) struct Place {
    /// The stream's key (on a cluster, its slot decides the node).
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) conn: Conn,
    pub(crate) endpoint: Endpoint,
    pub(crate) metrics: Metrics,
    /// How long one command may take.
    pub(crate) command_timeout: Duration,
    /// The writers' turns on the node (one call on the wire per node at a time).
    pub(crate) write_gate: Arc<Semaphore>,
    /// What the names of every reader connection of the stream start with (`CLIENT
    /// SETNAME`).
    pub(crate) reader_clients: String,
}

impl Place {
    /// A connection of one task's own (the writer, the reader's extra fetches), to the
    /// node of the stream's slot.
    pub(crate) async fn own_connection(&self, timeout: Duration) -> Result<OwnConn> {
        self.endpoint
            .own_connection(&mut self.conn.clone(), &self.stream, timeout)
            .await
    }

    /// A connection for a blocking reader, and on a cluster the node it goes to.
    pub(crate) async fn blocking_connection(
        &self,
        timeout: Duration,
    ) -> Result<(OwnConn, Option<String>)> {
        self.endpoint
            .own_connection_at(&mut self.conn.clone(), &self.stream, timeout)
            .await
    }

    /// The name of consumer `consumer`'s reader connection.
    pub(crate) fn reader_client(&self, consumer: &str) -> String {
        format!("{}{consumer}", self.reader_clients)
    }
}

/// The settings the core runs by, from either wire's consumer config.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// An entry idle this long is taken over by another consumer.
    pub(crate) claim_idle: Duration,
    pub(crate) lease_interval: Duration,
    pub(crate) reclaim_interval: Duration,
    pub(crate) prefetch: usize,
    pub(crate) block: Duration,
    pub(crate) shutdown_timeout: Duration,
    /// Whether this consumer takes over idle and released entries.
    pub(crate) reclaim: bool,
}

/// What becomes of one entry read.
pub(crate) enum Admit<W: Wire, Req> {
    /// A handler's: its request, what its job keeps, and its tag (renewed and answered
    /// with it; Nitro's body hash with dedup).
    Handle {
        req: Req,
        admitted: W::Admitted,
        tag: Option<Arc<str>>,
    },
    /// Answered at once, no handler (expired, undecodable, past its retry limit).
    Answer(W::Finish),
    /// Dead-lettered with this reason ([`Wire::reject`]).
    Reject(String),
}

/// The dedup verdict on an entry let through.
#[cfg_attr(not(feature = "nitro"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A handler solves it.
    Solve,
    /// It waits for the entry that solves the same request (counted).
    Joined,
    /// It was answered from the cache (counted).
    Cached,
    /// Neither (it was no longer ours).
    Gone,
}

/// What one answer's write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// Recorded, and this many other entries answered with it (dedup).
    Recorded(u64),
    /// Another answer had been recorded first: dropped.
    Dropped,
    /// Its stored answer did not arrive: write it again.
    AnswerMissing,
}

/// One reclaim scan: the next cursor (`-`: the scan is done), the entries claimed with
/// their delivery counts (this one included), the id of the one claimed for its last
/// delivery (it runs alone), and whether an entry waits for its last delivery.
pub(crate) struct Reclaimed {
    pub(crate) next_cursor: String,
    pub(crate) claimed: Vec<(RawEntry, u32)>,
    pub(crate) solo: Option<String>,
    pub(crate) waiting_alone: bool,
}
