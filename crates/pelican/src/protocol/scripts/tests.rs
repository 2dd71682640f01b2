//! The typed calls against a real redis-server: the index values the scripts write
//! decode in Rust (`lib.lua`'s `index_*` helpers and `protocol::index` agree), replies
//! parse, and a script meeting a foreign client's key finishes its work.

use super::*;
use crate::protocol::index::{IndexValue, PendingIndex};
use pelican_testkit::{unique_name, RedisServer};
use redis::aio::ConnectionManager;
use redis::Cmd;

mod stored;
mod trim;

struct Fixture {
    _server: RedisServer,
    conn: ConnectionManager,
    scripts: Scripts,
    keys: Keys,
    /// The failure ttl `submit` passes (`QueueConfig::failure_ttl`); 0 unless a test sets it.
    failure_ttl_ms: std::cell::Cell<u64>,
}

const TTL_MS: u64 = 60_000;

/// The deadline `Fixture::submit` gives a request submitted at `now_ms`.
fn deadline(now_ms: u64) -> u64 {
    now_ms + 30_000
}

async fn fixture() -> Fixture {
    let server = RedisServer::start();
    let mut conn = ConnectionManager::new(server.client()).await.unwrap();
    let keys = Keys::new("pelican", &unique_name("scripts"));
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(&keys.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    Fixture {
        _server: server,
        conn,
        scripts: Scripts::new(keys.clone()),
        keys,
        failure_ttl_ms: std::cell::Cell::new(0),
    }
}

impl Fixture {
    async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> T {
        cmd.query_async(&mut self.conn.clone())
            .await
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
    }

    /// Adds an entry without an index (as a producer with dedup off does) at stream id
    /// `id` (`*`, or `<ms>-*` for a time of one's choosing): its id.
    async fn add_entry(&self, id: &str, rid: &str, from: &str) -> String {
        self.query(
            redis::cmd("XADD")
                .arg(&self.keys.stream)
                .arg(id)
                .arg("rid")
                .arg(rid)
                .arg("from")
                .arg(from)
                .arg("index")
                .arg("0")
                .arg("body")
                .arg("{}"),
        )
        .await
    }

    async fn submit(&self, producer: &str, rid: &str, now_ms: u64) -> SubmitAnswer {
        self.submit_staged(producer, rid, now_ms, None).await
    }

    /// Submits `rid`; with `stage` (`Some((name, body))`), its body stored at that stage
    /// first by a SET in the same write (no SET when the body is `None`), as a producer
    /// does for a large body.
    async fn submit_staged(
        &self,
        producer: &str,
        rid: &str,
        now_ms: u64,
        stage: Option<(&str, Option<&[u8]>)>,
    ) -> SubmitAnswer {
        let call = Submit {
            now_ms,
            producer,
            result_ttl_ms: TTL_MS,
            reply_maxlen: 100,
            failure_ttl_ms: self.failure_ttl_ms.get(),
        }
        .call(
            &self.scripts,
            [SubmitRequest {
                rid,
                deadline_ms: deadline(now_ms),
                index_ttl_ms: 30_000 + TTL_MS,
                tp: None,
                stage: stage.map(|(name, _)| name),
                body: if stage.is_some() { b"" } else { b"{}" },
            }],
        );
        let mut answers = match stage {
            None => call.invoke(&mut self.conn.clone()).await,
            Some((name, body)) => {
                let mut before = Vec::new();
                if let Some(body) = body {
                    let mut set = redis::cmd("SET");
                    set.arg(self.keys.body(name))
                        .arg(body)
                        .arg("PX")
                        .arg(60_000);
                    before.push(set);
                }
                let pipe = call.after(before);
                call.invoke_pipeline(&pipe, &mut self.conn.clone()).await
            }
        }
        .unwrap();
        assert_eq!(answers.len(), 1);
        answers.remove(0)
    }

    async fn cancel(&self, producer: &str, rid: &str) -> u64 {
        Cancel { producer }
            .call(&self.scripts, [CancelRequest { rid, sid: None }])
            .invoke(&mut self.conn.clone())
            .await
            .unwrap()
    }

    async fn index(&self, rid: &str) -> Option<IndexValue> {
        let v: Option<Vec<u8>> = self.query(redis::cmd("GET").arg(self.keys.req(rid))).await;
        v.map(|v| IndexValue::decode(&v).expect("a value pelican wrote"))
    }

    /// Records the outcomes of `entries` at `now_ms` (`complete.lua`): which were recorded.
    async fn complete<'e>(
        &self,
        now_ms: u64,
        entries: impl IntoIterator<Item = CompleteEntry<'e>>,
    ) -> Vec<bool> {
        self.complete_all(now_ms, entries)
            .await
            .into_iter()
            .map(|c| c == Completed::Recorded)
            .collect()
    }

    /// Records the outcomes of `entries` at `now_ms` (`complete.lua`): what became of each.
    async fn complete_all<'e>(
        &self,
        now_ms: u64,
        entries: impl IntoIterator<Item = CompleteEntry<'e>>,
    ) -> Vec<Completed> {
        Complete {
            result_ttl_ms: TTL_MS,
            reply_maxlen: 100,
            now_ms,
        }
        .call(&self.scripts, entries)
        .invoke(&mut self.conn.clone())
        .await
        .expect("the script finishes")
    }

    /// Delivers every new entry to consumer `c`; their ids.
    async fn deliver(&self) -> Vec<String> {
        self.deliver_entries()
            .await
            .into_iter()
            .map(|e| e.id.to_string())
            .collect()
    }

    /// Delivers every new entry to consumer `c`, as read.
    async fn deliver_entries(&self) -> Vec<RawEntry> {
        let v: Value = self
            .query(
                redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(&self.keys.group)
                    .arg("c")
                    .arg("STREAMS")
                    .arg(&self.keys.stream)
                    .arg(">"),
            )
            .await;
        entry::read_into_entries(v)
    }

    /// Creates producer `p`'s reply stream, as a producer does.
    async fn reply_stream(&self, p: &str) {
        let _: String = self
            .query(
                redis::cmd("XADD")
                    .arg(self.keys.reply(p))
                    .arg("*")
                    .arg("pelican")
                    .arg("reply stream created"),
            )
            .await;
    }

    /// The rid/outcome pairs pushed to producer `p`.
    async fn replies(&self, p: &str) -> Vec<(String, Vec<u8>)> {
        let v: Value = self
            .query(
                redis::cmd("XRANGE")
                    .arg(self.keys.reply(p))
                    .arg("-")
                    .arg("+"),
            )
            .await;
        parse_entries(&v)
            .into_iter()
            .flat_map(|e| e.fields)
            .filter(|(k, _)| k != &b"pelican"[..])
            .map(|(k, v)| (String::from_utf8(k.to_vec()).unwrap(), v.to_vec()))
            .collect()
    }
}

