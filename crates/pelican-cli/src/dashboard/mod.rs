//! `pelican dashboard`: a live web dashboard of every queue under the key prefix.
//!
//! - `sampler`: samples every queue once a second into a bounded history (what is
//!   measured and how: see there); `discover`: finds the queues (a partitioned queue's
//!   tags `Q#p` count as one queue `Q`).
//! - `server`: routes, the page and assets (embedded: `assets/`), the login link, the
//!   checks of every request (the rules themselves, token, sessions, Host and origin, and
//!   the error answers are shared with the gateway: `crate::http`); `api`: the JSON API.
//! - `reply`: reading Redis replies; `link`: the connection (one node, or a cluster
//!   through the library's `Deployment`).
//!
//! The page reads `/api/queues` (overview) or `/api/queues/{queue}` (one queue) every
//! second or two and draws the numbers and the charts (inline SVG) itself.

mod api;
mod discover;
mod link;
mod reply;
mod sampler;
mod server;

use crate::cli::{DashboardArgs, Global};
use crate::exit::{CliError, CliResult};
use crate::http::{policy, Policy};
use link::Link;
use pelican::Admin;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sampler::SharedBoard;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// How long the dashboard's Redis commands may take before the page says Redis is down.
const REDIS_TIMEOUT: Duration = Duration::from_secs(3);
/// The cookie that carries a session id (set by the login link).
const COOKIE: &str = "pelican_dashboard";
/// Deadline of a requeued request, from the moment it is requeued.
const REQUEUE_TIMEOUT: Duration = pelican::admin::DEFAULT_REQUEUE_TIMEOUT;

/// What the handlers share.
pub struct App {
    board: SharedBoard,
    conn: Link,
    policy: Policy,
    read_only: bool,
    prefix: String,
    redis_shown: String,
    global: Global,
    /// Per queue: its admin handle, and the sampler's count of outages when it was made.
    admins: tokio::sync::Mutex<HashMap<String, (Arc<Admin>, u64)>>,
    requeue_timeout: Duration,
    /// When a page last made the dashboard look for a queue it had not seen.
    last_lookup: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Serves the dashboard until SIGINT/SIGTERM.
pub async fn run(g: &Global, a: &DashboardArgs) -> CliResult {
    let loopback = a.listen.ip().is_loopback();
    if !loopback && a.token.is_none() {
        return Err(CliError::usage(format!(
            "refusing to serve the dashboard on {} without --token: it is not a loopback \
             address, so anyone who reaches it could read the queues and requeue or purge \
             dead letters. Give a --token of at least {} characters (and prefer a reverse \
             proxy with TLS in front)",
            a.listen,
            policy::MIN_TOKEN_LEN
        )));
    }
    if let Some(t) = &a.token {
        policy::check_token(t).map_err(CliError::usage)?;
    }
    let queue = g.queue_config()?.with_prefix(a.prefix.clone());
    queue
        .validate()
        .map_err(|e| CliError::usage(format!("--prefix {:?}: {}", a.prefix, e.message())))?;
    let token = match &a.token {
        Some(t) => t.clone(),
        None => policy::random_hex()
            .map_err(|e| CliError::failure(format!("cannot make a random token: {e}")))?,
    };
    let conn = connect(g, &queue).await?;
    let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| {
        CliError::failure(format!(
            "cannot listen on {}: {e}; choose another address with --listen",
            a.listen
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", a.listen)))?;
    let board = SharedBoard::default();
    let app = Arc::new(App {
        board: board.clone(),
        conn: conn.clone(),
        policy: Policy::new(Some(token.clone()), loopback).with_sessions(COOKIE),
        read_only: a.read_only,
        prefix: a.prefix.clone(),
        redis_shown: g.redis.redacted(),
        global: g.clone(),
        admins: Default::default(),
        requeue_timeout: REQUEUE_TIMEOUT,
        last_lookup: Default::default(),
    });
    let sampler = tokio::spawn(sampler::run(conn, a.prefix.clone(), board));
    let _stop_sampler = AbortOnDrop(sampler);
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    outln!(
        "pelican dashboard: queues under prefix {:?} on {}, at http://{addr}/",
        a.prefix,
        g.redis.redacted()
    );
    if a.read_only {
        outln!("  read-only: no requeue, no purge");
    }
    if !a.read_only || !loopback {
        outln!(
            "  log in (to requeue and purge{}): http://{addr}/login?token={}",
            if loopback {
                ""
            } else {
                ", and to see anything"
            },
            token
        );
    }
    outln!("  stop with Ctrl-C");
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    axum::serve(listener, server::router(app))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| CliError::failure(format!("the dashboard's server failed: {e}")))?;
    eprintln!("pelican dashboard: stopped");
    Ok(())
}

/// A connection that reconnects by itself: the dashboard keeps running while Redis is
/// down and says so on the page. On one node it is lazy: the dashboard starts even when
/// Redis does not answer yet. A cluster must answer at start (its connection learns the
/// nodes then), and is followed through failovers and reshardings after.
async fn connect(g: &Global, queue: &pelican::QueueConfig) -> CliResult<Link> {
    let url = g.redis.as_str();
    if url.contains("+cluster://") {
        let ca = queue.tls_root_ca_pem.as_deref();
        return pelican::admin::Deployment::connect(url, ca, REDIS_TIMEOUT)
            .await
            .map(Link::Cluster)
            .map_err(|e| g.error(&e));
    }
    let client = match &g.tls_ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                CliError::usage(format!(
                    "cannot read the CA file {} (--tls-ca): {e}",
                    path.display()
                ))
            })?;
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
        }
        None => redis::Client::open(url),
    }
    .map_err(|e| CliError::usage(format!("bad --redis URL {}: {e}", g.redis.redacted())))?;
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_TIMEOUT))
        .set_response_timeout(Some(REDIS_TIMEOUT))
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_lazy_with_config(client, cfg)
        .map(Link::Node)
        .map_err(|e| {
            CliError::failure(format!(
                "cannot set up a connection to {}: {e}",
                g.redis.redacted()
            ))
        })
}

fn signal_error(e: std::io::Error) -> CliError {
    CliError::failure(format!("cannot install signal handlers: {e}"))
}

/// Stops the sampler when the dashboard ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
