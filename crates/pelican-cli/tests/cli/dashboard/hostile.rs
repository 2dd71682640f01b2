//! What a newcomer and a hostile client on the same machine found (issue 43): the
//! login cookie, strict parsing of ids and of the Host header, errors that are all JSON,
//! and Redis outages told apart from refusals.

use super::http::{get, request, Answer};
use super::{bury, xlen, Dashboard, DEADLINE};
use crate::support::Env;
use pelican_testkit::{eventually_sync, unique_name, RedisServer};
use std::time::{Duration, Instant};

fn keys(env: &Env) -> pelican::admin::Keys {
    pelican::QueueConfig::new(env.server.url(), env.queue.clone()).keys()
}

/// The error body's kind and message, checking its shape.
fn error_of(a: &Answer) -> (String, String) {
    assert_eq!(
        a.header("content-type"),
        Some("application/json"),
        "an error is JSON: {a:?}"
    );
    let e = &a.json()["error"];
    let kind = e["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("no kind: {a:?}"));
    let message = e["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {a:?}"));
    assert!(!message.is_empty(), "{a:?}");
    (kind.to_string(), message.to_string())
}

/// The login link sets a cookie that carries a random session id, never the token, with
/// `Max-Age`; the token itself is no cookie; a session ends with its process.
#[test]
fn the_login_cookie_is_a_session_not_the_token() {
    let env = Env::new("dash-session");
    let q = keys(&env);
    let id = bury(&env, &q, "poison-s", "{}");
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    let token = d.token.clone().unwrap();
    let login = get(&d.addr, &format!("/login?token={token}"));
    assert_eq!(login.status, 303, "{login:?}");
    let set = login.header("set-cookie").unwrap().to_string();
    assert!(!set.contains(&token), "the cookie carries the token: {set}");
    for part in ["Max-Age=", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(part), "{part}: {set}");
    }
    let session = set.split(';').next().unwrap().to_string();
    let sid = session.strip_prefix("pelican_dashboard=").unwrap();
    assert_eq!(sid.len(), 32, "128 random bits: {sid}");
    assert_ne!(
        get(&d.addr, &format!("/login?token={token}")).header("set-cookie"),
        Some(set.as_str()),
        "every login is a session of its own"
    );

    let own = format!("http://{}", d.addr);
    let path = format!("/api/queues/{}/dead/{id}/requeue", env.queue);
    // The token as a cookie is not a session.
    let as_cookie = format!("pelican_dashboard={token}");
    let a = request(
        &d.addr,
        "POST",
        &path,
        &[("Origin", &own), ("Cookie", &as_cookie)],
    );
    assert_eq!(a.status, 401, "{a:?}");
    assert_eq!(error_of(&a).0, "unauthorized");
    let info = request(&d.addr, "GET", "/api/info", &[("Cookie", &session)]).json();
    assert_eq!(info["can_mutate"], true);
    let a = request(
        &d.addr,
        "POST",
        &path,
        &[("Origin", &own), ("Cookie", &session)],
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(xlen(&env, q.dead()), 0);

    // Another dashboard process (a restart) knows no session, but the token still works.
    let again = Dashboard::start(&env, &["--token", &token]);
    let info = request(&again.addr, "GET", "/api/info", &[("Cookie", &session)]).json();
    assert_eq!(info["can_mutate"], false);
    let purge = format!("/api/queues/{}/dead/purge", env.queue);
    let own2 = format!("http://{}", again.addr);
    let a = request(
        &again.addr,
        "POST",
        &purge,
        &[("Origin", &own2), ("Cookie", &session)],
    );
    assert_eq!(a.status, 401, "{a:?}");
    assert!(error_of(&a).1.contains("log"), "{a:?}");
    let bearer = format!("Bearer {token}");
    let a = request(&again.addr, "POST", &purge, &[("Authorization", &bearer)]);
    assert_eq!(a.status, 200, "{a:?}");
    let a = request(
        &again.addr,
        "POST",
        &purge,
        &[("Authorization", "Bearer wrong-wrong-wrong-1")],
    );
    assert_eq!(
        (a.status, error_of(&a).0.as_str()),
        (403, "forbidden"),
        "{a:?}"
    );
}

