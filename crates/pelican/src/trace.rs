//! One trace per request: the submitting span's W3C trace context (a `traceparent`
//! value) travels in the entry's `tp` field, and the consumer's handler span continues
//! it, so a request is one trace from the producer through the worker and back.
//!
//! Only with the `otel` feature (and an application that installs
//! `tracing-opentelemetry`'s layer): without it nothing is written, and a `tp` field
//! that arrives is carried on the [`crate::Job`] but continues nothing. An entry
//! without `tp`, or with one that does not parse, simply starts no trace of its own.
//!
//! With dedup, identical requests share one entry: it carries the context of whoever
//! submitted first; later submitters' spans are not linked to the handler's.

/// The entry field that carries the trace context.
pub(crate) const FIELD: &str = "tp";

/// Longest `tp` value kept from an entry: a `traceparent` is 55 characters; anything
/// much longer is not one.
const MAX_LEN: usize = 128;

/// The current span's trace context as a `traceparent` value (`None` when the span is
/// not part of an OpenTelemetry trace).
#[cfg(feature = "otel")]
pub(crate) fn current() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    Some(format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    ))
}

/// Without the `otel` feature there is no trace context to pass on.
#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Option<String> {
    None
}

/// Makes `span` (not yet entered) a child of the remote span named by `tp`, if it
/// parses.
#[cfg(feature = "otel")]
pub(crate) fn continue_from(span: &tracing::Span, tp: Option<&str>) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let Some((trace, id, flags)) = tp.and_then(parse) else {
        return;
    };
    let sc = SpanContext::new(
        TraceId::from(trace),
        SpanId::from(id),
        TraceFlags::new(flags),
        true,
        Default::default(),
    );
    // Fails only when no OpenTelemetry layer is installed or the span is disabled:
    // then there is nothing to continue.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
}

/// Without the `otel` feature, spans are not linked across processes.
#[cfg(not(feature = "otel"))]
pub(crate) fn continue_from(_span: &tracing::Span, _tp: Option<&str>) {}

/// A `tp` value as read from an entry: kept only if it is short text.
pub(crate) fn from_entry(raw: Option<&[u8]>) -> Option<std::sync::Arc<str>> {
    let raw = raw.filter(|r| !r.is_empty() && r.len() <= MAX_LEN)?;
    std::str::from_utf8(raw).ok().map(Into::into)
}

/// Parses a version-00 `traceparent`: `00-<32 hex trace id>-<16 hex span id>-<2 hex
/// flags>`, lowercase, ids not all zero. Returns (trace id, span id, flags).
#[cfg_attr(not(any(test, feature = "otel")), allow(dead_code))]
pub(crate) fn parse(tp: &str) -> Option<(u128, u64, u8)> {
    let mut parts = tp.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if parts.next().is_some()
        || version != "00"
        || !hex(trace, 32)
        || !hex(span, 16)
        || !hex(flags, 2)
    {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok()?;
    let span = u64::from_str_radix(span, 16).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    (trace != 0 && span != 0).then_some((trace, span, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_and_junk_does_not() {
        assert_eq!(
            parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1))
        );
        for bad in [
            "",
            "00",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn entry_values_are_kept_only_when_short_text() {
        assert_eq!(from_entry(Some(b"00-ab")).as_deref(), Some("00-ab"));
        assert_eq!(from_entry(None), None);
        assert_eq!(from_entry(Some(b"")), None);
        assert_eq!(from_entry(Some(&[0xff, 0xfe])), None);
        assert_eq!(from_entry(Some(&[b'a'; 200])), None);
    }
}
