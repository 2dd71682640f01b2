//! The one error answer of the HTTP surfaces: `{"error": {"kind": ..., "message": ...}}`
//! with a status chosen by the kind, so a client can branch on the kind's name and a
//! proxy on the status. 503 means Redis cannot be reached (or the process is too busy or
//! stopping), never a fault of the request or a refusal by Redis.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pelican::ErrorKind;

/// What went wrong, as a client can act on it. Each kind has one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 400: a bad queue name, request id, body, header or parameter.
    BadRequest,
    /// 401: no credentials (no token, no session), or a session that is gone.
    Unauthorized,
    /// 403: a wrong token, a foreign origin, a Host that is not a loopback name.
    Forbidden,
    /// 404: no such route, queue, request or dead letter.
    NotFound,
    /// 405: the route exists, not for this method.
    MethodNotAllowed,
    /// 413: a body larger than the queue's `max_body_bytes`.
    TooLarge,
    /// 415: a body type the route does not take.
    UnsupportedMediaType,
    /// 422: the handler failed the request for good (its own message).
    Remote,
    /// 500: the request was dead-lettered (delivered `max_deliveries` times without an
    /// outcome, or undecodable).
    Dead,
    /// 500: Redis refused a command (it was reached; sending the same again gets the
    /// same answer).
    RedisRefused,
    /// 500: a fault of pelican itself.
    Internal,
    /// 503: Redis cannot be reached (down, restarting, loading its data).
    Unavailable,
    /// 503: too many calls in flight here; try again shortly.
    Overloaded,
    /// 503: the process is stopping, or the request was withdrawn as it stopped.
    ShuttingDown,
    /// 504: no outcome within the call's timeout.
    Timeout,
    /// 504: the request's deadline passed before a worker solved it.
    Expired,
}

impl Kind {
    /// Its name in the body.
    pub fn name(self) -> &'static str {
        match self {
            Kind::BadRequest => "bad_request",
            Kind::Unauthorized => "unauthorized",
            Kind::Forbidden => "forbidden",
            Kind::NotFound => "not_found",
            Kind::MethodNotAllowed => "method_not_allowed",
            Kind::TooLarge => "too_large",
            Kind::UnsupportedMediaType => "unsupported_media_type",
            Kind::Remote => "remote",
            Kind::Dead => "dead",
            Kind::RedisRefused => "redis_refused",
            Kind::Internal => "internal",
            Kind::Unavailable => "unavailable",
            Kind::Overloaded => "overloaded",
            Kind::ShuttingDown => "shutting_down",
            Kind::Timeout => "timeout",
            Kind::Expired => "expired",
        }
    }

    /// Its status.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::Forbidden => StatusCode::FORBIDDEN,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::Remote => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::Dead | Kind::RedisRefused | Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Kind::Unavailable | Kind::Overloaded | Kind::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Kind::Timeout | Kind::Expired => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `Retry-After` of a passing state, in seconds.
    fn retry_after(self) -> Option<&'static str> {
        match self {
            Kind::Unavailable | Kind::Overloaded | Kind::ShuttingDown => Some("1"),
            _ => None,
        }
    }

    /// The kind of an error answer that was not made by [`ApiError`] (a rejection of
    /// the HTTP stack), by its status.
    pub fn of_status(s: StatusCode) -> Kind {
        match s {
            StatusCode::UNAUTHORIZED => Kind::Unauthorized,
            StatusCode::FORBIDDEN => Kind::Forbidden,
            StatusCode::NOT_FOUND => Kind::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => Kind::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => Kind::TooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Kind::UnsupportedMediaType,
            StatusCode::SERVICE_UNAVAILABLE => Kind::Unavailable,
            StatusCode::GATEWAY_TIMEOUT => Kind::Timeout,
            s if s.is_client_error() => Kind::BadRequest,
            _ => Kind::Internal,
        }
    }
}

/// An error answer: a kind and a message for people.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// What went wrong.
    pub kind: Kind,
    /// Says what happened and, where it helps, what to do.
    pub message: String,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    /// Its body: `{"error": {"kind": ..., "message": ...}}`.
    pub fn body(&self) -> String {
        serde_json::json!({ "error": { "kind": self.kind.name(), "message": self.message } })
            .to_string()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (
            self.kind.status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body(),
        )
            .into_response();
        if let Some(s) = self.kind.retry_after() {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(s));
        }
        if self.kind == Kind::Unauthorized {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    }
}