/// A dead-letter id is read whole: parts that overflow 64 bits are bad input (400), not
/// "cannot reach Redis", and no message names pelican's scripts.
#[test]
fn dead_letter_ids_are_parsed_whole() {
    let env = Env::new("dash-ids");
    let q = keys(&env);
    bury(&env, &q, "poison-i", "{}");
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    let bearer = format!("Bearer {}", d.token.clone().unwrap());
    for id in [
        "18446744073709551616-0",
        "1-18446744073709551616",
        "1-2-3",
        "-1",
        "1-",
    ] {
        let a = request(
            &d.addr,
            "POST",
            &format!("/api/queues/{}/dead/{id}/requeue", env.queue),
            &[("Authorization", &bearer)],
        );
        assert_eq!(a.status, 400, "{id}: {a:?}");
        let (kind, message) = error_of(&a);
        assert_eq!(kind, "bad_request");
        assert!(message.contains("not a dead-letter id"), "{message}");
        assert!(!message.contains("pelican_"), "{message}");
    }
    assert_eq!(xlen(&env, q.dead()), 1, "nothing changed");
}

/// Every error is `{"error": {"kind", "message"}}`: a wrong method (405), a path that is
/// not UTF-8 (400), no such route (404), refusals (401, 403), bad names (400).
#[test]
fn every_error_is_json_of_one_shape() {
    let env = Env::new("dash-json");
    let q = keys(&env);
    bury(&env, &q, "poison-j", "{}");
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    let cases: Vec<(Answer, u16, &str)> = vec![
        (
            request(&d.addr, "POST", "/api/queues", &[]),
            405,
            "method_not_allowed",
        ),
        (
            request(
                &d.addr,
                "DELETE",
                &format!("/api/queues/{}/dead", env.queue),
                &[],
            ),
            405,
            "method_not_allowed",
        ),
        (get(&d.addr, "/api/queues/%FF%FE/dead"), 400, "bad_request"),
        (
            get(&d.addr, "/api/queues/bad%7Bname/dead"),
            400,
            "bad_request",
        ),
        (get(&d.addr, "/api/nothing"), 404, "not_found"),
        (get(&d.addr, "/api/queues/nope"), 404, "not_found"),
        (
            request(
                &d.addr,
                "POST",
                &format!("/api/queues/{}/dead/purge", env.queue),
                &[],
            ),
            401,
            "unauthorized",
        ),
        (
            request(&d.addr, "GET", "/api/queues", &[("Host", "evil.example")]),
            403,
            "forbidden",
        ),
    ];
    for (a, status, kind) in cases {
        assert_eq!(a.status, status, "{a:?}");
        assert_eq!(error_of(&a).0, kind, "{a:?}");
    }
    let a = request(&d.addr, "POST", "/api/queues", &[]);
    assert!(
        a.header("allow").is_some_and(|v| v.contains("GET")),
        "{a:?}"
    );
    assert!(error_of(&a).1.contains("POST is not served"), "{a:?}");
}

/// The Host header is read whole: what follows the colon must be a port, and a request
/// with two Host headers is refused.
#[test]
fn the_host_header_is_parsed_strictly() {
    let env = Env::new("dash-host");
    let d = Dashboard::start(&env, &[]);
    let port = d.addr.rsplit_once(':').unwrap().1.to_string();
    for host in [
        format!("127.0.0.1:{port}@evil.example"),
        format!("127.0.0.1:{port}x"),
        "127.0.0.1:".to_string(),
        format!("localhost:{port}.evil.example"),
    ] {
        let a = request(&d.addr, "GET", "/api/queues", &[("Host", &host)]);
        assert_eq!(a.status, 403, "{host}: {a:?}");
        assert_eq!(error_of(&a).0, "forbidden");
    }
    let two = request(
        &d.addr,
        "GET",
        "/api/queues",
        &[("Host", &d.addr), ("Host", "evil.example")],
    );
    assert!(two.status == 400 || two.status == 403, "{two:?}");
    assert_eq!(get(&d.addr, "/api/queues").status, 200);
    let a = request(
        &d.addr,
        "GET",
        "/api/queues",
        &[("Host", &format!("localhost:{port}"))],
    );
    assert_eq!(a.status, 200, "{a:?}");
}

