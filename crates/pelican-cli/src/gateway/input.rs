//! What a call brings: its body (typed by `Content-Type`, refused from its
//! `Content-Length` when too large, before it is read), its timeout, its request id, the
//! wait of a result request. Everything is read whole and strictly: what cannot be read
//! is a 400 that says what was expected.

use crate::http::{parse, ApiError, Kind};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use std::time::Duration;

/// `Pelican-Timeout`: a call's timeout in ms.
pub const TIMEOUT_HEADER: &str = "pelican-timeout";
/// `Idempotency-Key`: a request id of the caller's choosing.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How a body is carried, from its `Content-Type`; the answer goes back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    /// `application/json` (or `application/<x>+json`): checked, sent on compacted.
    Json,
    /// `application/octet-stream`: bytes as they are (`pelican::Raw` queues).
    Bytes,
}

impl BodyType {
    /// From the request's headers; 415 for anything else (a missing type too: `curl -d`
    /// sends a form type by default).
    pub fn of(h: &HeaderMap) -> Result<BodyType, ApiError> {
        let given = h
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = given
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => Ok(BodyType::Json),
            "application/octet-stream" => Ok(BodyType::Bytes),
            e if e.starts_with("application/") && e.ends_with("+json") => Ok(BodyType::Json),
            _ => Err(ApiError::new(
                Kind::UnsupportedMediaType,
                format!(
                    "Content-Type {given:?} is not taken: send application/json (a queue of \
                     JSON requests, the default) or application/octet-stream (raw bytes)"
                ),
            )),
        }
    }

    /// The `Content-Type` of an answer.
    pub fn content_type(self) -> &'static str {
        match self {
            BodyType::Json => "application/json",
            BodyType::Bytes => "application/octet-stream",
        }
    }
}

/// Reads the body, at most `max` bytes: refused (413) at once when `Content-Length` says
/// more, or as soon as more arrive (a body without a length). A JSON body must parse
/// (400) and is compacted (see [`compact_json`]).
pub async fn read_body(
    h: &HeaderMap,
    body: Body,
    kind: BodyType,
    max: usize,
) -> Result<Bytes, ApiError> {
    let too_large = |n: &dyn std::fmt::Display| {
        ApiError::new(
            Kind::TooLarge,
            format!(
                "the body is {n} bytes; this queue takes at most {max} (max_body_bytes): send \
                 a reference to the data (a key, a URL) instead"
            ),
        )
    };
    if let Some(len) = h.get(header::CONTENT_LENGTH) {
        let len = len
            .to_str()
            .ok()
            .and_then(parse::decimal_u64)
            .ok_or_else(|| ApiError::new(Kind::BadRequest, "Content-Length is not a number"))?;
        if len > max as u64 {
            return Err(too_large(&len));
        }
    }
    let bytes = axum::body::to_bytes(body, max).await.map_err(|e| {
        let limit = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if limit {
            too_large(&format_args!("more than {max}"))
        } else {
            ApiError::new(Kind::BadRequest, format!("the body could not be read: {e}"))
        }
    })?;
    match kind {
        BodyType::Bytes => Ok(bytes),
        BodyType::Json => compact_json(bytes),
    }
}

/// Checks that `body` is one JSON value and removes the whitespace between its tokens,
/// keeping everything else as sent (key order, number and string spelling). A Rust
/// producer's body is `serde_json::to_vec` of its value, which has no such whitespace:
/// so the same value sent by an HTTP caller and a Rust producer (keys in the struct's
/// order) is one request, and dedup joins them.
pub fn compact_json(body: Bytes) -> Result<Bytes, ApiError> {
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        return Err(ApiError::new(
            Kind::BadRequest,
            format!(
                "the body is not JSON ({e}); send JSON with Content-Type: application/json, or \
                 bytes with application/octet-stream"
            ),
        ));
    }
    // Most programs send JSON without such whitespace: then it goes on as it came.
    let Some(first) = first_space(&body) else {
        return Ok(body);
    };
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..first]);
    let (mut in_string, mut escaped) = (false, false);
    for &b in &body[first..] {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
    Ok(Bytes::from(out))
}

/// Where the first whitespace between the tokens of valid JSON `body` is, if any.
fn first_space(body: &[u8]) -> Option<usize> {
    let (mut in_string, mut escaped) = (false, false);
    for (i, &b) in body.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return Some(i);
        } else if b == b'"' {
            in_string = true;
        }
    }
    None
}

/// A request id of the caller's choosing, from `Idempotency-Key` (checked by the
/// library: 1 to 256 bytes, no control characters).
pub fn request_id(h: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut keys = h.get_all(IDEMPOTENCY_KEY).iter();
    match (keys.next(), keys.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => match v.to_str() {
            Ok(k) => Ok(Some(k.to_string())),
            Err(_) => Err(ApiError::new(
                Kind::BadRequest,
                "Idempotency-Key must be visible ASCII text",
            )),
        },
        (Some(_), Some(_)) => Err(ApiError::new(
            Kind::BadRequest,
            "give one Idempotency-Key, not several",
        )),
    }
}