fn pending(sid: &str, deadline_ms: u64, waiters: &[&str]) -> Option<IndexValue> {
    Some(IndexValue::Pending(PendingIndex {
        sid: sid.to_string(),
        deadline_ms,
        waiters: waiters.iter().map(|w| w.to_string()).collect(),
    }))
}

#[tokio::test]
async fn index_values_of_submit_and_cancel_decode_in_rust() {
    let f = fixture().await;
    let now = 1_700_000_000_000;
    let SubmitAnswer::Queued(sid) = f.submit("p1", "r", now).await else {
        panic!("a new request is queued")
    };
    let deadline = now + 30_000;
    assert_eq!(f.index("r").await, pending(&sid, deadline, &["p1"]));
    assert_eq!(f.submit("p2", "r", now).await, SubmitAnswer::Joined);
    // A producer that waits already is not added twice.
    assert_eq!(f.submit("p1", "r", now).await, SubmitAnswer::Joined);
    assert_eq!(f.index("r").await, pending(&sid, deadline, &["p1", "p2"]));
    // A producer that does not wait changes nothing.
    assert_eq!(f.cancel("p3", "r").await, 0);
    assert_eq!(f.cancel("p1", "r").await, 0);
    assert_eq!(f.index("r").await, pending(&sid, deadline, &["p2"]));
    assert_eq!(f.cancel("p2", "r").await, 1, "nobody waits: withdrawn");
    assert_eq!(f.index("r").await, None);
    let len: u64 = f.query(redis::cmd("XLEN").arg(&f.keys.stream)).await;
    assert_eq!(len, 0);
}