/// While Redis is down a queue the dashboard has not seen gets a prompt 503 (it took 7.5 s
/// before); once Redis is back, a queue's first dead-letter request is served, not
/// refused with a stale 503 from a connection made before the outage.
#[test]
fn redis_outages_are_prompt_503s_and_leave_nothing_stale() {
    let mut env = Env {
        server: RedisServer::builder().appendonly(true).start(),
        queue: unique_name("dash-outage"),
    };
    let q = keys(&env);
    bury(&env, &q, "poison-o", "{}");
    let other = unique_name("dash-outage-b");
    bury(
        &env,
        &pelican::QueueConfig::new(env.server.url(), other.clone()).keys(),
        "poison-b",
        "{}",
    );
    let d = Dashboard::start(&env, &[]);
    d.wait_for_queue(&env.queue);
    d.wait_for_queue(&other);
    let dead = format!("/api/queues/{}/dead", env.queue);
    let other_dead = format!("/api/queues/{other}/dead");
    assert_eq!(get(&d.addr, &dead).status, 200);
    assert_eq!(get(&d.addr, &other_dead).status, 200);
    env.server.kill();
    eventually_sync(DEADLINE, "the overview to report Redis down", || {
        get(&d.addr, "/api/queues").json()["error"].is_string()
    });
    for path in ["/api/queues/never-seen", "/api/queues/never-seen/dead"] {
        let t = Instant::now();
        let a = get(&d.addr, path);
        let took = t.elapsed();
        assert_eq!(a.status, 503, "{path}: {a:?}");
        assert_eq!(error_of(&a).0, "unavailable", "{a:?}");
        assert!(took < Duration::from_millis(1500), "{path} took {took:?}");
    }
    let a = get(&d.addr, &other_dead);
    assert_eq!(
        (a.status, error_of(&a).0.as_str()),
        (503, "unavailable"),
        "{a:?}"
    );
    env.server.restart();
    eventually_sync(DEADLINE, "the overview to read Redis again", || {
        get(&d.addr, "/api/queues").json()["error"].is_null()
    });
    for path in [&dead, &other_dead] {
        let a = get(&d.addr, path);
        assert_eq!(a.status, 200, "the first request after the outage: {a:?}");
        assert_eq!(a.json()["total"], 1);
    }
}

/// A dead letter's reason says "delivered once", not "delivered 1 times".
#[test]
fn a_reason_counts_deliveries_in_words() {
    let env = Env::new("dash-once");
    let crashing = || {
        env.spawn(&[
            "worker",
            "--handler",
            "crash-if:poison",
            "--claim-idle",
            "300",
            "--max-deliveries",
            "1",
        ])
    };
    let call = env.spawn(&["call", "--timeout", "30000", r#"{"poison": true}"#]);
    let first = crashing().wait(DEADLINE);
    assert_ne!(first.code, 0, "crash-if ends the worker: {first:?}");
    let last = crashing();
    let call = call.wait(DEADLINE);
    assert_eq!(call.code, 4, "{call:?}");
    let d = Dashboard::start(&env, &["--read-only"]);
    d.wait_for_queue(&env.queue);
    let dead = get(&d.addr, &format!("/api/queues/{}/dead", env.queue)).json();
    let reason = dead["letters"][0]["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("delivered once without an outcome"),
        "{reason}"
    );
    assert!(!reason.contains("1 times"), "{reason}");
    drop(last);
}
