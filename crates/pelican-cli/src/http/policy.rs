//! Who may do what, for every HTTP surface of the command (the dashboard, the gateway).
//!
//! - **Loopback by default.** On a loopback address every request must carry exactly one
//!   `Host` header naming a loopback host (`localhost`, `127.x.y.z`, `[::1]`, with an
//!   optional port of digits), and so must an absolute request target: a page of another
//!   site that rebinds its DNS name to 127.0.0.1 gets 403. A non-loopback address is
//!   refused at start without a token (the commands check it).
//! - **The token** travels in `Authorization: Bearer T`, compared in constant time. A
//!   surface with sessions (the dashboard) also takes a session cookie, set by its login
//!   link: a random 128-bit id that stands for the token, never the token itself, with
//!   `Max-Age`, HttpOnly, SameSite=Strict, kept in memory (gone on restart).
//! - Missing credentials: 401. A wrong token: 403. An unknown or expired session: 401
//!   (log in again).

use super::error::{ApiError, Kind};
use super::parse;
use axum::http::{header, HeaderMap, Uri};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest token accepted from `--token`.
pub const MIN_TOKEN_LEN: usize = 16;
/// How long a session lasts (the cookie's `Max-Age`): a working day.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept; a login past it ends the oldest one.
const MAX_SESSIONS: usize = 1024;

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
            "--token contains {c:?}; use letters, digits and - . _ ~ (it goes into links and headers)"
        ));
    }
    Ok(())
}

/// 128 random bits from the OS, in hex (tokens and session ids).
pub fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(std::io::Error::from)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Compares without stopping at the first difference (no timing hint about a secret).
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// How a request proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// No token is set: nothing to prove.
    Open,
    /// A session cookie (a browser that used the login link).
    Session,
    /// `Authorization: Bearer` (a script).
    Bearer,
}

/// The sessions of one running process.
#[derive(Debug)]
struct Sessions {
    cookie: &'static str,
    live: Mutex<Vec<(String, Instant)>>,
}

impl Sessions {
    fn start(&self) -> std::io::Result<String> {
        let id = random_hex()?;
        let mut live = self.live.lock().expect("sessions lock");
        let now = Instant::now();
        live.retain(|(_, until)| *until > now);
        if live.len() >= MAX_SESSIONS {
            live.remove(0);
        }
        live.push((id.clone(), now + SESSION_TTL));
        Ok(id)
    }

    /// Whether `id` is a live session; every live one is compared in constant time.
    fn live(&self, id: &str) -> bool {
        let now = Instant::now();
        let live = self.live.lock().expect("sessions lock");
        live.iter().fold(false, |found, (s, until)| {
            found | (same(s, id) & (*until > now))
        })
    }
}

/// The policy of one running surface.
#[derive(Debug)]
pub struct Policy {
    token: Option<String>,
    loopback: bool,
    /// Every request needs credentials (else only those that ask: mutations).
    everything: bool,
    sessions: Option<Sessions>,
}

impl Policy {
    /// A policy with this token (none: nothing needs one) on a loopback address or not.
    /// Off loopback every request needs the token; on loopback, see
    /// [`Policy::token_for_everything`].
    pub fn new(token: Option<String>, loopback: bool) -> Policy {
        Policy {
            everything: !loopback && token.is_some(),
            token,
            loopback,
            sessions: None,
        }
    }

    /// Every request needs the token, on loopback too (when one is set).
    #[must_use]
    pub fn token_for_everything(mut self) -> Policy {
        self.everything = self.token.is_some();
        self
    }

    /// Takes session cookies named `cookie`, set by [`Policy::login`].
    #[must_use]
    pub fn with_sessions(mut self, cookie: &'static str) -> Policy {
        self.sessions = Some(Sessions {
            cookie,
            live: Mutex::new(Vec::new()),
        });
        self
    }

    /// Every request: the Host check on loopback, then the credentials if every request
    /// needs them.
    pub fn admit(&self, h: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
        if self.loopback {
            check_loopback_host(h, uri)?;
        }
        if self.everything {
            self.credentials(h)?;
        }
        Ok(())
    }

    /// Whether the request carries valid credentials (no token set: yes).
    pub fn has_credentials(&self, h: &HeaderMap) -> bool {
        self.credentials(h).is_ok()
    }

