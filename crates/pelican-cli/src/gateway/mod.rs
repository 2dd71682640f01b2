//! `pelican gateway`: callers in any language, over HTTP.
//!
//! The gateway is a producer, not a second protocol: one `Producer` per queue
//! (`queues.rs`), made on the first call that names the queue and shared by every HTTP
//! connection, so everything the library guarantees holds through it (join, cache,
//! deadline, cancellation when the caller goes away). `routes.rs` has the routes;
//! `input.rs` reads what a call brings (body, timeout, request id). The rules it shares
//! with the dashboard (security policy, the JSON error answer, strict parsing) are in
//! `crate::http`.
//!
//! Backpressure is explicit: at most `--max-inflight` calls at once (past it, 503 with
//! `Retry-After`), a body over the queue's `max_body_bytes` refused from its
//! `Content-Length` before it is read (413). SIGINT/SIGTERM: stop accepting, let the calls
//! in progress finish (at most `--shutdown-timeout`), stop the producers, exit.

mod input;
mod queues;
mod routes;

use crate::cli::{GatewayArgs, Global};
use crate::exit::{CliError, CliResult};
use crate::http::{policy, Policy};
use axum::serve::ListenerExt;
use queues::Queues;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// What the handlers share.
pub struct Gateway {
    policy: Policy,
    queues: Queues,
    inflight: Arc<Semaphore>,
    max_inflight: usize,
    default_timeout: Duration,
    max_timeout: Duration,
}

/// Serves until SIGINT/SIGTERM.
pub async fn run(g: &Global, a: &GatewayArgs) -> CliResult {
    let loopback = a.listen.ip().is_loopback();
    if !loopback && a.token.is_none() {
        return Err(CliError::usage(format!(
            "refusing to serve the gateway on {} without --token: it is not a loopback \
             address, so anyone who reaches it could submit work to every queue. Give a \
             --token of at least {} characters (and prefer a reverse proxy with TLS in front)",
            a.listen,
            policy::MIN_TOKEN_LEN
        )));
    }
    if let Some(t) = &a.token {
        policy::check_token(t).map_err(CliError::usage)?;
    }
    if a.default_timeout > a.max_timeout {
        return Err(CliError::usage(format!(
            "--default-timeout {} is longer than --max-timeout {}",
            a.default_timeout, a.max_timeout
        )));
    }
    let max_timeout = Duration::from_millis(a.max_timeout);
    // Settings, URL and the names of --queues checked before anything listens.
    let queues = Queues::new(g, a.queues.clone(), max_timeout)
        .map_err(|e| CliError::usage(format!("--queues or a queue setting: {}", e.message)))?;
    let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| {
        CliError::failure(format!(
            "cannot listen on {}: {e}; choose another address with --listen",
            a.listen
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", a.listen)))?;
    let max_inflight = a.max_inflight as usize;
    let gw = Arc::new(Gateway {
        policy: Policy::new(a.token.clone(), loopback).token_for_everything(),
        queues,
        inflight: Arc::new(Semaphore::new(max_inflight)),
        max_inflight,
        default_timeout: Duration::from_millis(a.default_timeout),
        max_timeout,
    });
    outln!(
        "pelican gateway: {} on {}, at http://{addr}/v1/queues/{{queue}}/call",
        if a.queues.is_empty() {
            "any queue".to_string()
        } else {
            format!("queues {}", a.queues.join(", "))
        },
        g.redis.redacted()
    );
    if a.token.is_some() {
        outln!("  every request needs Authorization: Bearer <the --token>");
    }
    outln!("  stop with Ctrl-C");
    let stopping = Arc::new(Notify::new());
    let signalled = stopping.clone();
    // Answers go out as they are written: no wait for the ACK of the previous one.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, routes::router(gw.clone())).with_graceful_shutdown(async move {
        crate::process::interrupted().await;
        eprintln!("pelican gateway: stopping: no new connections; letting the calls in progress finish");
        signalled.notify_one();
    });
    let grace = Duration::from_millis(a.shutdown_timeout);
    let served = tokio::select! {
        r = server => r.map_err(|e| CliError::failure(format!("the gateway's server failed: {e}"))),
        _ = async { stopping.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!(
                "pelican gateway: calls still in progress after {grace:?} (--shutdown-timeout); \
                 ending them: their requests are withdrawn unless someone else waits for them"
            );
            Ok(())
        }
    };
    gw.queues.shutdown().await;
    eprintln!("pelican gateway: stopped");
    served
}
