//! Strict parsing of what arrives in a request: the `Host` header, stream ids, decimal
//! numbers. Strict means the whole text is read and anything left over is an error: a
//! lenient split once let `127.0.0.1:8095@evil.example` pass as a loopback host, and a
//! stream id whose parts overflow 64 bits reached Redis.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A `Host` header: `uri-host [":" port]` (RFC 9110), where the host is a bracketed IPv6
/// literal or a name or IPv4 address of letters, digits, `-` and `.`, and the port is
/// digits (at most 65535).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host<'a> {
    /// The name, IPv4 address or bracketed IPv6 literal (brackets included).
    pub name: &'a str,
    /// The port, when given.
    pub port: Option<u16>,
}

/// Parses a `Host` header's value.
pub fn host(v: &str) -> Result<Host<'_>, String> {
    let bad = |why: &str| {
        Err(format!(
            "the Host header {v:?} is not a host[:port] ({why})"
        ))
    };
    let (name, port) = if v.starts_with('[') {
        let Some(close) = v.find(']') else {
            return bad("an IPv6 address without its closing bracket");
        };
        let (name, rest) = v.split_at(close + 1);
        if name[1..name.len() - 1].parse::<Ipv6Addr>().is_err() {
            return bad("not an IPv6 address between the brackets");
        }
        match rest {
            "" => (name, None),
            _ => match rest.strip_prefix(':') {
                Some(p) => (name, Some(p)),
                None => return bad("something after the address that is not a port"),
            },
        }
    } else {
        match v.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (v, None),
        }
    };
    if !name.starts_with('[') {
        if name.is_empty() {
            return bad("no host name");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return bad("characters a host name does not have");
        }
    }
    let port = match port {
        None => None,
        Some(p) => match decimal_u64(p).and_then(|n| u16::try_from(n).ok()) {
            Some(n) => Some(n),
            None => return bad("the port is not a number up to 65535"),
        },
    };
    Ok(Host { name, port })
}

impl Host<'_> {
    /// `localhost`, an IPv4 loopback address (`127.x.y.z`) or `[::1]`.
    pub fn is_loopback(&self) -> bool {
        if let Some(inside) = self
            .name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
        {
            return inside.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
        }
        self.name.eq_ignore_ascii_case("localhost")
            || self
                .name
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// A decimal number of digits only (no sign, no spaces), within 64 bits.
pub fn decimal_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A stream id `<ms>-<seq>`, both parts decimal within 64 bits (as Redis takes them).
pub fn stream_id(s: &str) -> Option<(u64, u64)> {
    let (ms, seq) = s.split_once('-')?;
    Some((decimal_u64(ms)?, decimal_u64(seq)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_headers_are_read_whole() {
        let ok = |v: &str, name: &str, port: Option<u16>| {
            assert_eq!(host(v), Ok(Host { name, port }), "{v}");
        };
        ok("127.0.0.1:8095", "127.0.0.1", Some(8095));
        ok("localhost", "localhost", None);
        ok("[::1]:80", "[::1]", Some(80));
        ok("[::1]", "[::1]", None);
        ok("dash.example", "dash.example", None);
        for bad in [
            "127.0.0.1:8095@evil.example",
            "127.0.0.1:80:80",
            "127.0.0.1:",
            "127.0.0.1:+80",
            "127.0.0.1:65536",
            "127.0.0.1: 80",
            ":80",
            "",
            "user@127.0.0.1",
            "[::1]x",
            "[::1",
            "[evil]:80",
            "local host",
            "127.0.0.1/x",
        ] {
            assert!(host(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn loopback_names() {
        for yes in [
            "127.0.0.1",
            "127.9.9.9:1",
            "LOCALHOST:80",
            "[::1]:8080",
            "[0:0:0:0:0:0:0:1]",
        ] {
            assert!(host(yes).unwrap().is_loopback(), "{yes}");
        }
        for no in [
            "10.0.0.1",
            "localhost.evil",
            "[::2]",
            "evil.example",
            "127.0.0.1.evil",
        ] {
            assert!(!host(no).unwrap().is_loopback(), "{no}");
        }
    }

    #[test]
    fn numbers_and_stream_ids_are_read_whole() {
        assert_eq!(decimal_u64("18446744073709551615"), Some(u64::MAX));
        for bad in ["18446744073709551616", "", "+1", "-1", " 1", "1 ", "0x10"] {
            assert_eq!(decimal_u64(bad), None, "{bad:?}");
        }
        assert_eq!(stream_id("1700000000000-3"), Some((1_700_000_000_000, 3)));
        for bad in [
            "18446744073709551616-0",
            "1-18446744073709551616",
            "1",
            "1-",
            "-1",
            "1-2-3",
            "a-1",
        ] {
            assert_eq!(stream_id(bad), None, "{bad:?}");
        }
    }
}
