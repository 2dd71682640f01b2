//! The producer's lean connections. With dedup on, a body of `STORED_BODY_MIN` bytes or
//! more is stored by a plain SET sent in the same write as the submit call
//! (`protocol/stored`). On plain TCP the write goes out on a lean connection of the
//! producer's own, each body written from the caller's buffer ([`Framed`]). Other
//! connections (TLS, Unix sockets, a cluster's client) send the same commands through the
//! client library. The same lean connections send the XADDs of submissions without
//! dedup (`submit.rs`) and fetch stored answers (`answers.rs`).

use super::state::Inner;
use crate::conn::cluster::{slot_elsewhere, slot_moved_error};
use crate::conn::framed::{Framed, Joined};
use crate::conn::wire::{into_result, LeanConn};
use crate::conn::OwnConn;
use crate::protocol::scripts::ScriptCall;
use crate::protocol::stored::StoredBody;
use redis::{RedisResult, Value};
use std::sync::atomic::Ordering;

/// Most idle lean connections a producer keeps for stored bodies (one per submit call
/// on the wire at once).
const POOL: usize = 4;

/// Sends `frames` and then `last` (a command already encoded) in one write on a lean
/// connection and reads every reply; `None` when this queue's connections are not plain
/// TCP (the caller then uses the client library). A write of which any command was
/// refused because the slot is elsewhere is an error, [`slot_moved_error`].
async fn send(
    inner: &Inner,
    frames: &[Framed<'_>],
    last: Option<&[u8]>,
) -> Option<RedisResult<Vec<Value>>> {
    let (replies, moved) = match send_replies(inner, frames, last).await? {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    // On a cluster the partition's slot moved (failover, resharding): the error says
    // "dropped", so the call is sent again on a new connection, to the slot's master.
    Some(if moved {
        Err(slot_moved_error())
    } else {
        Ok(replies)
    })
}

/// [`send`], but every reply as it came, and whether any says the slot is elsewhere (the
/// connection is then dropped: the next one is opened to the slot's master then). The
/// commands of a write are refused or done one by one: a resharding may move the slot's
/// keys between two of them.
async fn send_replies<'f, F: std::borrow::Borrow<Framed<'f>>>(
    inner: &Inner,
    frames: &[F],
    last: Option<&[u8]>,
) -> Option<RedisResult<(Vec<Value>, bool)>> {
    if inner.no_lean_bodies.load(Ordering::Relaxed) {
        return None;
    }
    let mut conn = match take(inner).await? {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let joined = Joined::new(frames.iter().flat_map(|f| f.borrow().parts()).chain(last));
    let n = frames.len() + usize::from(last.is_some());
    let replies = match conn.send_parts(&joined.parts(), n).await {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    let moved = replies.iter().any(is_elsewhere);
    if !moved && conn.is_usable() {
        give_back(inner, conn);
    }
    Some(Ok((replies, moved)))
}

/// Whether a reply says its command's slot is elsewhere.
pub(super) fn is_elsewhere(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if slot_elsewhere(Some(e.code())))
}

/// Sends the SETs of `bodies` and then `call` in one write on a lean connection and
/// reads the call's reply; `None` when this queue's connections are not plain TCP. As
/// with the pipeline it replaces, the SETs' own replies are not checked: the script sees
/// whether each body is there.
pub(super) async fn submit_with_bodies<R>(
    inner: &Inner,
    call: &ScriptCall<'_, R>,
    bodies: &[StoredBody<'_>],
) -> Option<RedisResult<R>> {
    let frames: Vec<Framed<'_>> = bodies.iter().map(StoredBody::framed).collect();
    let packed = call.packed();
    let mut loaded = false;
    loop {
        let last = send(inner, &frames, Some(&packed))
            .await?
            .and_then(|mut replies| into_result(replies.pop().expect("one reply per command")));
        match call.reply_or_reload(last, loaded) {
            Some(r) => return Some(r),
            None => {
                // Loaded through the shared connection; the SETs are sent again with the
                // call (they are idempotent).
                if let Err(e) = call.load(&mut inner.shared.conn()).await {
                    return Some(Err(e));
                }
                loaded = true;
            }
        }
    }
}

/// Sends `xadds`, the XADDs of a submission without dedup (one per request, whatever the
/// size of its body, the body the last argument), in one write on a lean connection and
/// reads their replies, each as it came (a new entry's id, or an error: see
/// `send_replies`); `None` when this queue's connections are not plain TCP.
pub(super) async fn send_xadds(
    inner: &Inner,
    xadds: &[&Framed<'_>],
) -> Option<RedisResult<Vec<Value>>> {
    Some(
        send_replies(inner, xadds, None)
            .await?
            .map(|(replies, _)| replies),
    )
}

/// Runs one command on a lean connection of the pool, or on the shared connection when
/// the queue's connections are not lean ones. A server error reply is an `Err` with its
/// code; a slot that moved drops the connection, as in `send`.
pub(super) async fn query(inner: &Inner, cmd: &redis::Cmd) -> RedisResult<Value> {
    let packed = cmd.get_packed_command();
    match send(inner, &[], Some(&packed)).await {
        Some(r) => into_result(r?.pop().expect("one reply for one command")),
        None => cmd.query_async(&mut inner.shared.conn()).await,
    }
}

/// An idle lean connection, or a new one; `None` when the queue's connections are not
/// lean ones (remembered: the client library is used from then on).
async fn take(inner: &Inner) -> Option<RedisResult<LeanConn>> {
    if let Some(c) = inner.body_conns.lock().unwrap().pop() {
        return Some(Ok(c));
    }
    let sh = &inner.shared;
    match sh.own_connection(sh.queue.command_timeout).await {
        Ok(OwnConn::Lean(c)) => Some(Ok(c)),
        Ok(OwnConn::Client(_)) => {
            inner.no_lean_bodies.store(true, Ordering::Relaxed);
            None
        }
        Err(e) => Some(Err(redis::RedisError::from(std::io::Error::other(
            e.message_with_causes(),
        )))),
    }
}

fn give_back(inner: &Inner, conn: LeanConn) {
    let mut pool = inner.body_conns.lock().unwrap();
    if pool.len() < POOL {
        pool.push(conn);
    }
}