/// The query parameters of a route, read whole: each known name once, with a number
/// of ms; anything else is a 400.
pub fn query_ms(query: Option<&str>, known: &[&str]) -> Result<Vec<(String, u64)>, ApiError> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&name) {
            return Err(ApiError::new(
                Kind::BadRequest,
                format!(
                    "unknown query parameter {name:?}; this route takes {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(ApiError::new(
                Kind::BadRequest,
                format!("{name} is given twice"),
            ));
        }
        out.push((name.to_string(), ms(name, value)?));
    }
    Ok(out)
}

/// A number of ms, more than zero.
fn ms(what: &str, v: &str) -> Result<u64, ApiError> {
    match parse::decimal_u64(v) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(ApiError::new(
            Kind::BadRequest,
            format!("{what} must be a number of milliseconds above zero, not {v:?}"),
        )),
    }
}

/// A call's timeout: `Pelican-Timeout` or `?timeout_ms=` (not both), else `default`;
/// cut to `max`.
pub fn timeout(
    h: &HeaderMap,
    query: &[(String, u64)],
    default: Duration,
    max: Duration,
) -> Result<Duration, ApiError> {
    let header = match h.get(TIMEOUT_HEADER) {
        None => None,
        Some(v) => Some(ms("Pelican-Timeout", v.to_str().unwrap_or(""))?),
    };
    let param = query
        .iter()
        .find(|(n, _)| n == "timeout_ms")
        .map(|(_, v)| *v);
    let given = match (header, param) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                Kind::BadRequest,
                "give the timeout once: Pelican-Timeout or ?timeout_ms=, not both",
            ))
        }
        (a, b) => a.or(b),
    };
    Ok(given.map_or(default, Duration::from_millis).min(max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn json_is_checked_and_compacted_as_sent() {
        let c = |s: &str| {
            String::from_utf8(
                compact_json(Bytes::copy_from_slice(s.as_bytes()))
                    .unwrap()
                    .to_vec(),
            )
            .unwrap()
        };
        assert_eq!(
            c(" { \"n\" : 12 ,\n \"s\": \"a b\\\" c\" } "),
            r#"{"n":12,"s":"a b\" c"}"#
        );
        assert_eq!(c("[1.50, 1e3, \"\\\\\" ]"), r#"[1.50,1e3,"\\"]"#);
        assert_eq!(c("{\"z\":1,\"a\":2}"), r#"{"z":1,"a":2}"#, "key order kept");
        assert_eq!(
            c("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
        for bad in ["", "{", "{} {}", "nope", "{\"a\":1,}", "\u{feff}{}"] {
            let e = compact_json(Bytes::copy_from_slice(bad.as_bytes())).unwrap_err();
            assert_eq!(e.kind, Kind::BadRequest, "{bad:?}");
        }
    }

    #[test]
    fn content_types() {
        let of = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(t).unwrap());
            BodyType::of(&h)
        };
        assert_eq!(of("application/json").unwrap(), BodyType::Json);
        assert_eq!(
            of("Application/JSON; charset=utf-8").unwrap(),
            BodyType::Json
        );
        assert_eq!(of("application/vnd.x+json").unwrap(), BodyType::Json);
        assert_eq!(of("application/octet-stream").unwrap(), BodyType::Bytes);
        assert!(of("application/x-www-form-urlencoded").is_err());
        assert!(of("text/plain").is_err());
        assert!(BodyType::of(&HeaderMap::new()).is_err());
    }

    #[test]
    fn timeouts_and_queries_are_read_whole() {
        let d = Duration::from_secs(30);
        let max = Duration::from_secs(60);
        let none = HeaderMap::new();
        assert_eq!(timeout(&none, &[], d, max).unwrap(), d);
        let q = query_ms(Some("timeout_ms=250"), &["timeout_ms"]).unwrap();
        assert_eq!(
            timeout(&none, &q, d, max).unwrap(),
            Duration::from_millis(250)
        );
        let q = query_ms(Some("timeout_ms=999999999"), &["timeout_ms"]).unwrap();
        assert_eq!(timeout(&none, &q, d, max).unwrap(), max, "cut to the max");
        let mut h = HeaderMap::new();
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("1500"));
        assert_eq!(
            timeout(&h, &[], d, max).unwrap(),
            Duration::from_millis(1500)
        );
        let q = query_ms(Some("timeout_ms=250"), &["timeout_ms"]).unwrap();
        assert!(timeout(&h, &q, d, max).is_err(), "both given");
        for bad in ["0", "-1", "1.5", "", "1s", "18446744073709551616"] {
            h.insert(TIMEOUT_HEADER, HeaderValue::from_str(bad).unwrap());
            assert!(timeout(&h, &[], d, max).is_err(), "{bad:?}");
        }
        for bad in [
            "timeout_ms=x",
            "timeout=5",
            "timeout_ms=1&timeout_ms=2",
            "timeout_ms",
        ] {
            assert!(query_ms(Some(bad), &["timeout_ms"]).is_err(), "{bad}");
        }
        assert!(query_ms(None, &[]).unwrap().is_empty());
    }
}
