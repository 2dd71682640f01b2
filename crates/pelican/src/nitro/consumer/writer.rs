//! The answer writer: batches answers into one `nitro_answer.lua` call and hand-backs into
//! one `nitro_release.lua` call, on a connection of its own. Deliveries and the reader
//! reach it through a [`WriterHandle`].

use super::lease::Leases;
use crate::clock::ms;
use crate::conn::retry::Backoff;
use crate::conn::OwnConn;
use crate::error::{Error, ErrorKind, Result};
use crate::nitro::link::Link;
use crate::protocol::entry;
use crate::protocol::scripts::ScriptCall;
use redis::{RedisResult, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Most answers or releases written in one call.
const MAX_BATCH: usize = 256;

pub(super) enum WriteJob {
    Answer(Answer),
    Release(Release),
    Flush(oneshot::Sender<()>),
}

/// Who wrote an answer: the handler (it answers every entry of the body's dedup job), or
/// the retry limit (it ends the job only when the entry is the job's solver).
#[derive(Clone, Copy)]
pub(super) enum Mode {
    Handler,
    RetryLimit,
}

/// A result key (JSON) or an error key (plain text).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Result,
    Error,
}

/// An answer to write for one entry.
pub(super) struct Answer {
    pub(super) id: String,
    pub(super) hash: Option<String>,
    pub(super) mode: Mode,
    pub(super) kind: Kind,
    pub(super) value: Vec<u8>,
    /// Learns whether this entry was answered (false: it was not pending any more).
    pub(super) ack: Option<oneshot::Sender<Result<bool>>>,
}

/// An entry to hand back, reclaimable once its idle time reaches the idletime.
pub(super) struct Release {
    pub(super) id: String,
    pub(super) idle_ms: u64,
    pub(super) ack: Option<oneshot::Sender<Result<()>>>,
}

/// The way to the writer.
pub(super) struct WriterHandle {
    tx: mpsc::UnboundedSender<WriteJob>,
    leases: Arc<Leases>,
    pub(super) idletime: Duration,
}

impl WriterHandle {
    pub(super) fn new(
        tx: mpsc::UnboundedSender<WriteJob>,
        leases: Arc<Leases>,
        idletime: Duration,
    ) -> Self {
        WriterHandle {
            tx,
            leases,
            idletime,
        }
    }

    /// Hands a job to the writer; the entry needs no more heartbeats.
    pub(super) fn send(&self, job: WriteJob) {
        match &job {
            WriteJob::Answer(a) => self.leases.finishing(&a.id),
            WriteJob::Release(r) => self.leases.finishing(&r.id),
            WriteJob::Flush(_) => {}
        }
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            // The writer is gone: the entry stays pending and is taken over after the
            // idletime.
            let gone = || Error::new(ErrorKind::Shutdown, "the consumer is shut down");
            match job {
                WriteJob::Answer(Answer { ack: Some(a), .. }) => {
                    let _ = a.send(Err(gone()));
                }
                WriteJob::Release(Release { ack: Some(a), .. }) => {
                    let _ = a.send(Err(gone()));
                }
                _ => {}
            }
        }
    }
}

/// What the writer task works with.
pub(super) struct WriterTask {
    pub(super) link: Arc<Link>,
    pub(super) name: String,
    pub(super) idletime: Duration,
    pub(super) response_ttl: Duration,
    pub(super) cache_ttl: Option<Duration>,
    pub(super) leases: Arc<Leases>,
    pub(super) stop: CancellationToken,
}

