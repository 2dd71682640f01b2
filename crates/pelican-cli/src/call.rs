//! `pelican call`: submits one request and prints the response JSON on stdout.

use crate::cli::{CallArgs, Global};
use crate::exit::{CliError, CliResult};
use pelican::{Producer, ProducerConfig};
use serde_json::Value;
use std::io::Read;
use std::time::Duration;
use tracing::Instrument;

/// Runs the call.
pub async fn run(g: &Global, args: &CallArgs) -> CliResult {
    let request = parse_request(&args.request)?;
    let queue = g.connectable().await?;
    let cfg = ProducerConfig::default()
        .with_request_timeout(Duration::from_millis(args.timeout))
        .with_dedup(!args.no_dedup);
    let producer = Producer::<Value, Value>::connect(queue, cfg)
        .await
        .map_err(|e| g.error(&e))?;
    // The request's trace starts here: the entry carries this span's context (feature
    // `otel`), and the worker's handler span continues it.
    let span = tracing::info_span!("call", queue = %g.queue, rid = tracing::field::Empty);
    let result = async {
        let ticket = match &args.id {
            Some(id) => producer.submit_with_id(id, &request).await,
            None => producer.submit(&request).await,
        }?;
        tracing::Span::current().record("rid", ticket.request_id());
        tracing::info!(how = ?ticket.submitted(), "submitted");
        let r = ticket.await;
        tracing::info!(ok = r.is_ok(), "resolved");
        r
    }
    .instrument(span)
    .await;
    // Withdraws nothing that is still wanted; deletes this producer's reply stream.
    if let Err(e) = producer.shutdown().await {
        tracing::debug!(error = %format_args!("{e:#}"), "producer shutdown");
    }
    let response = result.map_err(|e| g.error(&e))?;
    outln!("{response}");
    Ok(())
}

/// The request argument: JSON text, or `-` for stdin.
fn parse_request(arg: &str) -> CliResult<Value> {
    let text = if arg == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::failure(format!("cannot read the request from stdin: {e}")))?;
        s
    } else {
        arg.to_string()
    };
    serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "the request is not valid JSON ({e}); quote it for the shell, as in \
             pelican call '{{\"n\": 1}}', or pass - to read it from stdin"
        ))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_json_is_a_usage_error() {
        let e = super::parse_request("{nope").unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(e.message.contains("not valid JSON"), "{e}");
        assert_eq!(
            super::parse_request("[1,2]").unwrap(),
            serde_json::json!([1, 2])
        );
    }
}
