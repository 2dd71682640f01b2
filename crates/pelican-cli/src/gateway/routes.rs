//! The routes and their handlers.
//!
//! - `POST /v1/queues/{queue}/call`: the body is the request; the answer is the response
//!   body (200), or an error (`crate::http::error`, the table in the README).
//! - `POST /v1/queues/{queue}/requests`: submits and answers 202 `{"id": ...}` at once;
//!   the request runs whether or not anyone comes back for it (a detached ticket).
//! - `GET /v1/queues/{queue}/requests/{id}[?wait_ms=N]`: its answer (200, or its error),
//!   202 while it is in work after waiting up to N ms, 404 when Redis knows nothing of it.
//!
//! Every answer names the request (`Pelican-Request-Id`); a submission says how it was
//! served (`Pelican-Served`: `new`, `joined` an identical request in flight, `cached`).
//! A caller that closes its connection drops its handler, and with it its ticket: a
//! waiter that gave up (the request is withdrawn if nobody else waits for it).

use super::input::{self, BodyType};
use super::Gateway;
use crate::http::{fallback, ApiError, Kind};
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use pelican::{CallOptions, ErrorKind, Submitted};
use std::sync::Arc;
use std::time::Duration;

/// `Pelican-Request-Id`: the request's id (the dedup key; `pelican inspect` takes it).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("pelican-request-id");
/// `Pelican-Served`: `new`, `joined` or `cached`.
pub const SERVED: HeaderName = HeaderName::from_static("pelican-served");
/// Least time a result request gives a finished request's answer to be fetched.
const FETCH_TIME: Duration = Duration::from_secs(10);

/// Everything the gateway serves.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/queues/{queue}/call", post(call))
        .route("/v1/queues/{queue}/requests", post(submit))
        .route("/v1/queues/{queue}/requests/{id}", get(result))
        .fallback(fallback::no_route)
        .layer(middleware::from_fn(fallback::json_errors))
        .layer(middleware::from_fn_with_state(gw.clone(), guard))
        .with_state(gw)
}

/// Every request: the policy (Host on loopback, the token), then the bound on calls in
/// flight (503 with Retry-After past it; held until the answer is written).
async fn guard(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    if let Err(e) = gw.policy.admit(req.headers(), req.uri()) {
        return e.into_response();
    }
    let Ok(_permit) = gw.inflight.clone().try_acquire_owned() else {
        return ApiError::new(
            Kind::Overloaded,
            format!(
                "{} calls are in progress here, the most this gateway takes \
                 (--max-inflight); try again shortly",
                gw.max_inflight
            ),
        )
        .into_response();
    };
    next.run(req).await
}

/// An error answer that names its request.
fn failed(e: ApiError, rid: Option<&str>) -> Response {
    let mut res = e.into_response();
    if let Some(v) = rid.and_then(|r| HeaderValue::from_str(r).ok()) {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}

/// `new`, `joined` or `cached`.
fn served(how: Submitted) -> HeaderValue {
    HeaderValue::from_static(match how {
        Submitted::Queued => "new",
        Submitted::Joined => "joined",
        _ => "cached",
    })
}

/// A submission's body and options, read and checked.
struct Submission {
    body: Vec<u8>,
    kind: BodyType,
    options: CallOptions,
}

impl Gateway {
    /// Reads what a submission brings: the queue's limit applies to the body (413 from
    /// `Content-Length` before reading), its type decides how it is checked.
    async fn submission(
        &self,
        queue: &str,
        h: &HeaderMap,
        query: Option<&str>,
        body: Body,
    ) -> Result<Submission, ApiError> {
        let config = self.queues.config(queue)?;
        let kind = BodyType::of(h)?;
        let query = input::query_ms(query, &["timeout_ms"])?;
        let timeout = input::timeout(h, &query, self.default_timeout, self.max_timeout)?;
        let mut options = CallOptions::new().timeout(timeout);
        if let Some(id) = input::request_id(h)? {
            options = options.request_id(id);
        }
        let body = input::read_body(h, body, kind, config.max_body_bytes).await?;
        Ok(Submission {
            body,
            kind,
            options,
        })
    }
}

/// `POST /v1/queues/{queue}/call`.
async fn call(
    State(gw): State<Arc<Gateway>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    h: HeaderMap,
    body: Body,
) -> Response {
    let s = match gw.submission(&queue, &h, query.as_deref(), body).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let producer = match gw.queues.producer(&queue).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let ticket = match producer.submit_bytes_with(s.body.into(), s.options).await {
        Ok(t) => t,
        Err(e) => return ApiError::from(&e).into_response(),
    };
    let rid = HeaderValue::from_str(ticket.request_id()).ok();
    let how = served(ticket.submitted());
    let answer = ticket.await;
    let mut res = match answer {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(s.kind.content_type()),
            )],
            body,
        )
            .into_response(),
        Err(e) => ApiError::from(&e).into_response(),
    };
    let headers = res.headers_mut();
    if let Some(rid) = rid {
        headers.insert(REQUEST_ID, rid);
    }
    headers.insert(SERVED, how);
    res
}

