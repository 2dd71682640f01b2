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
use crate::http::{ApiError, Kind};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use pelican::{CallOptions, ErrorKind, Submitted};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;

/// `Pelican-Request-Id`: the request's id (the dedup key; `pelican inspect` takes it).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("pelican-request-id");
/// `Pelican-Served`: `new`, `joined` or `cached`.
pub const SERVED: HeaderName = HeaderName::from_static("pelican-served");
/// Least time a result request gives a finished request's answer to be fetched.
const FETCH_TIME: Duration = Duration::from_secs(10);

use axum::http::HeaderName;

/// Everything the gateway serves. No middleware: each handler runs the checks itself
/// ([`Gateway::admit`]), and the errors of the HTTP stack (no route, wrong method, a path
/// that is not UTF-8) are answered by handlers of their own, all in the one JSON shape:
/// a layer per request cost the gateway a fifth of its time per call.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/queues/{queue}/call", post(call))
        .route("/v1/queues/{queue}/requests", post(submit))
        .route("/v1/queues/{queue}/requests/{id}", get(result))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(gw)
}

impl Gateway {
    /// Every request: the policy (Host on loopback, the token), then the bound on calls
    /// in flight (503 with Retry-After past it; the permit is held until the answer is
    /// made).
    fn admit(&self, req: &Request) -> Result<OwnedSemaphorePermit, ApiError> {
        self.policy.admit(req.headers(), req.uri())?;
        self.inflight.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                Kind::Overloaded,
                format!(
                    "{} calls are in progress here, the most this gateway takes \
                     (--max-inflight); try again shortly",
                    self.max_inflight
                ),
            )
        })
    }
}

/// No such route (the policy first: a foreign Host learns nothing).
async fn no_route(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    if let Err(e) = gw.policy.admit(req.headers(), req.uri()) {
        return e.into_response();
    }
    ApiError::new(
        Kind::NotFound,
        "no such route: POST /v1/queues/{queue}/call, POST /v1/queues/{queue}/requests, \
         GET /v1/queues/{queue}/requests/{id}",
    )
    .into_response()
}

/// The route exists, not for this method (axum adds the `Allow` header).
async fn wrong_method(State(gw): State<Arc<Gateway>>, method: Method, req: Request) -> Response {
    if let Err(e) = gw.policy.admit(req.headers(), req.uri()) {
        return e.into_response();
    }
    ApiError::new(
        Kind::MethodNotAllowed,
        format!("{method} is not served on this route; its Allow header names the method it takes"),
    )
    .into_response()
}

/// A path parameter that could not be read (not UTF-8).
fn bad_path(e: PathRejection) -> ApiError {
    ApiError::new(Kind::BadRequest, e.body_text())
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
    body: axum::body::Bytes,
    kind: BodyType,
    options: CallOptions,
}

impl Gateway {
    /// Reads what a submission brings: the queue's limit applies to the body (413 from
    /// `Content-Length` before reading), its type decides how it is checked.
    async fn submission(&self, req: Request) -> Result<Submission, ApiError> {
        let (parts, body) = req.into_parts();
        let h = &parts.headers;
        let kind = BodyType::of(h)?;
        let query = input::query_ms(parts.uri.query(), &["timeout_ms"])?;
        let timeout = input::timeout(h, &query, self.default_timeout, self.max_timeout)?;
        let mut options = CallOptions::new().with_timeout(timeout);
        if let Some(id) = input::request_id(h)? {
            options = options.with_request_id(id);
        }
        let body = input::read_body(h, body, kind, self.queues.max_body_bytes()).await?;
        Ok(Submission {
            body,
            kind,
            options,
        })
    }

    /// Admits a submission, reads it and submits it: its ticket and body type.
    async fn submit(
        &self,
        queue: Result<Path<String>, PathRejection>,
        req: Request,
    ) -> Result<
        (
            pelican::Ticket<pelican::Bytes, pelican::Raw>,
            BodyType,
            OwnedSemaphorePermit,
        ),
        ApiError,
    > {
        let permit = self.admit(&req)?;
        let Path(queue) = queue.map_err(bad_path)?;
        let slot = self.queues.slot(&queue)?;
        let s = self.submission(req).await?;
        let producer = self.queues.producer(&queue, &slot).await?;
        let ticket = producer
            .submit_bytes_with(s.body, s.options)
            .await
            .map_err(|e| ApiError::from(&e))?;
        Ok((ticket, s.kind, permit))
    }
}

/// `POST /v1/queues/{queue}/call`.
async fn call(
    State(gw): State<Arc<Gateway>>,
    queue: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let (ticket, kind, _permit) = match gw.submit(queue, req).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let rid = HeaderValue::from_str(ticket.request_id()).ok();
    let how = served(ticket.submitted());
    let mut res = match ticket.await {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(kind.content_type()),
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
    queue: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let queue_name = match &queue {
        Ok(Path(q)) => q.clone(),
        Err(_) => String::new(),
    };
    let (ticket, _, _permit) = match gw.submit(queue, req).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
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
        percent_encode(&queue_name),
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
    path: Result<Path<(String, String)>, PathRejection>,
    req: Request,
) -> Response {
    let _permit = match gw.admit(&req) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (queue, id) = match path {
        Ok(Path(p)) => p,
        Err(e) => return bad_path(e).into_response(),
    };
    let wait = match input::query_ms(req.uri().query(), &["wait_ms"]) {
        Ok(q) => q
            .first()
            .map_or(Duration::ZERO, |(_, ms)| Duration::from_millis(*ms))
            .min(gw.max_timeout),
        Err(e) => return e.into_response(),
    };
    let producer = match gw.queues.slot(&queue) {
        Ok(slot) => gw.queues.producer(&queue, &slot).await,
        Err(e) => Err(e),
    };
    let producer = match producer {
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
