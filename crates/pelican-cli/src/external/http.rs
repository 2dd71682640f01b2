//! `--http URL`: each request POSTed to an endpoint over a keep-alive pool of HTTP/1.1
//! connections (hyper's pooled client), the response's status saying what became of it
//! ([`outcome`], the README's table).

use super::{Body, BodyKind, Request, Settings};
use crate::exit::{CliError, CliResult};
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pelican::{Bytes, HandlerError};
use serde_json::value::RawValue;
use std::fmt;
use std::time::Duration;

/// Longest part of an error response kept as the failure's message.
const MAX_MESSAGE: usize = 64 << 10;
/// How long an unused connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// The client of `--http`.
pub struct Caller {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    settings: Settings,
}

impl Caller {
    /// A client for `url` (http:// only), pooling up to `concurrency` connections.
    pub fn new(url: &str, settings: Settings) -> CliResult<Caller> {
        let bad = |why: &str| {
            CliError::usage(format!(
                "--http {url:?}: {why}; give the endpoint as http://HOST:PORT/PATH (https is \
                 not built in: put a local proxy in between)"
            ))
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// is supported"));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("the URL names no host"));
        }
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(settings.concurrency)
            .pool_idle_timeout(POOL_IDLE)
            .build(conn);
        Ok(Caller {
            client,
            url: uri,
            settings,
        })
    }

    /// POSTs `req`; the outcome by the response's status, a retry on a refused
    /// connection, a timeout (`--handler-timeout`) or a lost lease.
    pub async fn call(&self, req: Request) -> Result<Body, HandlerError> {
        let timeout = self.settings.handler_timeout;
        let lease = req.lease.clone();
        let work = tokio::time::timeout(timeout, self.post(req));
        let lost = async {
            match &lease {
                Some(l) => l.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = work => r.unwrap_or_else(|_| Err(HandlerError::retry(format!(
                "{}: no answer within --handler-timeout ({} ms)",
                self.url,
                timeout.as_millis()
            )))),
            // Another consumer has it now: nothing to wait for.
            _ = lost => Err(HandlerError::RetryAfter(Duration::ZERO, "the lease was lost; the call was abandoned".into())),
        }
    }

    async fn post(&self, req: Request) -> Result<Body, HandlerError> {
        let (content_type, body) = match req.body {
            Body::Json(v) => (
                "application/json",
                Bytes::from(String::from(Box::<str>::from(v))),
            ),
            Body::Raw(b) => ("application/octet-stream", b),
        };
        let mut builder = hyper::Request::post(self.url.clone())
            .header(CONTENT_TYPE, content_type)
            .header("pelican-delivery", req.delivery);
        // A request id is any text without control characters: valid header bytes.
        if let Ok(v) = HeaderValue::from_bytes(req.id.as_bytes()) {
            builder = builder.header("pelican-request-id", v);
        }
        if let Some(ms) = req.deadline_ms {
            builder = builder.header("pelican-deadline", ms);
        }
        if let Some(tp) = req.traceparent.as_deref() {
            if let Ok(v) = HeaderValue::from_str(tp) {
                builder = builder.header("traceparent", v);
            }
        }
        let request = builder
            .body(Full::new(body))
            .expect("the request's parts are valid");
        let resp = self
            .client
            .request(request)
            .await
            .map_err(|e| HandlerError::retry(format!("{}: {}", self.url, error_chain(&e))))?;
        let (parts, mut body) = resp.into_parts();
        let limit = if parts.status.is_success() {
            self.settings.max_body_bytes
        } else {
            MAX_MESSAGE
        };
        let mut buf = Vec::new();
        let mut over = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                HandlerError::retry(format!(
                    "{}: reading the response: {}",
                    self.url,
                    error_chain(&e)
                ))
            })?;
            if let Some(data) = frame.data_ref() {
                let room = limit - buf.len();
                buf.extend_from_slice(&data[..data.len().min(room)]);
                if data.len() > room {
                    over = true;
                    break;
                }
            }
        }
        outcome(
            parts.status,
            &parts.headers,
            Bytes::from(buf),
            over,
            self.settings.kind,
        )
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--http {}", self.url)
    }
}

