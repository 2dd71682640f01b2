//! Errors that the HTTP stack answers by itself, made JSON like every other: a wrong
//! method (405, which axum answers with an empty body), a path that is not UTF-8 or a
//! query that does not parse (400 in plain text), no such route (404).

use super::error::{ApiError, Kind};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Longest rejection text read to become the message.
const MAX_MESSAGE: usize = 4096;

/// A middleware (`axum::middleware::from_fn`): an error answer that is neither JSON nor
/// an HTML page becomes `{"error": {"kind", "message"}}`, its kind from its status, its
/// message from its text.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let res = next.run(req).await;
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let typed = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json") || t.starts_with("text/html"));
    if typed {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, MAX_MESSAGE)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let kind = Kind::of_status(status);
    let message = match kind {
        // axum adds the `Allow` header after every layer of a route.
        Kind::MethodNotAllowed => {
            format!(
                "{method} is not served on this route; its Allow header names the methods it takes"
            )
        }
        Kind::NotFound if text.is_empty() => "no such route".to_string(),
        _ if text.is_empty() => status.canonical_reason().unwrap_or("refused").to_string(),
        _ => text,
    };
    let mut out = ApiError::new(kind, message).into_response();
    // The status stays the stack's (a 408 is a 408), the headers too (Allow).
    *out.status_mut() = status;
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH && !value.is_empty() {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    if method == Method::HEAD {
        *out.body_mut() = Body::empty();
    }
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    out
}
