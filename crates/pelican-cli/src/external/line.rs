//! The `--exec` line protocol, version 1: one JSON object per line each way (README,
//! "From any language").
//!
//! - pelican -> child, first line: the hello, `{"pelican":1,"body":"json"|"base64",
//!   "concurrency":N,"child":I}`.
//! - child -> pelican, first line: its hello, `{"pelican":1}`. Nothing is sent to a
//!   child before it: a child that loads a model first is not given work it cannot take.
//! - pelican -> child, one line per request: `{"id":..,"delivery":N,"deadline_ms":T,
//!   "traceparent":..,"body":..}` (`deadline_ms` and `traceparent` only when known).
//! - child -> pelican, one line per answer, in any order: `{"id":..,"ok":..}` or
//!   `{"id":..,"error":"..","retry":true|false}` (`retry` false when absent; a retry may
//!   add `"retry_after_ms":N`).
//!
//! Bodies of raw-bytes queues (`--codec raw`) travel as base64 strings (standard
//! alphabet, padded) in `body` and in `ok`: one line stays one JSON object any language
//! reads with its standard library, at a third more bytes.
//!
//! Keys a side does not know are ignored, so the protocol can grow without a new
//! version; a change that old children would misread gets version 2.

use super::{Body, BodyKind, Request};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use pelican::HandlerError;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::time::Duration;

/// The protocol version this pelican speaks.
pub const VERSION: u64 = 1;

/// pelican's hello to a child.
pub fn hello(kind: BodyKind, concurrency: usize, child: usize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Hello {
        pelican: u64,
        body: &'static str,
        concurrency: usize,
        child: usize,
    }
    line_of(&Hello {
        pelican: VERSION,
        body: match kind {
            BodyKind::Json => "json",
            BodyKind::Raw => "base64",
        },
        concurrency,
        child,
    })
}

/// Checks a child's first line: its hello.
pub fn check_hello(line: &[u8]) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Hello {
        pelican: Option<serde_json::Value>,
    }
    let shown = preview(line);
    let h: Hello = serde_json::from_slice(line).map_err(|_| {
        format!(
            "its first line is not the hello {{\"pelican\": {VERSION}}} but {shown} (a child \
             writes its hello first, then only answers, one per line; logs go to stderr)"
        )
    })?;
    match h.pelican {
        Some(v) if v.as_u64() == Some(VERSION) => Ok(()),
        Some(v) => Err(format!(
            "it speaks version {v} of the line protocol; this pelican speaks {VERSION}"
        )),
        None => Err(format!(
            "its first line is not the hello {{\"pelican\": {VERSION}}} but {shown}"
        )),
    }
}

/// The line that hands `req` to a child.
pub fn request(req: &Request) -> Vec<u8> {
    #[derive(Serialize)]
    struct Line<'a> {
        id: &'a str,
        delivery: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        traceparent: Option<&'a str>,
        body: LineBody<'a>,
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum LineBody<'a> {
        Json(&'a RawValue),
        Base64(String),
    }
    line_of(&Line {
        id: &req.id,
        delivery: req.delivery,
        deadline_ms: req.deadline_ms,
        traceparent: req.traceparent.as_deref(),
        body: match &req.body {
            Body::Json(v) => LineBody::Json(v),
            Body::Raw(b) => LineBody::Base64(STANDARD.encode(b)),
        },
    })
}

fn line_of<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).expect("the protocol's lines always encode");
    out.push(b'\n');
    out
}

/// One answer line, decoded: the request id and what it says.
#[derive(Debug)]
pub struct Answer {
    pub id: String,
    pub outcome: Result<Body, HandlerError>,
}

/// Decodes an answer line; `Err` says why it is not one (the child is then restarted).
pub fn answer(line: &[u8], kind: BodyKind) -> Result<Answer, String> {
    #[derive(Deserialize)]
    struct Line {
        id: Option<String>,
        // Present (even `null`) or absent: `null` is a JSON answer.
        #[serde(default, deserialize_with = "present")]
        ok: Option<Box<RawValue>>,
        error: Option<String>,
        retry: Option<bool>,
        retry_after_ms: Option<u64>,
    }
    fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
        Box::<RawValue>::deserialize(d).map(Some)
    }
    let bad = |why: &str| format!("{why}: {}", preview(line));
    let l: Line = serde_json::from_slice(line)
        .map_err(|e| bad(&format!("a line that is not an answer ({e})")))?;
    let Some(id) = l.id else {
        return Err(bad("an answer without \"id\""));
    };
    let outcome = match (l.ok, l.error) {
        (Some(_), Some(_)) => return Err(bad("an answer with both \"ok\" and \"error\"")),
        (None, None) => return Err(bad("an answer with neither \"ok\" nor \"error\"")),
        (Some(v), None) => Ok(match kind {
            BodyKind::Json => Body::Json(v),
            BodyKind::Raw => {
                let text: String = serde_json::from_str(v.get())
                    .map_err(|_| bad("an \"ok\" that is not a base64 string (--codec raw)"))?;
                let bytes = STANDARD
                    .decode(text)
                    .map_err(|e| bad(&format!("an \"ok\" that is not base64 ({e})")))?;
                Body::Raw(bytes.into())
            }
        }),
        (None, Some(msg)) => Err(match (l.retry.unwrap_or(false), l.retry_after_ms) {
            (false, _) => HandlerError::Fail(msg),
            (true, None) => HandlerError::Retry(msg),
            (true, Some(ms)) => HandlerError::RetryAfter(Duration::from_millis(ms), msg),
        }),
    };
    Ok(Answer { id, outcome })
}