#[tokio::test]
async fn a_submission_past_the_deadline_of_the_request_in_flight_starts_afresh() {
    let f = fixture().await;
    let now = 1_700_000_000_000;
    f.reply_stream("p1").await;
    let SubmitAnswer::Queued(first) = f.submit("p1", "r", now).await else {
        panic!("queued")
    };
    let later = now + 31_000;
    let SubmitAnswer::Queued(second) = f.submit("p2", "r", later).await else {
        panic!("the first entry expired: a new one is queued")
    };
    assert_ne!(first, second);
    assert_eq!(
        f.index("r").await,
        pending(&second, later + 30_000, &["p2"])
    );
    let replies = f.replies("p1").await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].0, "r");
    assert_eq!(
        replies[0].1.first(),
        Some(&b'X'),
        "the first waiter is told"
    );
}

#[tokio::test]
async fn complete_records_the_first_outcome_and_submit_reads_it_back() {
    let f = fixture().await;
    let now = 1_700_000_000_000;
    f.reply_stream("p1").await;
    let SubmitAnswer::Queued(sid) = f.submit("p1", "r", now).await else {
        panic!("queued")
    };
    assert_eq!(f.deliver().await, vec![sid.clone()]);
    let ok = Outcome::Ok(b"{\"x\":1}".to_vec()).encode();
    let complete = |outcome: Vec<u8>| {
        let sid = sid.clone();
        let f = &f;
        async move {
            f.complete(
                now,
                [CompleteEntry {
                    sid: &sid,
                    rid: "r",
                    from: "p1",
                    deadline_ms: deadline(now),
                    indexed: true,
                    stored_body: false,
                    small: false,
                    outcome: &outcome,
                }],
            )
            .await
        }
    };
    assert_eq!(complete(ok.clone()).await, vec![true]);
    let late = Outcome::Remote("late".into()).encode();
    assert_eq!(complete(late).await, vec![false], "first outcome wins");
    assert_eq!(f.replies("p1").await, vec![("r".to_string(), ok.clone())]);
    assert_eq!(
        f.submit("p2", "r", now).await,
        SubmitAnswer::Cached(Outcome::decode(&ok).unwrap())
    );
}

