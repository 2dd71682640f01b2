//! What a caller may retry (`Error::is_retryable`): a command Redis refuses for good
//! is not retryable, Redis being gone is.

use crate::common::*;
use pelican::{ErrorKind, Producer};
use pelican_testkit::RedisServer;

/// A least-privilege user (as in README.md's "Running with least privilege") that
/// lacks FCALL, which every submission runs.
const NO_FCALL: &[&str] = &[
    "resetkeys",
    "~pelican:*",
    "resetchannels",
    "-@all",
    "+ping",
    "+function|load",
    "+get",
    "+set",
    "+getdel",
    "+append",
    "+del",
    "+exists",
    "+mget",
    "+rename",
    "+strlen",
    "+getrange",
    "+pexpire",
    "+scan",
    "+xadd",
    "+xack",
    "+xdel",
    "+xclaim",
    "+xpending",
    "+xrange",
    "+xlen",
    "+xtrim",
    "+xinfo",
    "+xgroup",
    "+xread",
    "+xreadgroup",
];

/// The error `p` gets submitting `req`, which Redis must refuse: a Redis error, retryable
/// as `retryable` says.
async fn refused(p: &Producer<Req, Resp>, req: &Req, retryable: bool) -> pelican::Error {
    let e = match p.submit(req).await {
        Ok(_) => panic!("a submission Redis must refuse was accepted: {req:?}"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Redis, "{e:#}");
    assert_eq!(e.is_retryable(), retryable, "{e:#}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_denial_is_not_retryable() {
    let server = RedisServer::start();
    let mut setuser = vec!["ACL", "SETUSER", "limited", "on", ">s3cret"];
    setuser.extend(NO_FCALL);
    assert_eq!(server.cli(&setuser).trim(), "OK");
    let mut q = queue(&server, "acl");
    q.url = format!("redis://limited:s3cret@127.0.0.1:{}", server.port());
    let p = Producer::<Req, Resp>::connect(q, fast_producer())
        .await
        .unwrap();
    let e = refused(&p, &Req::new(1, "denied"), false).await;
    let said = format!("{e:#}");
    assert_eq!(said.matches("no permissions").count(), 1, "{said}");
    p.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gone_is_retryable() {
    let mut server = RedisServer::start();
    let p = Producer::<Req, Resp>::connect(queue(&server, "gone"), fast_producer())
        .await
        .unwrap();
    server.kill();
    refused(&p, &Req::new(1, "nowhere"), true).await;
}

/// A server without functions (as Redis before 7.0; here a 7.0 whose `FCALL` is renamed
/// away) refuses every script call: the submission fails with an error that says what
/// pelican needs, not retryable, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_functions_is_named_too_old() {
    let server = RedisServer::builder()
        .arg("--rename-command")
        .arg("FCALL")
        .arg("")
        .start();
    let p = Producer::<Req, Resp>::connect(queue(&server, "old"), fast_producer())
        .await
        .unwrap();
    let e = refused(&p, &Req::new(1, "too old"), false).await;
    let said = format!("{e:#}");
    assert_eq!(
        said.matches("needs Redis 7.0 or newer").count(),
        1,
        "{said}"
    );
    p.shutdown().await.unwrap();
}
