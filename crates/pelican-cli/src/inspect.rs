//! `pelican inspect RID`: one request, as Redis sees it.

use crate::cli::Global;
use crate::exit::{CliError, CliResult};
use crate::fmt::{age, duration_ms};
use pelican::admin::RequestInfo;
use pelican::Admin;

/// Prints what Redis knows of request `rid`; exit 1 when it knows nothing.
pub async fn run(g: &Global, rid: &str) -> CliResult {
    let queue = g.connectable().await?;
    let admin = Admin::connect(queue).await.map_err(|e| g.error(&e))?;
    let Some(info) = admin.inspect(rid).await.map_err(|e| g.error(&e))? else {
        return Err(CliError::failure(format!(
            "queue {:?} knows no request {rid:?}: it was never submitted, finished more than \
             result_ttl ago, expired, or was submitted with dedup off (no index to look up)",
            g.queue
        )));
    };
    if g.json {
        let text = serde_json::to_string_pretty(&info)
            .map_err(|e| CliError::failure(format!("cannot encode the request: {e}")))?;
        outln!("{text}");
    } else {
        out!("{}", render(&info));
    }
    Ok(())
}

/// The human-readable form.
fn render(r: &RequestInfo) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<12}{v}\n"));
    line("request", r.rid.clone());
    let state = match r.state.as_str() {
        "queued" => "queued: no consumer has taken it yet",
        "in_work" => "in work",
        "lost" => {
            "lost: its entry is gone from the stream (its producers submit it again, or it expires)"
        }
        "ok" => "finished: ok",
        "error" => "finished: failed by the handler",
        "dead" => "finished: dead-lettered (see `pelican dead list`)",
        "expired" => "finished: expired",
        "cancelled" => "finished: withdrawn",
        other => other,
    };
    line("state", state.to_string());
    if let Some(e) = &r.entry {
        line("entry", e.clone());
    }
    if let Some(d) = r.deadline_ms {
        line("deadline", age(d));
    }
    if let Some(c) = &r.consumer {
        let idle = r
            .idle_ms
            .map(|ms| format!(", lease renewed {} ago", duration_ms(ms as f64)))
            .unwrap_or_default();
        let n = r
            .deliveries
            .map(|n| format!("delivery {n}"))
            .unwrap_or_default();
        line("held by", format!("{c} ({n}{idle})"));
    }
    if !r.waiters.is_empty() {
        line("waiting", r.waiters.join(", "));
    }
    if let Some(n) = r.body_len {
        line("body", format!("{n} bytes"));
    }
    if let Some(p) = &r.outcome_preview {
        line(
            if r.state == pelican::admin::RequestState::Ok {
                "response"
            } else {
                "reason"
            },
            p.clone(),
        );
    }
    if let Some(ms) = r.ttl_ms {
        line("kept for", duration_ms(ms as f64));
    }
    o
}
