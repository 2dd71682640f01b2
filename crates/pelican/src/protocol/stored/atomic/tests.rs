//! The transaction of outcomes and their stored answers: how its replies are read, and
//! against a real redis-server, that an answer is never written without its call.

use super::*;
use crate::clock::now_ms;
use crate::conn::wire::LeanConn;
use crate::protocol::keys::Keys;
use crate::protocol::outcome::Outcome;
use crate::protocol::scripts::{Complete, CompleteEntry, Completed, Scripts};
use pelican_testkit::{unique_name, RedisServer};
use redis::aio::ConnectionManager;
use std::time::Duration;

fn reply(resp: &str) -> RedisResult<Value> {
    into_result(redis::parse_redis_value(resp.as_bytes()).expect("RESP"))
}

fn replies(resps: &[&str]) -> Vec<RedisResult<Value>> {
    resps.iter().map(|r| reply(r)).collect()
}

#[test]
fn a_transaction_done_answers_with_the_calls_reply() {
    let done = replies(&[
        "+OK\r\n",
        "+QUEUED\r\n",
        "+QUEUED\r\n",
        "*2\r\n+OK\r\n*1\r\n:1\r\n",
    ]);
    assert_eq!(call_reply(done).unwrap(), Value::Array(vec![Value::Int(1)]));
    // the call failing inside (NOSCRIPT: loaded and sent again) is the call's error
    let noscript = replies(&[
        "+OK\r\n",
        "+QUEUED\r\n",
        "+QUEUED\r\n",
        "*2\r\n+OK\r\n-NOSCRIPT No matching script\r\n",
    ]);
    assert_eq!(call_reply(noscript).unwrap_err().code(), Some("NOSCRIPT"));
    let short = replies(&["+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "*1\r\n:1\r\n"]);
    assert!(
        call_reply(short).is_err(),
        "EXEC must answer for every command"
    );
}

#[test]
fn a_transaction_refused_says_why_a_moved_slot_first() {
    let exec_abort = "-EXECABORT Transaction discarded because of previous errors.\r\n";
    let oom_then_down = replies(&[
        "+OK\r\n",
        "-OOM command not allowed\r\n",
        "-CLUSTERDOWN The cluster is down\r\n",
        exec_abort,
    ]);
    let e = call_reply(oom_then_down).unwrap_err();
    assert_eq!(
        e.code(),
        Some("CLUSTERDOWN"),
        "the connection is to be dropped"
    );
    let denied = replies(&[
        "+OK\r\n",
        "+QUEUED\r\n",
        "-NOPERM no permissions\r\n",
        exec_abort,
    ]);
    assert_eq!(call_reply(denied).unwrap_err().code(), Some("NOPERM"));
    let exec_refused = replies(&[
        "+OK\r\n",
        "+QUEUED\r\n",
        "+QUEUED\r\n",
        "-MOVED 3999 127.0.0.1:7001\r\n",
    ]);
    assert_eq!(call_reply(exec_refused).unwrap_err().code(), Some("MOVED"));
}

#[test]
fn without_multi_the_calls_own_reply_is_read() {
    let unprivileged = replies(&[
        "-NOPERM this user has no permissions to run the 'multi' command\r\n",
        "+OK\r\n",
        "*1\r\n:1\r\n",
        "-ERR EXEC without MULTI\r\n",
    ]);
    assert_eq!(
        call_reply(unprivileged).unwrap(),
        Value::Array(vec![Value::Int(1)])
    );
}

/// A stream with one entry delivered to consumer `c`, as a consumer holds it, and the
/// call that completes it with a stored answer.
struct Held {
    server: RedisServer,
    keys: Keys,
    scripts: Scripts,
    sid: String,
}

const ANSWER_TTL_MS: u64 = 60_000;

async fn held() -> Held {
    let server = RedisServer::start();
    let keys = Keys::new("pelican", &unique_name("atomic"));
    let mut c = ConnectionManager::new(server.client()).await.unwrap();
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(&keys.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut c)
        .await
        .unwrap();
    let head = format!("r1;p1;{};{};0", now_ms() + 60_000, now_ms());
    let sid: String = redis::cmd("XADD")
        .arg(&keys.stream)
        .arg("*")
        .arg("head")
        .arg(head)
        .arg("body")
        .arg("{}")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&keys.group)
        .arg("c")
        .arg("STREAMS")
        .arg(&keys.stream)
        .arg(">")
        .query_async(&mut c)
        .await
        .unwrap();
    Held {
        server,
        scripts: Scripts::new(keys.clone()),
        keys,
        sid,
    }
}

impl Held {
    /// Completes the entry with `answer` stored as `name`, on a connection of `user`'s
    /// (`None`: the default user), lean or the client library's.
    async fn complete(
        &self,
        user: Option<&str>,
        lean: bool,
        name: &str,
        answer: &[u8],
    ) -> RedisResult<Vec<Completed>> {
        let url = match user {
            Some(u) => format!("redis://{u}:pw@127.0.0.1:{}", self.server.port()),
            None => self.server.url(),
        };
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut own = if lean {
            let info = client.get_connection_info();
            let t = Duration::from_secs(5);
            OwnConn::Lean(LeanConn::open(info, t, t).await.expect("TCP").unwrap())
        } else {
            OwnConn::Client(client.get_multiplexed_async_connection().await.unwrap())
        };
        let mut loader = Conn::Node(ConnectionManager::new(self.server.client()).await.unwrap());
        let outcome = Outcome::Stored {
            len: answer.len(),
            name: name.to_string(),
        }
        .encode();
        let call = Complete {
            result_ttl_ms: 60_000,
            reply_maxlen: 100,
            now_ms: now_ms(),
        }
        .call(
            &self.scripts,
            [CompleteEntry {
                sid: &self.sid,
                rid: "r1",
                from: "p1",
                deadline_ms: 0,
                indexed: false,
                stored_body: false,
                small: true,
                outcome: &outcome,
            }],
        );
        let answers = [StoredBody {
            key: self.keys.body(name),
            body: answer,
            ttl_ms: ANSWER_TTL_MS,
        }];
        invoke_with_answers(&call, &mut own, &mut loader, &answers).await
    }

    fn answer(&self, name: &str) -> Option<Vec<u8>> {
        let mut c = self.server.sync_connection();
        redis::cmd("GET")
            .arg(self.keys.body(name))
            .query(&mut c)
            .unwrap()
    }

    fn user(&self, name: &str, rules: &[&str]) {
        let mut args = vec!["ACL", "SETUSER", name, "on", ">pw", "~*"];
        args.extend(rules);
        assert_eq!(self.server.cli(&args).trim(), "OK");
    }
}

/// The answer and the call that records it are one transaction: a call refused when
/// queued (here by the ACL, as `CLUSTERDOWN` refuses it while a master fails over) leaves
/// no answer behind; sent again, it records the outcome with its answer. On a lean
/// connection and on the client library's, and with the script loaded first.
#[tokio::test]
async fn an_answer_is_written_with_its_call_or_not_at_all() {
    for lean in [true, false] {
        let h = held().await;
        h.user("no-script", &["+@all", "-fcall"]);
        let answer = vec![b'a'; 5000];
        let e = h
            .complete(Some("no-script"), lean, "a1.t.0", &answer)
            .await
            .expect_err("FCALL is refused");
        assert_eq!(e.code(), Some("NOPERM"), "lean {lean}: {e}");
        assert_eq!(
            h.answer("a1.t.0"),
            None,
            "lean {lean}: an answer without its call"
        );
        // Redis has not seen the library yet: loaded, and the transaction sent again
        let done = h.complete(None, lean, "a1.t.1", &answer).await.unwrap();
        assert_eq!(done, [Completed::Recorded], "lean {lean}");
        assert_eq!(
            h.answer("a1.t.1").as_deref(),
            Some(&answer[..]),
            "lean {lean}"
        );
    }
}

/// A user whose ACL predates `+multi +exec` (README.md's least-privilege line) still
/// gets its outcomes written, one command after the other as before.
#[tokio::test]
async fn without_multi_outcomes_are_written_as_before() {
    let h = held().await;
    h.user("old-acl", &["+@all", "-multi", "-exec"]);
    let answer = vec![b'b'; 5000];
    let done = h
        .complete(Some("old-acl"), true, "a1.t.0", &answer)
        .await
        .unwrap();
    assert_eq!(done, [Completed::Recorded]);
    assert_eq!(h.answer("a1.t.0").as_deref(), Some(&answer[..]));
}
