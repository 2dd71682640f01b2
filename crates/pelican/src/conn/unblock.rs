//! Ending a blocking read before its block runs out.
//!
//! A blocked `XREADGROUP` holds its connection until an entry comes or its block runs out;
//! nothing sent on that connection is read meanwhile. So a task that must wake a blocked
//! reader (released work to take, a stop) does it from another connection: the reader's
//! connection is named (`CLIENT SETNAME`) and its client id remembered (`CLIENT ID`) when
//! it opens, and `CLIENT UNBLOCK <id>`, sent on the shared connection to the same node,
//! makes the read return at once as if its block had run out: with nothing, or with the
//! entries Redis had just given it (a read served before the unblock arrives is answered
//! as usual, and the unblock finds nothing blocked). A reconnected reader has a new id.
//!
//! A user without `client|id` or `client|unblock` (ACL) still works: its reads end when
//! their block runs out, as they did before (one warning).

use super::{Conn, OwnConn};
use redis::RedisResult;

/// Names the reader's connection `name` and returns its client id. A refused `CLIENT
/// SETNAME` (ACL) is not an error: the name only lets others find the connection.
pub(crate) async fn identify(conn: &mut OwnConn, name: &str) -> RedisResult<u64> {
    if let Err(e) = conn
        .query(redis::cmd("CLIENT").arg("SETNAME").arg(name))
        .await
    {
        if e.code().is_none() {
            return Err(e);
        }
        tracing::debug!(error = %format_args!("{e:#}"), "cannot name the reader's connection");
    }
    let id = conn.query(redis::cmd("CLIENT").arg("ID")).await?;
    redis::from_redis_value(id).map_err(Into::into)
}

/// Asks `node` (on a cluster: the node the connection of client `id` went to; `None`:
/// the master of `key`'s slot) to end the block of client `id`: `true` if it was blocked
/// (its read returns at once), `false` if it was not (its read had not reached Redis yet,
/// or was answered already). Client ids are a node's own: sent elsewhere, it could end
/// another client's block.
pub(crate) async fn unblock(
    shared: &mut Conn,
    key: &str,
    node: Option<&str>,
    id: u64,
) -> RedisResult<bool> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("UNBLOCK").arg(id);
    let n: i64 = redis::from_redis_value(shared.query_on(cmd, key, node).await?)?;
    Ok(n == 1)
}

/// Ends the blocks of the connections on the node that holds `key` whose names start with
/// `prefix`, but `except`'s: how many were blocked. One `CLIENT LIST`, then an unblock
/// for each (a rare path: a consumer leaving wakes the others).
pub(crate) async fn unblock_named(
    shared: &mut Conn,
    key: &str,
    prefix: &str,
    except: &str,
) -> RedisResult<usize> {
    let mut list = redis::cmd("CLIENT");
    list.arg("LIST").arg("TYPE").arg("normal");
    let list: String = redis::from_redis_value(shared.query_near(list, key).await?)?;
    let mut woken = 0;
    for id in named(&list, prefix, except) {
        if unblock(shared, key, None, id).await? {
            woken += 1;
        }
    }
    Ok(woken)
}

/// The ids of the clients of a `CLIENT LIST` reply whose names start with `prefix` and
/// are not `except`.
fn named(list: &str, prefix: &str, except: &str) -> Vec<u64> {
    list.lines()
        .filter_map(|line| {
            let field = |f: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            };
            let name = field("name")?;
            (name.starts_with(prefix) && name != except)
                .then(|| field("id")?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Whether `e` says the user may not run the command (ACL).
pub(crate) fn denied(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("NOPERM")
}

#[cfg(test)]
mod tests {
    use super::named;

    #[test]
    fn clients_are_found_by_name_prefix() {
        let list = "id=3 addr=127.0.0.1:1 laddr=x fd=8 name=pelican-reader:a:c1 age=1 flags=b cmd=xreadgroup\n\
                    id=4 addr=127.0.0.1:2 laddr=x fd=9 name=pelican-reader:a:c2 age=1 flags=N cmd=client|id\n\
                    id=5 addr=127.0.0.1:3 laddr=x fd=10 name= age=1 flags=N cmd=get\n\
                    id=6 addr=127.0.0.1:4 laddr=x fd=11 name=pelican-reader:b:c3 age=1 flags=b cmd=xreadgroup\n";
        assert_eq!(named(list, "pelican-reader:a:", "pelican-reader:a:c1"), [4]);
        assert_eq!(named(list, "pelican-reader:", ""), [3, 4, 6]);
        assert!(named(list, "other", "").is_empty());
    }
}