/// What a response makes of the request (the README's table):
/// - 2xx: the body is the answer (JSON queues: it must be JSON; an empty body is `null`);
/// - 408, 429, 5xx: retry (after `Retry-After` seconds when given);
/// - any other 4xx: fail for good, the body (or the status) as the message;
/// - 1xx, 3xx (redirects are not followed) and anything else: retry, so a misconfigured
///   URL ends in the dead letters (`pelican dead requeue` once it is fixed), not in lost
///   requests.
///
/// `over`: the body was longer than the limit (and cut).
pub fn outcome(
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
    over: bool,
    kind: BodyKind,
) -> Result<Body, HandlerError> {
    let code = status.as_u16();
    let text = || {
        let t = String::from_utf8_lossy(&body).trim().to_string();
        let cut = if over { " (cut)" } else { "" };
        if t.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("{t}{cut}")
        }
    };
    match code {
        200..=299 => {
            if over {
                return Err(HandlerError::fail(format!(
                    "HTTP {status}: the answer is larger than max_body_bytes"
                )));
            }
            match kind {
                BodyKind::Raw => Ok(Body::Raw(body)),
                BodyKind::Json if body.trim_ascii().is_empty() => Ok(Body::Json(
                    RawValue::from_string("null".into()).expect("null is JSON"),
                )),
                BodyKind::Json => {
                    let text = String::from_utf8(body.to_vec()).map_err(|_| not_json(status))?;
                    RawValue::from_string(text)
                        .map(Body::Json)
                        .map_err(|_| not_json(status))
                }
            }
        }
        408 | 429 | 500..=599 => {
            let msg = format!("HTTP {status}: {}", text());
            match retry_after(headers) {
                Some(d) => Err(HandlerError::RetryAfter(d, msg)),
                None => Err(HandlerError::retry(msg)),
            }
        }
        400..=499 => Err(HandlerError::fail(text())),
        _ => Err(HandlerError::retry(format!(
            "HTTP {status} (redirects are not followed: give --http the final URL): {}",
            text()
        ))),
    }
}

fn not_json(status: StatusCode) -> HandlerError {
    HandlerError::fail(format!(
        "HTTP {status}: the answer is not JSON (a JSON queue's handler answers JSON; \
         --codec raw takes any bytes)"
    ))
}

/// `Retry-After` in seconds (the HTTP-date form is not used by handlers; ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: u16, body: &str, kind: BodyKind) -> Result<Body, HandlerError> {
        outcome(
            StatusCode::from_u16(code).unwrap(),
            &HeaderMap::new(),
            Bytes::from(body.to_string()),
            false,
            kind,
        )
    }

    #[test]
    fn statuses_map_to_outcomes() {
        assert!(
            matches!(run(200, r#"{"a":1}"#, BodyKind::Json), Ok(Body::Json(v)) if v.get() == r#"{"a":1}"#)
        );
        assert!(matches!(run(204, "", BodyKind::Json), Ok(Body::Json(v)) if v.get() == "null"));
        assert!(
            matches!(run(201, "\u{0}x", BodyKind::Raw), Ok(Body::Raw(b)) if b.as_ref() == b"\0x")
        );
        assert!(
            matches!(run(200, "nope", BodyKind::Json), Err(HandlerError::Fail(m)) if m.contains("not JSON"))
        );
        assert_eq!(
            run(404, "no such thing", BodyKind::Json).unwrap_err(),
            HandlerError::fail("no such thing")
        );
        assert_eq!(
            run(400, "", BodyKind::Json).unwrap_err(),
            HandlerError::fail("HTTP 400 Bad Request")
        );
        for code in [408, 429, 500, 502, 503, 504, 599, 301, 302, 101] {
            assert!(
                matches!(run(code, "x", BodyKind::Json), Err(HandlerError::Retry(_))),
                "{code}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        let r = outcome(
            StatusCode::TOO_MANY_REQUESTS,
            &h,
            Bytes::new(),
            false,
            BodyKind::Json,
        );
        assert!(matches!(r, Err(HandlerError::RetryAfter(d, _)) if d == Duration::from_secs(3)));
        let r = outcome(
            StatusCode::OK,
            &h,
            Bytes::from_static(b"1"),
            true,
            BodyKind::Json,
        );
        assert!(matches!(r, Err(HandlerError::Fail(m)) if m.contains("max_body_bytes")));
    }
}