/// `POST /v1/queues/{queue}/requests`: 202 `{"id"}`, and a `Location` to ask for the
/// answer.
async fn submit(
    State(gw): State<Arc<Gateway>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    h: HeaderMap,
    body: Body,
) -> Response {
    let s = match gw.submission(&queue, &h, query.as_deref(), body).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let producer = match gw.queues.producer(&queue).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let ticket = match producer.submit_bytes_with(s.body.into(), s.options).await {
        Ok(t) => t,
        Err(e) => return ApiError::from(&e).into_response(),
    };
    let how = served(ticket.submitted());
    // The request runs whether or not anyone comes back for it.
    let rid = ticket.detach();
    let body = serde_json::json!({ "id": rid }).to_string();
    let mut res = (
        StatusCode::ACCEPTED,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    let headers = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&rid) {
        headers.insert(REQUEST_ID, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "/v1/queues/{}/requests/{}",
        percent_encode(&queue),
        percent_encode(&rid)
    )) {
        headers.insert(header::LOCATION, v);
    }
    headers.insert(SERVED, how);
    res
}

/// `GET /v1/queues/{queue}/requests/{id}[?wait_ms=N]`.
async fn result(
    State(gw): State<Arc<Gateway>>,
    Path((queue, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let wait = match input::query_ms(query.as_deref(), &["wait_ms"]) {
        Ok(q) => q
            .first()
            .map_or(Duration::ZERO, |(_, ms)| Duration::from_millis(*ms))
            .min(gw.max_timeout),
        Err(e) => return e.into_response(),
    };
    let producer = match gw.queues.producer(&queue).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // A finished request's answer may have to be fetched (a large one is stored beside
    // the stream): the watch itself may take that long; the caller's wait bounds only
    // the wait for a request in work.
    let watched = producer.watch(&id, wait.max(FETCH_TIME)).await;
    let ticket = match watched {
        Ok(Some(t)) => t,
        Ok(None) => {
            return failed(
                ApiError::new(
                    Kind::NotFound,
                    format!(
                        "queue {queue:?} knows no request {id:?}: it was never submitted, \
                         finished more than result_ttl ago, expired before a worker took it, \
                         or was submitted without dedup (no index to look it up)"
                    ),
                ),
                Some(&id),
            )
        }
        Err(e) => return failed(ApiError::from(&e), Some(&id)),
    };
    // `None`: still in work when the wait ended (the ticket, dropped, withdraws nothing).
    let answer = match ticket.submitted() {
        Submitted::Joined if wait.is_zero() => None,
        Submitted::Joined => tokio::time::timeout(wait, ticket).await.ok(),
        _ => Some(ticket.await),
    };
    let mut res = match answer {
        Some(Ok(body)) => {
            // The answer's type is not recorded: JSON if it parses, else bytes.
            let kind = if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
                BodyType::Json
            } else {
                BodyType::Bytes
            };
            (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(kind.content_type()),
                )],
                body,
            )
                .into_response()
        }
        None => in_work(&id),
        // The watch's own time ran out, not the request's.
        Some(Err(e)) if e.kind() == ErrorKind::Timeout => in_work(&id),
        Some(Err(e)) => ApiError::from(&e).into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}

/// 202: the request is in work.
fn in_work(id: &str) -> Response {
    let body = serde_json::json!({ "id": id, "status": "in_work" }).to_string();
    (
        StatusCode::ACCEPTED,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// A path segment as a URL carries it: unreserved characters as they are, the rest
/// percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(super::percent_encode("jobs:v1"), "jobs:v1");
        assert_eq!(super::percent_encode("a/b c"), "a%2Fb%20c");
    }
}
