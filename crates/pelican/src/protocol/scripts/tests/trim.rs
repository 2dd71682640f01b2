//! How `complete.lua` takes finished entries out of the stream: small ones by a trim
//! below the oldest pending entry, the rest (and all of them while the oldest pending
//! entry is old) by XDEL; never a pending or undelivered entry.

use super::*;

impl Fixture {
    /// Adds `n` entries without an index (as a producer with dedup off does).
    async fn add(&self, n: usize) {
        self.add_at("*", n).await
    }

    /// Adds `n` entries with ids `id` (`*`, or `<ms>-*` for a time of one's choosing).
    async fn add_at(&self, id: &str, n: usize) {
        for i in 0..n {
            self.add_entry(id, &format!("r{i}"), "p1").await;
        }
    }

    /// Completes `sids` as small or not, at `now_ms`; every one must be recorded.
    async fn complete_small(&self, sids: &[String], small: bool, now_ms: u64) {
        let ok = Outcome::Ok(b"{}".to_vec()).encode();
        let recorded = self
            .complete(
                now_ms,
                sids.iter().map(|sid| CompleteEntry {
                    sid,
                    rid: "r",
                    from: "p1",
                    deadline_ms: 0,
                    indexed: false,
                    stored_body: false,
                    small,
                    outcome: &ok,
                }),
            )
            .await;
        assert_eq!(recorded, vec![true; sids.len()]);
    }

    /// The ids in the stream.
    async fn stream_ids(&self) -> Vec<String> {
        let v: Value = self
            .query(
                redis::cmd("XRANGE")
                    .arg(&self.keys.stream)
                    .arg("-")
                    .arg("+"),
            )
            .await;
        parse_entries(&v)
            .into_iter()
            .map(|e| e.id.to_string())
            .collect()
    }
}

#[tokio::test]
async fn finished_small_entries_are_trimmed_below_the_oldest_pending_one() {
    let f = fixture().await;
    f.reply_stream("p1").await;
    // Two entries a listpack node, so that the trim (whole nodes only) is seen at once.
    let () = f
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("stream-node-max-entries")
                .arg(2),
        )
        .await;
    f.add(6).await;
    let sids = f.deliver().await;
    assert_eq!(sids.len(), 6);
    let now = crate::clock::now_ms();

    // The oldest entry is still pending (and recent): the finished ones behind it stay.
    f.complete_small(&sids[1..], true, now).await;
    assert_eq!(
        f.stream_ids().await,
        sids,
        "nothing below the oldest pending one"
    );

    // It finishes: nothing is pending, so everything delivered goes.
    f.complete_small(&sids[..1], true, now).await;
    assert_eq!(f.stream_ids().await, Vec::<String>::new());

    // Undelivered entries are never trimmed.
    f.add(4).await;
    let sids = f.deliver().await;
    f.add(1).await;
    let undelivered = f.stream_ids().await[4].clone();
    f.complete_small(&sids, true, now).await;
    assert_eq!(f.stream_ids().await, vec![undelivered.clone()]);
    let rest = f.deliver().await;
    assert_eq!(rest, vec![undelivered]);
    f.complete_small(&rest, true, now).await;

    // The oldest pending entry was submitted more than TRIM_WAIT_MS before a finished
    // one: finished ones go by XDEL.
    f.add_at(&format!("{}-*", now + 10_000), 1).await;
    f.add_at(&format!("{}-*", now + 11_100), 2).await;
    let sids = f.deliver().await;
    f.complete_small(&sids[1..2], true, now).await;
    assert_eq!(f.stream_ids().await, vec![sids[0].clone(), sids[2].clone()]);

    // An entry that is not small goes at once, however young the oldest pending one.
    f.complete_small(&sids[2..], false, now).await;
    assert_eq!(f.stream_ids().await, vec![sids[0].clone()]);
    let pending: Vec<(String, String, u64, u64)> = f
        .query(
            redis::cmd("XPENDING")
                .arg(&f.keys.stream)
                .arg(&f.keys.group)
                .arg("-")
                .arg("+")
                .arg(10),
        )
        .await;
    let pending: Vec<&str> = pending.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        pending,
        vec![sids[0].as_str()],
        "the oldest one is still pending"
    );
    // Replies went out for all 13 outcomes, trimmed or deleted alike.
    assert_eq!(f.replies("p1").await.len(), 13);
}