/// The answer to a library error.
impl From<&pelican::Error> for ApiError {
    fn from(e: &pelican::Error) -> Self {
        let kind = match e.kind() {
            ErrorKind::Config => Kind::BadRequest,
            ErrorKind::TooLarge => Kind::TooLarge,
            ErrorKind::Remote => Kind::Remote,
            ErrorKind::Dead => Kind::Dead,
            ErrorKind::Expired => Kind::Expired,
            ErrorKind::Timeout => Kind::Timeout,
            ErrorKind::Cancelled | ErrorKind::Shutdown => Kind::ShuttingDown,
            ErrorKind::Redis => {
                let redis = std::error::Error::source(e)
                    .and_then(|s| s.downcast_ref::<redis::RedisError>());
                return match redis {
                    Some(r) => redis_error(e.message(), r),
                    // Said by pelican itself (a reply it could not read): Redis answered.
                    None => ApiError::new(Kind::RedisRefused, e.message()),
                };
            }
            _ => Kind::Internal,
        };
        // Remote: the handler's own words, as they are.
        let message = match e.kind() {
            ErrorKind::Remote => e.message().to_string(),
            _ => without_internals(&e.message_with_causes()),
        };
        ApiError::new(kind, message)
    }
}

impl From<pelican::Error> for ApiError {
    fn from(e: pelican::Error) -> Self {
        ApiError::from(&e)
    }
}

/// A Redis error while doing `doing`: 503 when Redis was not reached or cannot serve
/// yet, else Redis' refusal (500), without the names of pelican's scripts.
pub fn redis_error(doing: &str, e: &redis::RedisError) -> ApiError {
    if unreachable(e) {
        return ApiError::new(
            Kind::Unavailable,
            format!(
                "cannot reach Redis ({doing}): {}",
                without_internals(&e.to_string())
            ),
        );
    }
    let what = match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    };
    ApiError::new(
        Kind::RedisRefused,
        format!("Redis refused {doing}: {}", without_internals(&what)),
    )
}

/// Whether Redis was not reached (no answer, a dropped connection) or cannot serve yet
/// (`LOADING` its data after a restart, a replica without its master, a cluster with
/// slots unserved).
pub fn unreachable(e: &redis::RedisError) -> bool {
    match e.code() {
        Some(code) => matches!(code, "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN"),
        None => {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || e.is_unrecoverable_error()
        }
    }
}

/// `text` without what only pelican's developers need: Redis names the function that
/// failed (`script: pelican_<hash>_requeue, on @user_function:12.`).
pub fn without_internals(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(at) = out.find("script: ") {
        // up to the end of the sentence Redis appended (its last '.', or the end)
        let rest = &out[at..];
        let end = rest.find(". ").map_or(rest.len(), |e| e + 1);
        out.replace_range(at..at + end, "");
    }
    out.trim_end_matches([',', ' ']).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_names_are_kept_out_of_messages() {
        let said = "ERR Invalid stream ID specified as stream command argument script: \
                    pelican_0123456789abcdef_requeue, on @user_function:31.";
        assert_eq!(
            without_internals(said),
            "ERR Invalid stream ID specified as stream command argument"
        );
        assert_eq!(without_internals("plain words"), "plain words");
    }

    #[test]
    fn every_kind_has_its_status_and_a_body_of_one_shape() {
        let e = ApiError::new(Kind::Overloaded, "busy");
        let r = e.clone().into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"kind": "overloaded", "message": "busy"}})
        );
        assert_eq!(
            Kind::of_status(StatusCode::METHOD_NOT_ALLOWED),
            Kind::MethodNotAllowed
        );
        assert_eq!(Kind::of_status(StatusCode::IM_A_TEAPOT), Kind::BadRequest);
    }

    #[test]
    fn refusals_are_told_from_an_unreachable_redis() {
        let said = b"-ERR Invalid stream ID script: pelican_00_requeue, on @user_function:3.\r\n";
        let redis::Value::ServerError(refused) = redis::parse_redis_value(said).unwrap() else {
            panic!("an error reply")
        };
        let refused = redis::RedisError::from(refused);
        let down =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(redis_error("x", &down).kind, Kind::Unavailable);
        let r = redis_error("requeueing", &refused);
        assert_eq!(r.kind, Kind::RedisRefused);
        assert!(!r.message.contains("pelican_00"), "{r}");
        assert!(r.message.contains("ERR Invalid stream ID"), "{r}");
    }
}
