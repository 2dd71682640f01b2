//! `pelican stats`.

use crate::support::*;

#[test]
fn stats_json_parses_and_text_reads() {
    let env = Env::new("stats");
    let empty = env.stats();
    assert_eq!(empty["queue"], env.queue.as_str());
    assert_eq!(empty["stream_length"], 0);

    let worker = env.spawn(&["worker"]);
    let out = env.run(&["call", r#"{"k": 1}"#]);
    assert_eq!(out.code, 0, "{out:?}");

    let st = env.stats();
    assert_eq!(st["entries_added"], 1, "{st}");
    assert_eq!(st["cached_results"], 1, "{st}");
    assert_eq!(st["dead_letters"], 0, "{st}");
    assert_eq!(st["pending"], 0, "{st}");
    let consumers = st["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{st}");
    assert_eq!(consumers[0]["pending"], 0, "{st}");
    for field in [
        "stream_length",
        "queued",
        "oldest_pending_idle_ms",
        "in_flight",
        "waiting_producers",
        "reply_streams",
    ] {
        assert!(st.get(field).is_some(), "{field} missing: {st}");
    }

    let text = env.run(&["stats"]);
    assert_eq!(text.code, 0, "{text:?}");
    for want in [
        format!("queue           {} on {}", env.queue, env.server.url()),
        "1 ever added".to_string(),
        "consumers       1".to_string(),
        "cached results  1".to_string(),
    ] {
        assert!(text.stdout.contains(&want), "{want:?} in {}", text.stdout);
    }
    drop(worker);
}