/// A handler's failure is recorded for the result ttl, but answers a new submission only
/// within the failure ttl of its recording (none by default): later the request is queued
/// again and its new index replaces the failure. A dead letter stays cached. The age is
/// what the result ttl has lost (set here with PEXPIRE: no waiting).
#[tokio::test]
async fn a_failure_answers_new_submissions_only_within_the_failure_ttl() {
    let f = fixture().await;
    let now = 1_700_000_000_000;
    for p in ["p1", "p2"] {
        f.reply_stream(p).await;
    }
    // Fails rid `rid` (submitted by p1, joined by p2) with `outcome`: its entry id.
    let fail = |rid: &'static str, outcome: Outcome| {
        let f = &f;
        async move {
            let SubmitAnswer::Queued(sid) = f.submit("p1", rid, now).await else {
                panic!("queued")
            };
            assert_eq!(f.submit("p2", rid, now).await, SubmitAnswer::Joined);
            assert_eq!(f.deliver().await, vec![sid.clone()]);
            let outcome = outcome.encode();
            let entry = CompleteEntry {
                sid: &sid,
                rid,
                from: "p1",
                deadline_ms: deadline(now),
                indexed: true,
                stored_body: false,
                small: false,
                outcome: &outcome,
            };
            assert_eq!(f.complete(now, [entry]).await, vec![true]);
            sid
        }
    };
    let age = |rid: &'static str, ms: u64| {
        let f = &f;
        async move {
            let _: i64 = f
                .query(redis::cmd("PEXPIRE").arg(f.keys.req(rid)).arg(TTL_MS - ms))
                .await;
        }
    };
    let failed = Outcome::Remote("no source image".into());
    // Default (0): recorded, told to both waiters, never served to a new submission.
    let first = fail("a", failed.clone()).await;
    for p in ["p1", "p2"] {
        let told: Vec<_> = f.replies(p).await.into_iter().map(|r| r.0).collect();
        assert_eq!(told, ["a"], "every waiter of the run is told");
    }
    assert_eq!(f.index("a").await, Some(IndexValue::Done(failed.clone())));
    let SubmitAnswer::Queued(again) = f.submit("p1", "a", now).await else {
        panic!("a failure is not served by default: the request runs again")
    };
    assert_ne!(again, first);
    assert_eq!(f.index("a").await, pending(&again, deadline(now), &["p1"]));
    assert_eq!(f.deliver().await, vec![again]);
    // With a failure ttl of 10 s: served while younger, run again when older.
    f.failure_ttl_ms.set(10_000);
    fail("b", failed.clone()).await;
    age("b", 9_000).await;
    assert_eq!(
        f.submit("p1", "b", now).await,
        SubmitAnswer::Cached(failed.clone())
    );
    age("b", 11_000).await;
    let SubmitAnswer::Queued(again) = f.submit("p1", "b", now).await else {
        panic!("a failure older than the failure ttl: the request runs again")
    };
    assert_eq!(f.deliver().await, vec![again]);
    // A failure ttl of the result ttl: served as long as it is recorded.
    f.failure_ttl_ms.set(TTL_MS);
    fail("c", failed.clone()).await;
    // A second left: 1 ms could run out before the submission.
    age("c", TTL_MS - 1_000).await;
    assert_eq!(
        f.submit("p1", "c", now).await,
        SubmitAnswer::Cached(failed.clone())
    );
    // A dead letter and a response stay cached whatever the failure ttl.
    f.failure_ttl_ms.set(0);
    let dead = Outcome::Dead("poison".into());
    let ok = Outcome::Ok(b"{}".to_vec());
    for (rid, outcome) in [("d", dead), ("o", ok)] {
        fail(rid, outcome.clone()).await;
        age(rid, TTL_MS - 1_000).await;
        assert_eq!(
            f.submit("p1", rid, now).await,
            SubmitAnswer::Cached(outcome)
        );
    }
}

/// The gate compares the index with the value it holds while the submitter alone waits
/// before parsing it. Every way to that comparison gives what the parse gives: the
/// submitter alone (equal), a request joined by another producer (not equal: both are
/// told), a deadline that does not match the index (not equal: parsed, the submitter
/// told), and an outcome recorded already (dropped).
#[tokio::test]
async fn complete_tells_every_waiter_whether_the_index_is_compared_or_parsed() {
    let f = fixture().await;
    let now = 1_700_000_000_000;
    for p in ["p1", "p2"] {
        f.reply_stream(p).await;
    }
    let mut sids = Vec::new();
    for rid in ["alone", "joined", "skewed"] {
        let SubmitAnswer::Queued(sid) = f.submit("p1", rid, now).await else {
            panic!("queued")
        };
        sids.push(sid);
    }
    assert_eq!(f.submit("p2", "joined", now).await, SubmitAnswer::Joined);
    assert_eq!(f.deliver().await, sids);
    let ok = Outcome::Ok(b"{}".to_vec()).encode();
    let entries = |deadlines: [u64; 3]| {
        ["alone", "joined", "skewed"]
            .into_iter()
            .zip(&sids)
            .zip(deadlines)
            .map(|((rid, sid), deadline_ms)| CompleteEntry {
                sid,
                rid,
                from: "p1",
                deadline_ms,
                indexed: true,
                stored_body: false,
                small: false,
                outcome: &ok,
            })
            .collect::<Vec<_>>()
    };
    let d = deadline(now);
    assert_eq!(f.complete(now, entries([d, d, d + 1])).await, [true; 3]);
    let rids = |p: &str| {
        let f = &f;
        let p = p.to_string();
        async move {
            let mut rids: Vec<String> = f.replies(&p).await.into_iter().map(|r| r.0).collect();
            rids.sort();
            rids
        }
    };
    assert_eq!(rids("p1").await, ["alone", "joined", "skewed"]);
    assert_eq!(rids("p2").await, ["joined"]);
    assert_eq!(
        f.complete(now, entries([d, d, d])).await,
        [false; 3],
        "first outcome wins"
    );
    assert_eq!(rids("p1").await.len(), 3, "nothing pushed again");
}

