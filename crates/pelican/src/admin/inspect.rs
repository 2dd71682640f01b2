//! One request's state: what `pelican inspect` shows.

use crate::error::{Error, ErrorKind, Result};
use crate::protocol::entry::{self, parse_entries};
use crate::protocol::index::IndexValue;
use crate::protocol::outcome::Outcome;
use crate::shared::Shared;
use redis::Value;
use serde::Serialize;
use std::fmt;

/// What Redis knows of one request (see [`super::Admin::inspect`]).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RequestInfo {
    /// Request id.
    pub rid: String,
    /// Where it stands: waiting, in work, lost, or finished with which outcome.
    pub state: RequestState,
    /// Its stream entry (while in flight).
    pub entry: Option<String>,
    /// Its deadline, ms since the epoch (while in flight).
    pub deadline_ms: Option<u64>,
    /// Producers waiting for it (while in flight).
    pub waiters: Vec<String>,
    /// The consumer holding it (`in_work`).
    pub consumer: Option<String>,
    /// Time since that consumer took it or renewed its lease, in ms (`in_work`).
    pub idle_ms: Option<u64>,
    /// Deliveries so far, this one included (`in_work`).
    pub deliveries: Option<u64>,
    /// Size of its body in bytes (while its entry is in the stream).
    pub body_len: Option<usize>,
    /// The response or the error message, first bytes, lossy UTF-8 (once finished).
    pub outcome_preview: Option<String>,
    /// How much longer Redis keeps this state, in ms (`None`: no expiry).
    pub ttl_ms: Option<u64>,
}

/// Where a request stands (serialized in snake case: `queued`, `in_work`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestState {
    /// No consumer took it yet.
    Queued,
    /// A consumer holds it.
    InWork,
    /// Its state names a stream entry that is gone: its producers' sweep submits it
    /// again, or it expires.
    Lost,
    /// Finished with a response (cached for `result_ttl`).
    Ok,
    /// The handler failed it for good.
    Error,
    /// Dead-lettered.
    Dead,
    /// Its deadline passed first.
    Expired,
}

impl RequestState {
    fn of_outcome(o: &Outcome) -> RequestState {
        match o {
            Outcome::Ok(_) | Outcome::Stored { .. } => RequestState::Ok,
            Outcome::Remote(_) => RequestState::Error,
            Outcome::Dead(_) => RequestState::Dead,
            Outcome::Expired(_) => RequestState::Expired,
        }
    }

    /// The snake-case name (`queued`, `in_work`, `lost`, `ok`, `error`, `dead`,
    /// `expired`).
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Queued => "queued",
            RequestState::InWork => "in_work",
            RequestState::Lost => "lost",
            RequestState::Ok => "ok",
            RequestState::Error => "error",
            RequestState::Dead => "dead",
            RequestState::Expired => "expired",
        }
    }

    /// Whether it has an outcome.
    pub fn is_finished(self) -> bool {
        !matches!(
            self,
            RequestState::Queued | RequestState::InWork | RequestState::Lost
        )
    }
}

impl fmt::Display for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much of an outcome `inspect` shows.
const PREVIEW_BYTES: usize = 200;

/// What Redis knows of request `rid` (see [`super::Admin::inspect`]).
pub(super) async fn inspect(sh: &Shared, rid: &str) -> Result<Option<RequestInfo>> {
    crate::protocol::request_id::validate_request_id(rid)?;
    let k = &sh.keys;
    let mut conn = sh.conn();
    let key = k.req(rid);
    let (value, pttl): (Option<Vec<u8>>, i64) = redis::pipe()
        .cmd("GET")
        .arg(&key)
        .cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::redis("reading the request", e))?;
    let Some(value) = value else { return Ok(None) };
    let mut info = RequestInfo {
        rid: rid.to_string(),
        state: RequestState::Queued,
        entry: None,
        deadline_ms: None,
        waiters: Vec::new(),
        consumer: None,
        idle_ms: None,
        deliveries: None,
        body_len: None,
        outcome_preview: None,
        ttl_ms: u64::try_from(pttl).ok(),
    };
    let p = match IndexValue::decode(&value) {
        Some(IndexValue::Pending(p)) => p,
        Some(IndexValue::Done(o)) => {
            info.state = RequestState::of_outcome(&o);
            let preview = match &o {
                // A stored answer: its first bytes, read from where it is stored.
                Outcome::Stored { name, .. } => {
                    let head: Option<Vec<u8>> = redis::cmd("GETRANGE")
                        .arg(k.body(name))
                        .arg(0)
                        .arg(PREVIEW_BYTES - 1)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| Error::redis("reading the stored answer", e))?;
                    match head {
                        Some(h) if !h.is_empty() => h,
                        _ => b"(its stored answer is gone)".to_vec(),
                    }
                }
                _ => value[1..].to_vec(),
            };
            let n = preview.len().min(PREVIEW_BYTES);
            info.outcome_preview = Some(String::from_utf8_lossy(&preview[..n]).into_owned());
            return Ok(Some(info));
        }
        None => {
            return Err(Error::new(
                ErrorKind::Redis,
                format!("{key} holds neither a pending state nor an outcome"),
            ))
        }
    };
    let sid = p.sid;
    info.deadline_ms = Some(p.deadline_ms);
    info.waiters = p.waiters;
    let (found, pending, stored_len): (Value, Value, usize) = redis::pipe()
        .cmd("XRANGE")
        .arg(&k.stream)
        .arg(&sid)
        .arg(&sid)
        .cmd("XPENDING")
        .arg(&k.stream)
        .arg(&k.group)
        .arg(&sid)
        .arg(&sid)
        .arg(1)
        .cmd("STRLEN")
        .arg(k.body(&sid))
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::redis("looking up the request's entry", e))?;
    let entry = parse_entries(&found).into_iter().next();
    info.body_len = entry.as_ref().and_then(|e| match e.get("body") {
        Some(b) => Some(b.len()),
        // stored beside the stream
        None => (e.get("bref") == Some(b"1")).then_some(stored_len),
    });
    // [[id, consumer, idle, deliveries]] once delivered
    let held = entry::array(&pending)
        .first()
        .map(|p| entry::array(p).to_vec())
        .filter(|p| p.len() >= 4);
    info.state = match (&entry, &held) {
        (None, _) => RequestState::Lost,
        (Some(_), Some(_)) => RequestState::InWork,
        (Some(_), None) => RequestState::Queued,
    };
    if let Some(p) = held {
        info.consumer = entry::string(&p[1]);
        info.idle_ms = entry::int(&p[2]).map(|i| i.max(0) as u64);
        info.deliveries = entry::int(&p[3]).map(|i| i.max(0) as u64);
    }
    info.entry = Some(sid);
    Ok(Some(info))
}
