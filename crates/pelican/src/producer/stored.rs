//! Stored bodies on the wire: with dedup on, a body of `STORED_BODY_MIN` bytes or more is
//! stored by a plain SET sent in the same write as the submit call (docs/PROTOCOL.md,
//! "Stored bodies"). On plain TCP the write goes out on a lean connection of the
//! producer's own, each body written from the caller's buffer (`writev`): no copy into a
//! command, a pipeline and a frame, as the client library makes (three copies of every
//! byte, the largest cost of a 100 KB submission). Other connections (TLS, Unix sockets,
//! a cluster's client) send the same commands through the client library.

use super::pending::Inner;
use crate::conn::wire::{bulk_header, LeanConn};
use crate::conn::OwnConn;
use crate::protocol::scripts::ScriptCall;
use redis::{RedisResult, Value};
use std::sync::atomic::Ordering;

/// The error of a write whose slot moved (see `send`).
pub(super) const SLOT_MOVED: &str = "the partition's slot moved to another node; connecting again";

/// Most idle lean connections a producer keeps for stored bodies (one per submit call
/// on the wire at once).
const POOL: usize = 4;

/// One body to store: its key, the bytes, its ttl (ms).
pub(super) struct StoredBody<'a> {
    pub(super) key: String,
    pub(super) body: &'a [u8],
    pub(super) ttl_ms: u64,
}

/// A command whose one large argument is written in place: the RESP bytes before it
/// (ending with its bulk header), the argument, the bytes after it.
pub(super) struct Framed<'a> {
    head: Vec<u8>,
    value: &'a [u8],
    tail: Vec<u8>,
}

impl<'a> Framed<'a> {
    /// The command `before... value after...`.
    pub(super) fn new(before: &[&[u8]], value: &'a [u8], after: &[&[u8]]) -> Framed<'a> {
        let arg = |out: &mut Vec<u8>, a: &[u8]| {
            out.extend_from_slice(&bulk_header(a.len()));
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        };
        let mut head = format!("*{}\r\n", before.len() + 1 + after.len()).into_bytes();
        for a in before {
            arg(&mut head, a);
        }
        head.extend_from_slice(&bulk_header(value.len()));
        let mut tail = b"\r\n".to_vec();
        for a in after {
            arg(&mut tail, a);
        }
        Framed { head, value, tail }
    }
}

/// Sends `frames` and then `last` (a command already encoded) in one write on a lean
/// connection and reads every reply; `None` when this queue's connections are not plain
/// TCP (the caller then uses the client library).
async fn send(
    inner: &Inner,
    frames: &[Framed<'_>],
    last: Option<&[u8]>,
) -> Option<RedisResult<Vec<Value>>> {
    if inner.no_lean_bodies.load(Ordering::Relaxed) {
        return None;
    }
    let mut conn = match take(inner).await? {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() * 3 + 1);
    for f in frames {
        parts.extend([f.head.as_slice(), f.value, f.tail.as_slice()]);
    }
    parts.extend(last);
    let n = frames.len() + usize::from(last.is_some());
    let r = conn.send_parts(&parts, n).await;
    // On a cluster the partition's slot moved (failover, resharding): nothing was done
    // (every key of the write is in that slot); the connection is dropped, and the error
    // says "dropped" so the call is sent again on a new one, to the slot's new master.
    let moved = r.as_ref().is_ok_and(|replies| {
        replies.iter().any(|v| {
            matches!(v, Value::ServerError(e) if matches!(e.code(), "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN"))
        })
    });
    if moved {
        return Some(Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            SLOT_MOVED,
        ))));
    }
    if conn.is_usable() {
        give_back(inner, conn);
    }
    Some(r)
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
    let ttls: Vec<String> = bodies.iter().map(|b| b.ttl_ms.to_string()).collect();
    let frames: Vec<Framed<'_>> = bodies
        .iter()
        .zip(&ttls)
        .map(|(b, ttl)| {
            Framed::new(
                &[b"SET", b.key.as_bytes()],
                b.body,
                &[b"PX", ttl.as_bytes()],
            )
        })
        .collect();
    let packed = call.packed();
    let mut loaded = false;
    loop {
        let last = match send(inner, &frames, Some(&packed)).await? {
            Ok(mut replies) => replies.pop().expect("one reply per command"),
            Err(e) => return Some(Err(e)),
        };
        match last {
            Value::ServerError(e) if e.code() == "NOSCRIPT" && !loaded => {
                // Loaded through the shared connection; the SETs are sent again with the
                // call (they are idempotent).
                if let Err(e) = call.load(&mut inner.shared.conn()).await {
                    return Some(Err(e));
                }
                loaded = true;
            }
            Value::ServerError(e) => return Some(Err(e.into())),
            v => return Some(call.read(v)),
        }
    }
}

/// Sends `xadds` (without dedup: one XADD per request, the body its last argument) in
/// one write on a lean connection and reads their replies, the new entries' ids; `None`
/// when this queue's connections are not plain TCP.
pub(super) async fn xadd_with_bodies(
    inner: &Inner,
    xadds: &[Framed<'_>],
) -> Option<RedisResult<Vec<String>>> {
    let replies = match send(inner, xadds, None).await? {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    Some(
        replies
            .into_iter()
            .map(|v| match v {
                Value::ServerError(e) => Err(redis::RedisError::from(e)),
                v => redis::from_redis_value::<String>(v).map_err(redis::RedisError::from),
            })
            .collect(),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_command_is_the_client_library_encoding() {
        let value = vec![7u8; 100_000];
        let f = Framed::new(&[b"SET", b"k"], &value, &[b"PX", b"123"]);
        let mut ours = f.head.clone();
        ours.extend_from_slice(f.value);
        ours.extend_from_slice(&f.tail);
        let theirs = redis::cmd("SET")
            .arg("k")
            .arg(&value)
            .arg("PX")
            .arg(123)
            .get_packed_command();
        assert_eq!(ours, theirs);
        let last = Framed::new(&[b"XADD", b"s", b"*", b"body"], b"", &[]);
        let mut ours = last.head.clone();
        ours.extend_from_slice(&last.tail);
        let theirs = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("body")
            .arg("")
            .get_packed_command();
        assert_eq!(ours, theirs);
    }
}
