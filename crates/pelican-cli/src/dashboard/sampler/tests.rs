//! The sampler's arithmetic, and a partition sampled from a real server.

use super::*;

fn part(tag: &str, added: u64, length: u64, in_flight: u64) -> PartitionNow {
    PartitionNow {
        tag: tag.into(),
        entries_added: added,
        length,
        in_flight,
        queued: length - in_flight,
        oldest_entry_at_ms: Some(1_000),
        ..PartitionNow::default()
    }
}

#[test]
fn partitions_add_up_and_rates_come_from_deltas() {
    let mut b = Board::default();
    let sample = |parts| Sampled::from([("q".to_string(), parts)]);
    apply(
        &mut b,
        10_000,
        sample(vec![part("q#0", 100, 10, 2), part("q#1", 50, 0, 0)]),
    );
    let q = &b.queues["q"];
    assert_eq!(q.now.partitions, ["q#0", "q#1"]);
    assert_eq!((q.now.queued, q.now.in_flight), (8, 2));
    assert_eq!(q.now.submitted_per_s, 0.0, "no rate from one sample");
    assert_eq!(q.now.oldest_request_ms, Some(9_000));
    // Two seconds later: 40 + 20 added, q#0 grew by 4 (so 36 finished), q#1 by 0.
    apply(
        &mut b,
        12_000,
        sample(vec![part("q#0", 140, 14, 2), part("q#1", 70, 0, 0)]),
    );
    let q = &b.queues["q"];
    assert_eq!(q.now.submitted_per_s, 30.0);
    assert_eq!(q.now.finished_per_s, 28.0);
    assert_eq!(q.history.len(), 2);
    // The stream was deleted and made again: no negative rate.
    apply(
        &mut b,
        13_000,
        sample(vec![part("q#0", 3, 3, 0), part("q#1", 70, 0, 0)]),
    );
    assert_eq!(b.queues["q"].now.submitted_per_s, 0.0);
    // A queue gone from Redis leaves the board.
    apply(&mut b, 14_000, Sampled::new());
    assert!(b.queues.is_empty());
}

/// Finished entries may wait in the stream for a trim (docs/PROTOCOL.md, "Finished
/// entries leave the stream"): the oldest request is the oldest one in flight or
/// queued, not the stream's first entry.
#[tokio::test]
async fn the_oldest_request_is_not_a_finished_entry_waiting_for_the_trim() {
    let server = pelican_testkit::RedisServer::start();
    let mut conn = Link::Node(
        redis::aio::ConnectionManager::new(server.client())
            .await
            .unwrap(),
    );
    let keys = Keys::new("pelican", "q");
    let run = |args: &[&str]| {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c
    };
    let (s, g) = (keys.stream(), keys.group());
    let mut cmds = vec![run(&["XGROUP", "CREATE", s, g, "0", "MKSTREAM"])];
    for id in ["1000-0", "2000-0", "3000-0"] {
        cmds.push(run(&["XADD", s, id, "rid", "r", "body", "{}"]));
    }
    // 1000 finished (delivered, acknowledged, not yet trimmed), 2000 in flight,
    // 3000 queued.
    cmds.push(run(&[
        "XREADGROUP",
        "GROUP",
        g,
        "c",
        "COUNT",
        "2",
        "STREAMS",
        s,
        ">",
    ]));
    cmds.push(run(&["XACK", s, g, "1000-0"]));
    for c in &cmds {
        let _: Value = c.query_async(&mut conn).await.unwrap();
    }
    let p = sample_partition(&mut conn, "pelican", "q").await.unwrap();
    assert_eq!((p.length, p.in_flight, p.queued), (3, 1, 1));
    assert!(p.clock_ms.is_some_and(|c| c > 1_700_000_000_000), "{p:?}");
    assert_eq!(p.oldest_in_flight_at_ms, Some(2000));
    assert_eq!(
        p.oldest_entry_at_ms,
        Some(2000),
        "the finished one is not waiting"
    );
    // Once 2000 is finished too, the queued one is the oldest.
    let _: Value = run(&["XACK", s, g, "2000-0"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let p = sample_partition(&mut conn, "pelican", "q").await.unwrap();
    assert_eq!(p.oldest_entry_at_ms, Some(3000));
    // Nothing delivered yet in a fresh group: the stream's first entry is the oldest.
    let _: Value = run(&["XGROUP", "SETID", s, g, "0"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let p = sample_partition(&mut conn, "pelican", "q").await.unwrap();
    assert_eq!(p.oldest_entry_at_ms, Some(1000));
}

/// On a cluster each master stamps entry ids with its own clock: a partition's ages are
/// read against its node's `TIME`, the sample's time only when it gave none.
#[test]
fn ages_are_read_against_each_partitions_own_clock() {
    let mut b = Board::default();
    let mut own = part("q#0", 1, 1, 0);
    own.clock_ms = Some(5_000);
    let none = part("q#1", 1, 1, 0);
    apply(
        &mut b,
        10_000,
        Sampled::from([("q".to_string(), vec![own, none])]),
    );
    let q = &b.queues["q"];
    assert_eq!(q.parts[0].oldest_request_ms, Some(4_000));
    assert_eq!(q.parts[1].oldest_request_ms, Some(9_000));
    assert_eq!(q.now.oldest_request_ms, Some(9_000));
}

#[test]
fn the_history_is_bounded() {
    let mut b = Board::default();
    for i in 0..(HISTORY as u64 + 20) {
        apply(
            &mut b,
            i * 1000,
            Sampled::from([("q".to_string(), vec![part("q", i, 0, 0)])]),
        );
    }
    assert_eq!(b.queues["q"].history.len(), HISTORY);
    assert_eq!(b.queues["q"].history[0].t, 20_000);
}
