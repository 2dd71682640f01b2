//! Outcomes with stored answers, written as one transaction (docs/PROTOCOL.md, "Stored
//! answers"): `MULTI`, the answers' SETs, the `complete.lua` call, `EXEC`, in one write.
//!
//! Sent one after the other, the SETs could be done and the call not: refused after them
//! (`CLUSTERDOWN` while a master fails over, found by the reliability suite: the cluster
//! went down between Redis reading the SETs and the call of a 20 KB write), or lost with a
//! SIGKILLed master whose replica had the SETs and not the call. The writer then sends the
//! outcomes again under new names, and the first answers stay unread for the result ttl
//! and a minute. In a transaction, a command refused when queued discards the whole of it
//! (`EXECABORT`), and a replica applies a transaction whole or not at all: an answer is
//! not written without the call that records it or deletes it (short of the script
//! failing once it runs, on a broken queue).

use super::StoredBody;
use crate::conn::cluster::slot_elsewhere;
use crate::conn::framed::Framed;
use crate::conn::wire::into_result;
use crate::conn::{Conn, OwnConn};
use crate::protocol::scripts::ScriptCall;
use redis::{ErrorKind, RedisError, RedisResult, Value};
use std::sync::atomic::{AtomicBool, Ordering};

const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";

/// Whether this process has said that its user may not run `MULTI` (said once).
static NO_MULTI_SAID: AtomicBool = AtomicBool::new(false);

/// Runs `call` after the SETs of `answers`, all in one transaction on `conn`; when Redis
/// does not know the script, it is loaded through `loader` and the whole transaction sent
/// again (the SETs are idempotent: same names, same values).
pub(crate) async fn invoke_with_answers<R>(
    call: &ScriptCall<'_, R>,
    conn: &mut OwnConn,
    loader: &mut Conn,
    answers: &[StoredBody<'_>],
) -> RedisResult<R> {
    let mut loaded = false;
    loop {
        let replies = send(call, conn, answers).await?;
        match call.reply_or_reload(call_reply(replies), loaded) {
            Some(r) => return r,
            None => {
                call.load(loader).await?;
                loaded = true;
            }
        }
    }
}

/// Sends `MULTI`, the SETs, the call and `EXEC` in one write: every reply, in order.
async fn send<R>(
    call: &ScriptCall<'_, R>,
    conn: &mut OwnConn,
    answers: &[StoredBody<'_>],
) -> RedisResult<Vec<RedisResult<Value>>> {
    match conn {
        OwnConn::Lean(c) => {
            // Each answer written from where it lies.
            let frames: Vec<Framed<'_>> = answers.iter().map(StoredBody::framed).collect();
            let packed = call.packed();
            let mut parts: Vec<&[u8]> = Vec::with_capacity(3 * frames.len() + 3);
            parts.push(MULTI);
            parts.extend(frames.iter().flat_map(Framed::parts));
            parts.push(&packed);
            parts.push(EXEC);
            let replies = c.send_parts(&parts, answers.len() + 3).await?;
            Ok(replies.into_iter().map(into_result).collect())
        }
        OwnConn::Client(c) => {
            let mut before = Vec::with_capacity(answers.len() + 1);
            before.push(redis::cmd("MULTI"));
            before.extend(answers.iter().map(StoredBody::cmd));
            let mut pipe = call.after(before);
            pipe.add_command(redis::cmd("EXEC"));
            pipe.query_async(c).await
        }
    }
}

/// The call's reply, from the replies to `MULTI`, the SETs, the call and `EXEC`.
///
/// - Done: `EXEC` answers with each command's reply, the call's last.
/// - A command refused when queued (`EXECABORT`), or `EXEC` refused: nothing was done.
///   The refusal that says the slot is elsewhere comes back before any other (the
///   connection is then dropped and the write sent to the slot's master), else the first.
/// - `MULTI` refused (a user without `+multi`: README.md's least-privilege ACL line had
///   none before the transaction): the commands after it ran one by one, as the writer
///   sent them before, and `EXEC` was refused; the call's own reply is read.
fn call_reply(replies: Vec<RedisResult<Value>>) -> RedisResult<Value> {
    let mut replies = replies.into_iter();
    let (Some(multi), Some(exec)) = (replies.next(), replies.next_back()) else {
        return Err(unexpected("fewer replies than commands"));
    };
    let mut queued: Vec<RedisResult<Value>> = replies.collect();
    if let Err(e) = multi {
        if !NO_MULTI_SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "MULTI refused: stored answers are written without a transaction (add +multi +exec to the user's ACL; see README.md)");
        }
        return queued
            .pop()
            .unwrap_or_else(|| Err(unexpected("no reply to the call")));
    }
    match exec {
        Ok(Value::Array(mut done)) => match done.pop() {
            Some(v) if done.len() + 1 == queued.len() => into_result(v),
            _ => Err(unexpected("EXEC answered for other commands than sent")),
        },
        Ok(_) => Err(unexpected("EXEC answered with no array")),
        Err(e) => {
            let refusals = queued.into_iter().filter_map(Result::err);
            let mut first = None;
            for r in refusals {
                if slot_elsewhere(r.code()) {
                    return Err(r);
                }
                first.get_or_insert(r);
            }
            Err(first.unwrap_or(e))
        }
    }
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "writing outcomes as a transaction",
        what.to_string(),
    ))
}

#[cfg(test)]
mod tests;
