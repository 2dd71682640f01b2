//! Routes, the embedded page and assets, the login link, and the checks every request
//! goes through (`crate::http::policy`). The page is one HTML file and one script that
//! draws either view (`/` or `/queues/{queue}`) from the JSON API. Every error answer of
//! the API is JSON (`crate::http::fallback` makes the HTTP stack's own ones so too); a
//! page that cannot be shown is a small HTML page.

use super::api;
use super::App;
use crate::http::{fallback, ApiError, Kind};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");
const ICON: &str = include_str!("assets/icon.svg");

/// Everything the dashboard serves.
pub fn router(app: Arc<App>) -> Router {
    let mut api = Router::new()
        .route("/info", get(api::info))
        .route("/queues", get(api::queues))
        .route("/queues/{queue}", get(api::queue))
        .route("/queues/{queue}/dead", get(api::dead))
        .route("/queues/{queue}/requests/{rid}", get(api::request));
    if !app.read_only {
        api = api
            .route("/queues/{queue}/dead/{id}/requeue", post(api::requeue))
            .route("/queues/{queue}/dead/requeue-all", post(api::requeue_all))
            .route("/queues/{queue}/dead/purge", post(api::purge));
    }
    let api = api.fallback(|| async {
        ApiError::new(
            Kind::NotFound,
            "no such API route (see the README's dashboard section)",
        )
    });
    Router::new()
        .route("/", get(index))
        .route("/queues/{queue}", get(queue_page))
        .route("/login", get(login))
        .route(
            "/assets/app.js",
            get(|| asset(APP_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/assets/style.css",
            get(|| asset(STYLE, "text/css; charset=utf-8")),
        )
        .route("/assets/icon.svg", get(|| asset(ICON, "image/svg+xml")))
        .nest("/api", api)
        .fallback(|| async {
            page(
                StatusCode::NOT_FOUND,
                "Not found",
                "There is no such page here.",
            )
        })
        .layer(middleware::from_fn(fallback::json_errors))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Every request: the policy's admission check, then headers that keep the page to
/// itself (no framing, no foreign scripts, no referrer carrying the login token).
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let is_api = req.uri().path().starts_with("/api/");
    let mut res = match app.policy.admit(req.headers(), req.uri()) {
        Ok(()) => next.run(req).await,
        Err(e) if is_api => e.into_response(),
        Err(e) => page(e.kind.status(), "Not allowed", &e.message),
    };
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

/// The queue page, or a page that says why not (bad name 400, unknown 404, Redis 503).
async fn queue_page(State(app): State<Arc<App>>, Path(name): Path<String>) -> Response {
    match app.known(&name).await {
        Ok(()) => Html(INDEX).into_response(),
        Err(e) => {
            let title = match e.kind {
                Kind::BadRequest => "Not a queue name",
                Kind::NotFound => "No such queue",
                _ => "Cannot show this queue",
            };
            page(e.kind.status(), title, &e.message)
        }
    }
}

/// `/login?token=T[&next=/queues/Q]`: starts a session (its id in a cookie, never the
/// token) and goes to the overview, or to the queue named by `next` (so the token leaves
/// the address bar).
async fn login(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let q = q.unwrap_or_default();
    let param = |name: &str| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    let given = param("token");
    // Only a page of this dashboard: `/queues/` and a name's characters, nothing that
    // could lead elsewhere.
    let next = param("next")
        .filter(|n| {
            n.strip_prefix("/queues/").is_some_and(|name| {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-:%".contains(&b))
            })
        })
        .unwrap_or_else(|| "/".to_string());
    match given.as_deref().and_then(|t| app.policy.login(t)) {
        Some(Ok(cookie)) => {
            let mut h = HeaderMap::new();
            h.insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&cookie).expect("hex and fixed text"),
            );
            h.insert(
                header::LOCATION,
                HeaderValue::from_str(&next).expect("checked characters"),
            );
            (StatusCode::SEE_OTHER, h).into_response()
        }
        Some(Err(e)) => page(e.kind.status(), "Cannot log in", &e.message),
        None => page(
            StatusCode::UNAUTHORIZED,
            "Wrong token",
            "This login link does not carry this dashboard's token. Use the link that \
             `pelican dashboard` printed when it started.",
        ),
    }
}

/// A small page of its own for errors: the same look as the dashboard.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} · pelican</title><link rel=\"stylesheet\" href=\"/assets/style.css\">\
         <link rel=\"icon\" href=\"/assets/icon.svg\"></head><body>\
         <header class=\"top\"><a class=\"brand\" href=\"/\">pelican</a></header>\
         <main><section class=\"card notice\"><h1>{t}</h1><p>{m}</p>\
         <p><a href=\"/\">← All queues</a></p></section></main></body></html>",
        t = escape(title),
        m = escape(message)
    );
    (status, Html(html)).into_response()
}

/// HTML-escapes text.
fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_pages_escape_what_they_show() {
        assert_eq!(
            super::escape("<script>\"x\" & 'y'"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;"
        );
    }
}
