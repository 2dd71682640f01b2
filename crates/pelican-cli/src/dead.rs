//! `pelican dead list | requeue | purge`: the dead-letter stream.

use crate::cli::{DeadCommand, Global};
use crate::exit::{CliError, CliResult};
use crate::fmt::age;
use pelican::admin::DeadLetter;
use pelican::Admin;
use serde_json::json;
use std::time::Duration;

/// Runs one `dead` subcommand.
pub async fn run(g: &Global, cmd: &DeadCommand) -> CliResult {
    if let DeadCommand::Requeue { ids, .. } = cmd {
        // `P/MS-SEQ` on a queue of several partitions; the library checks P.
        let bare = |id: &str| id.split_once('/').map_or(id, |(_, sid)| sid).to_string();
        if let Some(bad) = ids.iter().find(|id| !is_stream_id(&bare(id))) {
            return Err(CliError::usage(format!(
                "{bad:?} is not a dead-letter id: they look like 1700000000000-0, or \
                 3/1700000000000-0 on a queue of several partitions (see `pelican dead list`)"
            )));
        }
    }
    let queue = g.connectable().await?;
    let admin = Admin::connect(queue).await.map_err(|e| g.error(&e))?;
    match cmd {
        DeadCommand::List { limit } => list(g, &admin, *limit).await,
        DeadCommand::Requeue { ids, all, timeout } => {
            let timeout = Duration::from_millis(*timeout);
            if *all {
                requeue_all(g, &admin, timeout).await
            } else {
                requeue(g, &admin, ids, timeout).await
            }
        }
        DeadCommand::Purge => {
            let n = admin.purge_dead().await.map_err(|e| g.error(&e))?;
            if g.json {
                outln!("{}", json!({"purged": n}));
            } else {
                outln!("purged {n} dead letters from queue {:?}", g.queue);
            }
            Ok(())
        }
    }
}

async fn list(g: &Global, admin: &Admin, limit: usize) -> CliResult {
    let letters = admin.dead_letters(limit).await.map_err(|e| g.error(&e))?;
    if g.json {
        let text = serde_json::to_string_pretty(&letters)
            .map_err(|e| CliError::failure(format!("cannot encode the dead letters: {e}")))?;
        outln!("{text}");
        return Ok(());
    }
    if letters.is_empty() {
        outln!("no dead letters on queue {:?}", g.queue);
        return Ok(());
    }
    for d in &letters {
        out!("{}", render(d));
    }
    outln!(
        "{} dead letter{} shown. Put one back with `pelican dead requeue ID` (or --all) once \
         the cause is fixed; drop them with `pelican dead purge`.",
        letters.len(),
        if letters.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

/// One dead letter, human-readable.
fn render(d: &DeadLetter) -> String {
    let ellipsis = if d.body_preview.len() < d.body_len {
        "..."
    } else {
        ""
    };
    format!(
        "{}  ({} deliveries, last consumer {}, died {})\n  reason: {}\n  rid:    {}\n  entry:  {}\n  body:   {}{} ({} bytes)\n\n",
        d.id,
        d.deliveries,
        if d.consumer.is_empty() { "-" } else { &d.consumer },
        age(d.dead_at_ms),
        d.reason,
        d.rid.as_deref().unwrap_or("-"),
        d.entry,
        d.body_preview,
        ellipsis,
        d.body_len
    )
}

async fn requeue(g: &Global, admin: &Admin, ids: &[String], timeout: Duration) -> CliResult {
    let done = admin.requeue(ids, timeout).await.map_err(|e| g.error(&e))?;
    let missing: Vec<&String> = done
        .iter()
        .filter(|(_, new)| new.is_none())
        .map(|(id, _)| id)
        .collect();
    if g.json {
        let requeued: Vec<_> = done
            .iter()
            .filter_map(|(id, new)| new.as_ref().map(|n| json!({"id": id, "entry": n})))
            .collect();
        outln!("{}", json!({"requeued": requeued, "missing": missing}));
    } else {
        for (id, new) in &done {
            if let Some(new) = new {
                outln!("requeued {id} as entry {new}");
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        Err(CliError::failure(format!(
            "no dead letter {} on queue {:?} (or it had no body to requeue); list them with \
             `pelican dead list`",
            list.join(", "),
            g.queue
        )))
    }
}

/// `MS-SEQ` or `MS`, as Redis stream ids are.
fn is_stream_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('-') {
        Some((ms, seq)) => digits(ms) && digits(seq),
        None => digits(id),
    }
}

async fn requeue_all(g: &Global, admin: &Admin, timeout: Duration) -> CliResult {
    let n = admin.requeue_all(timeout).await.map_err(|e| g.error(&e))?;
    if g.json {
        outln!("{}", json!({"requeued": n}));
    } else {
        outln!("requeued {n} dead letters on queue {:?}", g.queue);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_ids_are_recognised() {
        for ok in ["0-1", "1700000000000-0", "17"] {
            assert!(super::is_stream_id(ok), "{ok}");
        }
        for bad in ["", "-", "a-1", "1-", "1-2-3", "1700000000000-0x"] {
            assert!(!super::is_stream_id(bad), "{bad}");
        }
    }
}
