//! Who may do what. Reads are open on a loopback address; mutations (requeue, purge)
//! need the token, and come from the dashboard's own page.
//!
//! - The token arrives as the `pelican_dashboard` cookie (set by the login link
//!   `/login?token=T`: HttpOnly, SameSite=Strict) or as `Authorization: Bearer T` (curl,
//!   scripts). Without it: 401.
//! - A mutation's origin must be the dashboard's own: an `Origin` header equal to
//!   `http://<Host>`, a `Sec-Fetch-Site` of `same-origin`; a request with neither is
//!   accepted only with the `Authorization` header (no browser sends a cookie-only POST
//!   without them). Otherwise: 403.
//! - On a loopback address the `Host` header must name a loopback host (`localhost`,
//!   `127.x.y.z`, `[::1]`): a page of another site that rebinds its DNS name to
//!   127.0.0.1 gets 403 and reads nothing. On any other address every request needs the
//!   token (the server refuses to start there without `--token`).

use axum::http::{header, HeaderMap, StatusCode};
use std::io::Read;

/// The cookie that carries the token.
pub const COOKIE: &str = "pelican_dashboard";
/// Shortest token accepted from `--token`.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a request is refused: a status and a message for the page.
#[derive(Debug)]
pub struct Refusal(pub StatusCode, pub String);

/// Checks a `--token`: long enough, and only characters a URL carries as they are.
pub fn check_token(t: &str) -> Result<(), String> {
    if t.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "--token is {} characters; use at least {MIN_TOKEN_LEN} (or leave it out for a \
             random one)",
            t.len()
        ));
    }
    if let Some(c) = t
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._~".contains(*c)))
    {
        return Err(format!(
            "--token contains {c:?}; use letters, digits and - . _ ~ (it goes into the login link)"
        ));
    }
    Ok(())
}

/// A random token: 128 bits from the OS, in hex.
pub fn random_token() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Compares without stopping at the first difference (no timing hint about the token).
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The policy of one running dashboard.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The token.
    pub token: String,
    /// Bound to a loopback address.
    pub loopback: bool,
}

/// Where the token of a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The login cookie (a browser).
    Cookie,
    /// `Authorization: Bearer` (a script).
    Header,
}

impl Policy {
    /// Every request: the Host check (loopback), and the token when not on loopback.
    pub fn admit(&self, h: &HeaderMap) -> Result<(), Refusal> {
        if self.loopback {
            let host = h
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !is_loopback_host(host) {
                return Err(Refusal(
                    StatusCode::FORBIDDEN,
                    format!(
                        "this dashboard answers only to a loopback host name (localhost, \
                         127.0.0.1, [::1]), not {host:?}"
                    ),
                ));
            }
            Ok(())
        } else {
            self.token_of(h).map(|_| ())
        }
    }

    /// Whether the request carries the token (for the page: show the buttons or not).
    pub fn has_token(&self, h: &HeaderMap) -> bool {
        self.token_of(h).is_ok()
    }

    /// A mutation: same origin, then the token.
    pub fn mutation(&self, h: &HeaderMap) -> Result<(), Refusal> {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let origin = h.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let site = h.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        let forbidden = |why: String| Err(Refusal(StatusCode::FORBIDDEN, why));
        if let Some(o) = origin {
            if o != format!("http://{host}") {
                return forbidden(format!(
                    "requests from {o} may not change anything here; use the dashboard's own page"
                ));
            }
        }
        if let Some(s) = site {
            if s != "same-origin" {
                return forbidden(format!(
                    "a {s} request may not change anything here; use the dashboard's own page"
                ));
            }
        }
        let via = self.token_of(h)?;
        if origin.is_none() && site.is_none() && via == Via::Cookie {
            return forbidden(
                "the request does not say where it comes from (no Origin header); use the \
                 dashboard's page, or send the token as Authorization: Bearer"
                    .into(),
            );
        }
        Ok(())
    }

    fn token_of(&self, h: &HeaderMap) -> Result<Via, Refusal> {
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = h
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)
            .map(|(_, v)| v);
        let (given, via) = match (bearer, cookie) {
            (Some(t), _) => (t, Via::Header),
            (None, Some(t)) => (t, Via::Cookie),
            (None, None) => {
                return Err(Refusal(
                    StatusCode::UNAUTHORIZED,
                    "this needs the dashboard's token: open the login link that `pelican \
                     dashboard` printed at start"
                        .into(),
                ))
            }
        };
        if same(given, &self.token) {
            Ok(via)
        } else {
            Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "wrong token: open the login link that `pelican dashboard` printed at start".into(),
            ))
        }
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, _)) => return inside == "::1",
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(n, _)| n)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const T: &str = "0123456789abcdef0123";

    fn policy() -> Policy {
        Policy {
            token: T.into(),
            loopback: true,
        }
    }

    #[test]
    fn tokens_are_checked() {
        assert!(check_token(T).is_ok());
        assert!(check_token("short").is_err());
        assert!(check_token("0123456789abcdef&x=1").is_err());
        let t = random_token().unwrap();
        assert_eq!(t.len(), 32);
        assert!(check_token(&t).is_ok());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    #[test]
    fn only_loopback_host_names_are_served_on_loopback() {
        let p = policy();
        for ok in [
            "127.0.0.1:8080",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8080",
            "127.9.9.9",
        ] {
            assert!(p.admit(&headers(&[("host", ok)])).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "10.0.0.1:80",
            "[::2]:1",
            "",
            "localhost.evil:1",
        ] {
            let e = p.admit(&headers(&[("host", bad)])).unwrap_err();
            assert_eq!(e.0, StatusCode::FORBIDDEN, "{bad}");
        }
        let open = Policy {
            loopback: false,
            ..policy()
        };
        let e = open
            .admit(&headers(&[("host", "dash.example")]))
            .unwrap_err();
        assert_eq!(e.0, StatusCode::UNAUTHORIZED);
        let cookie = format!("a=b; {COOKIE}={T}");
        assert!(open
            .admit(&headers(&[("host", "dash.example"), ("cookie", &cookie)]))
            .is_ok());
    }

    #[test]
    fn mutations_need_the_token_and_the_own_origin() {
        let p = policy();
        let cookie = format!("{COOKIE}={T}");
        let bearer = format!("Bearer {T}");
        let host = ("host", "127.0.0.1:8080");
        let own = ("origin", "http://127.0.0.1:8080");
        let status = |h: &[(&'static str, &str)]| p.mutation(&headers(h)).err().map(|r| r.0);
        assert_eq!(status(&[host, own, ("cookie", &cookie)]), None);
        assert_eq!(
            status(&[host, ("sec-fetch-site", "same-origin"), ("cookie", &cookie)]),
            None
        );
        assert_eq!(status(&[host, ("authorization", &bearer)]), None);
        assert_eq!(status(&[host, own]), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(
            status(&[host, own, ("cookie", &format!("{COOKIE}=nope"))]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(&[host, ("origin", "http://evil.example"), ("cookie", &cookie)]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(&[host, ("sec-fetch-site", "cross-site"), ("cookie", &cookie)]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(&[host, ("cookie", &cookie)]),
            Some(StatusCode::FORBIDDEN)
        );
    }
}
