//! Tests for `eventually`, `eventually_sync` and `unique_name`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use pelican_testkit::{eventually, eventually_sync, unique_name};

#[test]
fn unique_names_are_unique_and_prefixed() {
    let names: HashSet<String> = (0..100).map(|_| unique_name("q")).collect();
    assert_eq!(names.len(), 100);
    let prefix = format!("t-q-{}-", std::process::id());
    assert!(names.iter().all(|n| n.starts_with(&prefix)), "{names:?}");
}

#[test]
fn eventually_sync_returns_once_the_condition_holds() {
    let start = Instant::now();
    let mut calls = 0;
    eventually_sync(Duration::from_secs(5), "third call", || {
        calls += 1;
        calls >= 3
    });
    assert_eq!(calls, 3);
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
#[should_panic(expected = "waiting for the impossible")]
fn eventually_sync_panics_on_timeout() {
    eventually_sync(Duration::from_millis(50), "the impossible", || false);
}

#[tokio::test]
async fn eventually_returns_once_the_condition_holds() {
    let mut calls = 0;
    eventually(Duration::from_secs(5), "third call", || {
        calls += 1;
        let done = calls >= 3;
        async move { done }
    })
    .await;
    assert_eq!(calls, 3);
}

#[tokio::test]
#[should_panic(expected = "waiting for the impossible")]
async fn eventually_panics_on_timeout() {
    eventually(Duration::from_millis(50), "the impossible", || async {
        false
    })
    .await;
}

#[tokio::test]
#[should_panic(expected = "did not complete")]
async fn eventually_panics_when_the_condition_hangs() {
    eventually(Duration::from_millis(50), "a hanging check", || async {
        std::future::pending::<()>().await;
        true
    })
    .await;
}