/// A foreign client made a reply key a hash. Before the fix the script's last XADD
/// failed with WRONGTYPE after the batch was recorded: the call failed and the
/// replies of producers flushed after that one were lost.
#[tokio::test]
async fn a_reply_key_of_another_type_loses_no_other_reply() {
    let f = fixture().await;
    f.reply_stream("p1").await;
    let _: i64 = f
        .query(
            redis::cmd("HSET")
                .arg(f.keys.reply("ghost"))
                .arg("foreign")
                .arg("hash"),
        )
        .await;
    for (rid, from) in [("a", "ghost"), ("b", "p1")] {
        f.add_entry("*", rid, from).await;
    }
    let sids = f.deliver().await;
    assert_eq!(sids.len(), 2);
    let ok = Outcome::Ok(b"{}".to_vec()).encode();
    let recorded = f
        .complete(
            1_700_000_000_000,
            [("a", "ghost"), ("b", "p1")]
                .iter()
                .zip(&sids)
                .map(|((rid, from), sid)| CompleteEntry {
                    sid,
                    rid,
                    from,
                    deadline_ms: 0,
                    indexed: false,
                    stored_body: false,
                    small: false,
                    outcome: &ok,
                }),
        )
        .await;
    assert_eq!(recorded, vec![true, true]);
    assert_eq!(f.replies("p1").await, vec![("b".to_string(), ok)]);
}

/// A renewal of the newest of many entries in the consumer's pending list: it is still
/// owned. The script used to page the pending list from its oldest entry, with a page
/// of 2 x ids + 16, and reported the newest entries lost when the list was longer (the
/// outcomes of older entries still being written): their handlers were cancelled.
#[tokio::test]
async fn renewing_the_newest_of_a_long_pending_list_loses_nothing() {
    let f = fixture().await;
    for i in 0..50 {
        let _: String = f
            .query(
                redis::cmd("XADD")
                    .arg(&f.keys.stream)
                    .arg("*")
                    .arg("i")
                    .arg(i),
            )
            .await;
    }
    let read: Value = f
        .query(
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&f.keys.group)
                .arg("c1")
                .arg("COUNT")
                .arg(50)
                .arg("STREAMS")
                .arg(&f.keys.stream)
                .arg(">"),
        )
        .await;
    let entries = entry::read_into_entries(read);
    assert_eq!(entries.len(), 50);
    let newest: Vec<&str> = entries[45..].iter().map(|e| &*e.id).collect();
    let lost = Renew { consumer: "c1" }
        .call(&f.scripts, newest.iter().copied())
        .invoke(&mut f.conn.clone())
        .await
        .unwrap();
    assert!(lost.is_empty(), "owned entries reported lost: {lost:?}");
    // Another consumer's renewal of them: all lost (owner-checked).
    let lost = Renew { consumer: "c2" }
        .call(&f.scripts, newest.iter().copied())
        .invoke(&mut f.conn.clone())
        .await
        .unwrap();
    assert_eq!(lost.len(), 5);
}