    /// The request's credentials: `Authorization: Bearer` with the token, or a live
    /// session cookie.
    pub fn credentials(&self, h: &HeaderMap) -> Result<Via, ApiError> {
        let Some(token) = &self.token else {
            return Ok(Via::Open);
        };
        let bearer = h.get(header::AUTHORIZATION).map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
        });
        match bearer {
            Some(Some(given)) if same(given, token) => return Ok(Via::Bearer),
            Some(_) => {
                return Err(ApiError::new(
                    Kind::Forbidden,
                    "wrong token: the Authorization header must be `Bearer <token>` with the \
                     token this server was started with",
                ))
            }
            None => {}
        }
        if let Some(s) = &self.sessions {
            if let Some(id) = cookie(h, s.cookie) {
                return if s.live(id) {
                    Ok(Via::Session)
                } else {
                    Err(ApiError::new(
                        Kind::Unauthorized,
                        "this session has ended (it expired, or the server restarted): open \
                         the login link again",
                    ))
                };
            }
        }
        Err(ApiError::new(
            Kind::Unauthorized,
            if self.sessions.is_some() {
                "this needs the token: open the login link that was printed at start, or \
                 send Authorization: Bearer <token>"
            } else {
                "this needs the token: send Authorization: Bearer <token>"
            },
        ))
    }

    /// The login link's check: with the right token, a new session and the
    /// `Set-Cookie` value that carries it; `None` for a wrong token.
    pub fn login(&self, given: &str) -> Option<Result<String, ApiError>> {
        let (token, sessions) = (self.token.as_ref()?, self.sessions.as_ref()?);
        if !same(given, token) {
            return None;
        }
        Some(
            sessions
                .start()
                .map(|id| {
                    format!(
                        "{}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
                        sessions.cookie,
                        SESSION_TTL.as_secs()
                    )
                })
                .map_err(|e| ApiError::new(Kind::Internal, format!("cannot start a session: {e}"))),
        )
    }

    /// A request that changes something, from a browser page: the page's own origin,
    /// then the credentials. A request with neither `Origin` nor `Sec-Fetch-Site` is
    /// taken only with the Bearer token (no browser sends a cookie-only POST without
    /// them).
    pub fn mutation(&self, h: &HeaderMap) -> Result<(), ApiError> {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let origin = h.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let site = h.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        let forbidden = |why: String| Err(ApiError::new(Kind::Forbidden, why));
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
        let via = self.credentials(h)?;
        if origin.is_none() && site.is_none() && via == Via::Session {
            return forbidden(
                "the request does not say where it comes from (no Origin header); use the \
                 dashboard's page, or send the token as Authorization: Bearer"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Exactly one `Host` header, naming a loopback host; an absolute request target must
/// name one too.
fn check_loopback_host(h: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let refuse = |what: String| {
        Err(ApiError::new(
            Kind::Forbidden,
            format!("this server answers only to a loopback host name (localhost, 127.0.0.1, [::1]): {what}"),
        ))
    };
    let mut hosts = h.get_all(header::HOST).iter();
    let (Some(v), None) = (hosts.next(), hosts.next()) else {
        return refuse("the request must carry exactly one Host header".into());
    };
    let Ok(v) = v.to_str() else {
        return refuse("the Host header is not text".into());
    };
    match parse::host(v) {
        Ok(host) if host.is_loopback() => {}
        Ok(_) => return refuse(format!("not {v:?}")),
        Err(why) => return refuse(why),
    }
    if let Some(authority) = uri.authority() {
        match parse::host(authority.as_str()) {
            Ok(host) if host.is_loopback() => {}
            _ => return refuse(format!("not {:?} in the request line", authority.as_str())),
        }
    }
    Ok(())
}

/// The value of cookie `name`, if the request carries it.
fn cookie<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const T: &str = "0123456789abcdef0123";
    const COOKIE: &str = "pelican_test";

    fn policy() -> Policy {
        Policy::new(Some(T.into()), true).with_sessions(COOKIE)
    }

    fn status(r: Result<impl Sized, ApiError>) -> Option<StatusCode> {
        r.err().map(|e| e.kind.status())
    }

    #[test]
    fn tokens_are_checked() {
        assert!(check_token(T).is_ok());
        assert!(check_token("short").is_err());
        assert!(check_token("0123456789abcdef&x=1").is_err());
        let t = random_hex().unwrap();
        assert_eq!(t.len(), 32);
        assert!(check_token(&t).is_ok());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    #[test]
    fn only_one_loopback_host_is_served_on_loopback() {
        let p = policy();
        let uri = Uri::from_static("/api/queues");
        for ok in [
            "127.0.0.1:8080",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8080",
            "127.9.9.9",
        ] {
            assert!(p.admit(&headers(&[("host", ok)]), &uri).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "10.0.0.1:80",
            "[::2]:1",
            "",
            "localhost.evil:1",
            "127.0.0.1:8095@evil.example",
            "127.0.0.1:80x",
        ] {
            let e = p.admit(&headers(&[("host", bad)]), &uri);
            assert_eq!(status(e), Some(StatusCode::FORBIDDEN), "{bad}");
        }
        let two = headers(&[("host", "127.0.0.1:8080"), ("host", "evil.example")]);
        assert_eq!(status(p.admit(&two, &uri)), Some(StatusCode::FORBIDDEN));
        assert_eq!(
            status(p.admit(&HeaderMap::new(), &uri)),
            Some(StatusCode::FORBIDDEN)
        );
        let absolute = Uri::from_static("http://evil.example/api/queues");
        let e = p.admit(&headers(&[("host", "127.0.0.1:8080")]), &absolute);
        assert_eq!(status(e), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn off_loopback_every_request_needs_the_token() {
        let open = Policy::new(Some(T.into()), false).with_sessions(COOKIE);
        let uri = Uri::from_static("/");
        let e = open.admit(&headers(&[("host", "dash.example")]), &uri);
        assert_eq!(status(e), Some(StatusCode::UNAUTHORIZED));
        let bearer = format!("Bearer {T}");
        assert!(open
            .admit(
                &headers(&[("host", "dash.example"), ("authorization", &bearer)]),
                &uri
            )
            .is_ok());
        let wrong = open.admit(
            &headers(&[("host", "dash.example"), ("authorization", "Bearer nope")]),
            &uri,
        );
        assert_eq!(status(wrong), Some(StatusCode::FORBIDDEN));
        // The token itself is no cookie: only a session id is.
        let as_cookie = format!("{COOKIE}={T}");
        let e = open.admit(
            &headers(&[("host", "dash.example"), ("cookie", &as_cookie)]),
            &uri,
        );
        assert_eq!(status(e), Some(StatusCode::UNAUTHORIZED));
    }

    #[test]
    fn a_login_starts_a_session_that_stands_for_the_token() {
        let p = policy();
        assert!(p.login("wrong-wrong-wrong-wrong").is_none());
        let set = p.login(T).unwrap().unwrap();
        assert!(!set.contains(T), "{set}");
        for part in ["Path=/", "Max-Age=43200", "HttpOnly", "SameSite=Strict"] {
            assert!(set.contains(part), "{set}");
        }
        let pair = set.split(';').next().unwrap();
        assert_eq!(
            p.credentials(&headers(&[("cookie", pair)])).unwrap(),
            Via::Session
        );
        // Another process (a restart) knows no session.
        assert_eq!(
            status(policy().credentials(&headers(&[("cookie", pair)]))),
            Some(StatusCode::UNAUTHORIZED)
        );
    }

    #[test]
    fn mutations_need_the_token_and_the_own_origin() {
        let p = policy();
        let set = p.login(T).unwrap().unwrap();
        let session = set.split(';').next().unwrap().to_string();
        let bearer = format!("Bearer {T}");
        let host = ("host", "127.0.0.1:8080");
        let own = ("origin", "http://127.0.0.1:8080");
        let check = |h: &[(&'static str, &str)]| status(p.mutation(&headers(h)));
        assert_eq!(check(&[host, own, ("cookie", &session)]), None);
        assert_eq!(
            check(&[
                host,
                ("sec-fetch-site", "same-origin"),
                ("cookie", &session)
            ]),
            None
        );
        assert_eq!(check(&[host, ("authorization", &bearer)]), None);
        assert_eq!(check(&[host, own]), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(
            check(&[host, own, ("cookie", &format!("{COOKIE}=nope"))]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            check(&[
                host,
                ("origin", "http://evil.example"),
                ("cookie", &session)
            ]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[host, ("sec-fetch-site", "cross-site"), ("cookie", &session)]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[host, ("cookie", &session)]),
            Some(StatusCode::FORBIDDEN)
        );
    }

    #[test]
    fn without_a_token_everything_is_open() {
        let p = Policy::new(None, true).token_for_everything();
        let uri = Uri::from_static("/v1/queues/q/call");
        assert!(p.admit(&headers(&[("host", "127.0.0.1:1")]), &uri).is_ok());
        assert_eq!(p.credentials(&HeaderMap::new()).unwrap(), Via::Open);
    }
}