/// The start of a line, for messages.
pub fn preview(line: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX)]);
    let more = if line.len() > MAX { "..." } else { "" };
    format!("{:?}{more}", text.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Body) -> Request {
        Request {
            id: "r1".into(),
            body,
            delivery: 2,
            deadline_ms: Some(1_700_000_000_000),
            traceparent: None,
            lease: None,
        }
    }

    #[test]
    fn requests_are_one_line_each() {
        let json = RawValue::from_string(r#"{"n": 1}"#.into()).unwrap();
        let line = request(&req(Body::Json(json)));
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "{\"id\":\"r1\",\"delivery\":2,\"deadline_ms\":1700000000000,\"body\":{\"n\": 1}}\n"
        );
        let line = request(&req(Body::Raw(pelican::Bytes::from_static(b"\x00\xffhi"))));
        assert!(line.ends_with(b",\"body\":\"AP9oaQ==\"}\n"), "{line:?}");
        assert_eq!(
            hello(BodyKind::Raw, 8, 1),
            b"{\"pelican\":1,\"body\":\"base64\",\"concurrency\":8,\"child\":1}\n"
        );
    }

    #[test]
    fn answers_decode() {
        let a = answer(br#"{"id": "a", "ok": {"x": [1]}}"#, BodyKind::Json).unwrap();
        assert_eq!(a.id, "a");
        assert!(matches!(a.outcome, Ok(Body::Json(v)) if v.get() == r#"{"x": [1]}"#));
        let a = answer(br#"{"id": "a", "ok": null}"#, BodyKind::Json).unwrap();
        assert!(matches!(a.outcome, Ok(Body::Json(v)) if v.get() == "null"));
        let a = answer(br#"{"id": "a", "ok": "AP9oaQ=="}"#, BodyKind::Raw).unwrap();
        assert!(matches!(a.outcome, Ok(Body::Raw(b)) if b.as_ref() == b"\x00\xffhi"));
        let a = answer(br#"{"id": "b", "error": "no"}"#, BodyKind::Json).unwrap();
        assert_eq!(a.outcome.unwrap_err(), HandlerError::Fail("no".into()));
        let a = answer(br#"{"id":"b","error":"busy","retry":true}"#, BodyKind::Json).unwrap();
        assert_eq!(a.outcome.unwrap_err(), HandlerError::Retry("busy".into()));
        let a = answer(
            br#"{"id":"b","error":"busy","retry":true,"retry_after_ms":250,"more":1}"#,
            BodyKind::Json,
        )
        .unwrap();
        assert_eq!(
            a.outcome.unwrap_err(),
            HandlerError::RetryAfter(Duration::from_millis(250), "busy".into())
        );
    }

    #[test]
    fn anything_else_is_not_an_answer() {
        for (line, kind) in [
            (&b"hello"[..], BodyKind::Json),
            (b"{\"ok\": 1}", BodyKind::Json),
            (b"{\"id\": 1, \"ok\": 1}", BodyKind::Json),
            (b"{\"id\": \"a\"}", BodyKind::Json),
            (
                b"{\"id\": \"a\", \"ok\": 1, \"error\": \"x\"}",
                BodyKind::Json,
            ),
            (b"{\"id\": \"a\", \"ok\": 1}", BodyKind::Raw),
            (b"{\"id\": \"a\", \"ok\": \"not base64!\"}", BodyKind::Raw),
            (b"[1, 2]", BodyKind::Json),
        ] {
            assert!(answer(line, kind).is_err(), "{}", preview(line));
        }
    }

    #[test]
    fn hellos_are_checked() {
        assert!(check_hello(br#"{"pelican": 1}"#).is_ok());
        assert!(check_hello(br#"{"pelican": 1, "name": "w"}"#).is_ok());
        let e = check_hello(br#"{"pelican": 2}"#).unwrap_err();
        assert!(e.contains("version 2"), "{e}");
        let e = check_hello(b"loading the model...").unwrap_err();
        assert!(e.contains("loading the model"), "{e}");
        assert!(check_hello(br#"{"id": "x", "ok": 1}"#).is_err());
    }
}
