//! Waking the reader out of its blocking read, so that released work is taken again at
//! once and a stop does not wait for the block to run out.
//!
//! Entries this consumer releases (a handler's retry, a panic, a dropped delivery) are
//! found by the reclaim scan, which the reader runs between reads. Left to itself, a
//! reader blocked on an empty stream would run it only when its block ran out
//! (the consumer's `block`): a retry waited for the block. So the outcome writer tells
//! [`Wake`] when the entries it released become reclaimable (at once, or after a
//! `retry_after` delay), and the reader, while it blocks, ends its read then
//! ([`read_or_wake`]: `CLIENT UNBLOCK`, `conn/unblock.rs`) and scans. A stop ends the read
//! the same way. A consumer that leaves with entries released wakes the other consumers'
//! readers of the partition ([`wake_others`]), which take them at once.

use super::state::State;
use super::wire::Wire;
use crate::conn::{unblock, OwnConn};
use crate::error::Result;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long after an unblock that found the read not blocked (it had not reached Redis
/// yet, or its answer was on the way) it is sent again; doubled each time up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// When the entries this consumer released (in one partition) become reclaimable.
#[derive(Default)]
pub(crate) struct Wake {
    dues: Mutex<BTreeSet<Instant>>,
    /// Whether `dues` holds any: the reader looks on every turn, without the lock.
    any: AtomicBool,
    /// Told of every new due time.
    notify: Notify,
    /// Entries were released after the consumer began to stop: leaving, it wakes the
    /// other consumers' readers.
    released_stopping: AtomicBool,
    /// Said once already that reads cannot be cut short.
    warned: AtomicBool,
}

impl Wake {
    /// Entries were released, reclaimable from `at` (`None`: the consumer does not
    /// reclaim); `stopping`: by a consumer that stops.
    pub(super) fn released(&self, at: Option<Instant>, stopping: bool) {
        if stopping {
            self.released_stopping.store(true, Ordering::SeqCst);
        }
        let Some(at) = at else { return };
        let mut dues = self.dues.lock().unwrap();
        dues.insert(at);
        self.any.store(true, Ordering::SeqCst);
        drop(dues);
        self.notify.notify_one();
    }

    /// Whether released entries are reclaimable by `now` (forgotten: the scan that
    /// follows takes them).
    pub(super) fn take_due(&self, now: Instant) -> bool {
        if !self.any.load(Ordering::SeqCst) {
            return false;
        }
        let mut dues = self.dues.lock().unwrap();
        let later = dues.split_off(&now);
        let due = !dues.is_empty();
        *dues = later;
        self.any.store(!dues.is_empty(), Ordering::SeqCst);
        due
    }

    /// When the next released entries become reclaimable.
    pub(super) fn next_due(&self) -> Option<Instant> {
        if !self.any.load(Ordering::SeqCst) {
            return None;
        }
        self.dues.lock().unwrap().first().copied()
    }

    /// Whether entries were released after the consumer began to stop.
    pub(super) fn released_stopping(&self) -> bool {
        self.released_stopping.load(Ordering::SeqCst)
    }

    /// An unblock failed with `e`: reads run their whole block from now on (this one) or
    /// until the connection is opened again.
    fn cannot_unblock(&self, e: &redis::RedisError) {
        if unblock::denied(e) && !self.warned.swap(true, Ordering::SeqCst) {
            tracing::warn!(error = %format_args!("{e:#}"), "the Redis user may not end a blocking read (ACL: add +client|id +client|unblock): released requests wait for the read's block to run out, and so does a stop");
        } else {
            tracing::debug!(error = %format_args!("{e:#}"), "could not end a blocking read early");
        }
    }
}

/// The reader's own connection and how to end its blocking reads.
pub(super) struct ReaderConn {
    conn: Option<OwnConn>,
    /// `None` when Redis would not say its client id (ACL): reads then run their whole
    /// block.
    client: Option<Client>,
}

/// Where the reader's connection is known to Redis.
pub(super) struct Client {
    /// Its client id (`CLIENT ID`), on its node.
    id: u64,
    /// On a cluster, that node (`host:port`).
    node: Option<String>,
}

impl ReaderConn {
    pub(super) fn new() -> ReaderConn {
        ReaderConn {
            conn: None,
            client: None,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.conn.is_some()
    }

    /// Opens the connection (a blocking one, `Place::blocking_connection`), names it and
    /// learns its id.
    pub(super) async fn open<W: Wire>(&mut self, inner: &State<W>) -> Result<()> {
        let place = inner.wire.place();
        let timeout = inner.settings.block + place.command_timeout;
        let (mut conn, node) = place.blocking_connection(timeout).await?;
        let name = place.reader_client(&inner.name);
        self.client = match unblock::identify(&mut conn, &name).await {
            Ok(id) => Some(Client { id, node }),
            // No reply: the connection is no good.
            Err(e) if e.code().is_none() => {
                return Err(crate::error::Error::redis(
                    "opening the reader's connection",
                    e,
                ))
            }
            Err(e) => {
                inner.wake.cannot_unblock(&e);
                None
            }
        };
        self.conn = Some(conn);
        Ok(())
    }

    /// The connection (open).
    pub(super) fn get(&mut self) -> &mut OwnConn {
        self.conn.as_mut().expect("connected")
    }

    /// The connection failed: the next turn opens another.
    pub(super) fn lost(&mut self) {
        self.conn = None;
        self.client = None;
    }

    /// The connection and how to end its blocking reads, for a read ([`read_or_wake`]).
    pub(super) fn for_read(&mut self) -> (&mut OwnConn, Option<&Client>) {
        (self.conn.as_mut().expect("connected"), self.client.as_ref())
    }
}

/// Awaits `read`, a read on the reader's connection (`client`) that blocks until
/// `ends` at the latest, ending its block early (`CLIENT UNBLOCK` on the shared
/// connection) when the consumer stops or, with reclaim on, when released entries become
/// reclaimable before `ends`. The read then returns at once, with nothing or with the
/// entries Redis had given it: what it returns is handled as usual.
pub(super) async fn read_or_wake<T, W: Wire>(
    inner: &State<W>,
    client: Option<&Client>,
    ends: Instant,
    read: impl Future<Output = T>,
) -> T {
    let Some(client) = client else {
        return read.await;
    };
    let wake = &inner.wake;
    tokio::pin!(read);
    // After an unblock that found nothing blocked: not before this.
    let mut again: Option<Instant> = None;
    let mut pause = FIRST_PAUSE;
    loop {
        let stopping = inner.stop.is_cancelled();
        let due = if stopping {
            Some(Instant::now())
        } else if inner.settings.reclaim {
            wake.next_due().filter(|&d| d < ends)
        } else {
            None
        };
        let at = due.map(|d| again.map_or(d, |a| a.max(d)));
        // No timer while there is nothing to wake for (most reads).
        let time_up = async move {
            match at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = &mut read => return r,
            _ = inner.stop.cancelled(), if !stopping => {}
            _ = wake.notify.notified(), if !stopping => {}
            _ = time_up => {
                let place = inner.wire.place();
                let node = client.node.as_deref();
                match unblock::unblock(&mut place.conn.clone(), &place.stream, node, client.id).await {
                    Ok(true) => return read.await,
                    Ok(false) => {
                        again = Some(Instant::now() + pause);
                        pause = (pause * 2).min(MAX_PAUSE);
                    }
                    Err(e) => {
                        wake.cannot_unblock(&e);
                        return read.await;
                    }
                }
            }
        }
    }
}

/// Wakes the readers of the other consumers of the partition (on its node), so that
/// they take what this one, `consumer`, released as it left. Best effort: a reader not
/// woken takes it when its block runs out.
pub(super) async fn wake_others<W: Wire>(wire: &W, consumer: &str) {
    let place = wire.place();
    let r = unblock::unblock_named(
        &mut place.conn.clone(),
        &place.stream,
        &place.reader_clients,
        &place.reader_client(consumer),
    )
    .await;
    match r {
        Ok(n) => tracing::debug!(woken = n, "woke the other consumers' readers"),
        Err(e) => {
            tracing::debug!(error = %format_args!("{e:#}"), "could not wake the other consumers' readers; they take the released requests when their blocks run out")
        }
    }
}