/// Writes answers and releases in batches: whatever queued up while the previous call
/// was on the wire goes in the next one.
pub(super) async fn run(w: WriterTask, mut rx: mpsc::UnboundedReceiver<WriteJob>) {
    let mut backoff = Backoff::new();
    let mut conn: Option<OwnConn> = None;
    let mut jobs = Vec::new();
    while rx.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        let mut answers = Vec::new();
        let mut releases = Vec::new();
        let mut flushes = Vec::new();
        for j in jobs.drain(..) {
            match j {
                WriteJob::Answer(a) => answers.push(a),
                WriteJob::Release(r) => releases.push(r),
                WriteJob::Flush(tx) => flushes.push(tx),
            }
        }
        if !answers.is_empty() {
            // Retry while the entries could still be ours; after the idletime another
            // consumer has taken them over.
            let give_up = Instant::now() + w.idletime;
            let result = loop {
                match write_answers(&w, &mut conn, &answers).await {
                    Ok(r) => break Ok(r),
                    Err(e)
                        if e.is_retryable()
                            && Instant::now() < give_up
                            && !w.stop.is_cancelled() =>
                    {
                        tracing::warn!(error = %format_args!("{e:#}"), "writing answers failed; retrying");
                        tokio::time::sleep(backoff.next()).await;
                    }
                    Err(e) => break Err(e),
                }
            };
            backoff.reset();
            let m = &w.link.metrics;
            for (i, a) in answers.into_iter().enumerate() {
                w.leases.forget(&a.id);
                let r = match &result {
                    Ok(flags) => {
                        let (mine, others) = flags.get(i).copied().unwrap_or((false, 0));
                        let label = if a.kind == Kind::Result {
                            "ok"
                        } else {
                            "error"
                        };
                        if mine {
                            m.completed(label, 1);
                        } else {
                            m.duplicate_dropped(1);
                        }
                        m.completed(label, others);
                        Ok(mine)
                    }
                    Err(e) => Err(e.clone()),
                };
                if let Some(ack) = a.ack {
                    let _ = ack.send(r);
                }
            }
        }
        if !releases.is_empty() {
            let mut by_idle: HashMap<u64, Vec<String>> = HashMap::new();
            for r in &releases {
                by_idle.entry(r.idle_ms).or_default().push(r.id.clone());
            }
            let mut result = Ok(());
            for (idle, ids) in by_idle {
                if let Err(e) = release(&w, &mut conn, idle, &ids).await {
                    tracing::warn!(error = %format_args!("{e:#}"), "handing entries back failed; they are taken over after the idletime");
                    result = Err(e);
                }
            }
            for r in releases {
                w.leases.forget(&r.id);
                if let Some(ack) = r.ack {
                    let _ = ack.send(result.clone());
                }
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

/// One `nitro_answer.lua` call: per answer, whether its own entry was answered and how
/// many other entries of its dedup job were.
async fn write_answers(
    w: &WriterTask,
    conn: &mut Option<OwnConn>,
    answers: &[Answer],
) -> Result<Vec<(bool, u64)>> {
    let k = &w.link.keys;
    let mut call = ScriptCall::script(
        &w.link.scripts.answer,
        &[
            &k.stream,
            &k.result_prefix,
            &k.error_prefix,
            &k.job_prefix,
            &k.cache_prefix,
        ],
        answer_reply,
    );
    call.arg(k.group())
        .arg(ms(w.response_ttl))
        .arg(w.cache_ttl.map_or(0, ms));
    for a in answers {
        call.arg(&a.id)
            .arg(a.hash.as_deref().unwrap_or(""))
            .arg(match a.mode {
                Mode::Handler => "h",
                Mode::RetryLimit => "r",
            })
            .arg(match a.kind {
                Kind::Result => "r",
                Kind::Error => "e",
            })
            .arg(a.value.as_slice());
    }
    eval_own(w, conn, &call)
        .await
        .map_err(|e| Error::redis("writing answers", e))
}

/// `nitro_answer.lua`'s reply: per answer, `[1 if its own entry was answered, how many
/// other entries of its dedup job were]`.
fn answer_reply(v: Value) -> RedisResult<Vec<(bool, u64)>> {
    Ok(entry::array(&v)
        .iter()
        .map(|pair| {
            let p = entry::array(pair);
            let mine = p.first().and_then(entry::int) == Some(1);
            let others = p.get(1).and_then(entry::int).unwrap_or(0).max(0) as u64;
            (mine, others)
        })
        .collect())
}

async fn release(
    w: &WriterTask,
    conn: &mut Option<OwnConn>,
    idle_ms: u64,
    ids: &[String],
) -> Result<()> {
    let k = &w.link.keys;
    let _gate = w.leases.gate.lock().await;
    let mut call = ScriptCall::script(&w.link.scripts.release, &[&k.stream], |_| Ok(()));
    call.arg(k.group()).arg(&w.name).arg(idle_ms).arg("0");
    for id in ids {
        call.arg(id);
    }
    eval_own(w, conn, &call)
        .await
        .map_err(|e| Error::redis("handing entries back", e))
}

/// Runs a script call on the writer's own connection, opening it when needed
/// ([`crate::conn::on_own`]: one that failed, or whose slot is served elsewhere now, is
/// dropped, and the next call opens a new one).
async fn eval_own<R>(
    w: &WriterTask,
    conn: &mut Option<OwnConn>,
    call: &ScriptCall<'_, R>,
) -> RedisResult<R> {
    let link = &w.link;
    let open = async || link.own_connection(link.config.command_timeout).await;
    crate::conn::on_own(conn, open, async |c| {
        call.invoke_on(c, &mut link.conn()).await
    })
    .await
}
