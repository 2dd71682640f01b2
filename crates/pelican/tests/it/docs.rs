//! The repository's documents agree with the package: the README shows the crate
//! README's examples (which are the ones compiled as doc tests), docs/PROTOCOL.md names
//! every field an entry can carry, and the licence files are the same everywhere.
//!
//! These read files outside the crate, so they live here, in the tests that stay in the
//! repository (not in the package).

use crate::common::*;
use pelican::Producer;
use pelican_testkit::RedisServer;
use std::collections::BTreeSet;

const ROOT_README: &str = include_str!("../../../../README.md");
const CRATE_README: &str = include_str!("../../README.md");
const PROTOCOL: &str = include_str!("../../../../docs/PROTOCOL.md");

/// The fenced Rust blocks of a Markdown text, fences included.
fn rust_blocks(md: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = md;
    while let Some(start) = rest.find("```rust") {
        let body = &rest[start..];
        let end = body[3..].find("```").expect("a closed fence") + 6;
        blocks.push(&body[..end]);
        rest = &body[end..];
    }
    blocks
}

#[test]
fn the_readme_shows_the_crate_readmes_examples() {
    let root = rust_blocks(ROOT_README);
    assert!(!root.is_empty(), "README.md has Rust examples");
    let tested = rust_blocks(CRATE_README);
    for block in root {
        assert!(
            tested.contains(&block),
            "README.md's example is not in crates/pelican/README.md (the doc-tested \
             copy); keep the two the same:\n{block}"
        );
    }
}

#[test]
fn every_copy_of_the_licences_is_the_same() {
    for name in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let want = std::fs::read(root.join(name)).expect(name);
        for krate in ["pelican", "pelican-cli"] {
            let got = std::fs::read(root.join("crates").join(krate).join(name))
                .unwrap_or_else(|e| panic!("crates/{krate}/{name}: {e}"));
            assert!(got == want, "crates/{krate}/{name} differs from {name}");
        }
    }
}

/// An XRANGE reply: entries of id and fields.
type Entries = Vec<(String, Vec<(String, Vec<u8>)>)>;

/// The rows of docs/PROTOCOL.md's entry field tables: "| `name` | ...".
fn documented_fields() -> BTreeSet<&'static str> {
    let entries = PROTOCOL
        .split("\n## ")
        .find(|s| s.starts_with("Entries"))
        .expect("docs/PROTOCOL.md has a section \"Entries\"");
    entries
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect()
}

/// What producers write (small and stored bodies, dedup on and off), the trace context
/// (written by a build with `otel`) and the fields of the layout before `head` (still
/// read: `layout.rs`) are all in docs/PROTOCOL.md's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_md_names_every_entry_field() {
    let documented = documented_fields();
    let server = RedisServer::start();
    let q = queue(&server, "docs");
    let probe = Probe::new(&server, &q).await;
    // No consumer: the entries stay as written while their tickets live (a dropped
    // ticket withdraws its request).
    let (mut producers, mut tickets) = (Vec::new(), Vec::new());
    for dedup in [false, true] {
        let p = Producer::<Req, Resp>::connect(q.clone(), fast_producer().with_dedup(dedup))
            .await
            .unwrap();
        for (i, size) in [(0, 8), (1, 8 * 1024)] {
            let tag = "x".repeat(size);
            let req = Req::new(i + if dedup { 10 } else { 0 }, &tag);
            tickets.push(p.submit(&req).await.unwrap());
        }
        producers.push(p);
    }
    let entries: Entries = probe
        .query(redis::cmd("XRANGE").arg(probe.stream()).arg("-").arg("+"))
        .await;
    drop(tickets);
    for p in producers {
        p.shutdown().await.unwrap();
    }
    assert_eq!(entries.len(), 4, "four requests submitted");
    let written: BTreeSet<String> = entries
        .iter()
        .flat_map(|(_, fields)| fields.iter().map(|(n, _)| n.clone()))
        .collect();
    assert!(
        written.contains("bref"),
        "an 8 KiB body with dedup is stored beside the stream: {written:?}"
    );
    let others = ["tp", "rid", "from", "deadline", "at", "index"];
    for name in written.iter().map(String::as_str).chain(others) {
        assert!(
            documented.contains(name),
            "entry field {name:?} is not in docs/PROTOCOL.md's \"Entries\" tables \
             (found: {documented:?})"
        );
    }
}
