//! Tests for the fault-injecting `Proxy`, with raw sockets (exact control over
//! timing) and with the redis crate (sync and async).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use pelican_testkit::{eventually, eventually_sync, Proxy, RedisServer};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one line (`\r\n`-terminated) within `timeout`. `Ok(None)` means EOF.
fn read_line(s: &mut TcpStream, timeout: Duration) -> io::Result<Option<String>> {
    s.set_read_timeout(Some(timeout))?;
    let mut out = Vec::new();
    let mut buf = [0u8; 64];
    while !out.ends_with(b"\r\n") {
        match s.read(&mut buf)? {
            0 => return Ok(None),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
    Ok(Some(String::from_utf8(out).unwrap()))
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// True when the peer closed the connection (EOF or reset) within 2 s.
fn is_closed(s: &mut TcpStream) -> bool {
    match read_line(s, Duration::from_secs(2)) {
        Ok(None) => true,
        Ok(Some(_)) => false,
        Err(e) => !is_timeout(&e),
    }
}

fn raw_ping(s: &mut TcpStream) -> String {
    s.write_all(PING).unwrap();
    read_line(s, Duration::from_secs(5))
        .unwrap()
        .expect("EOF instead of PONG")
}

#[test]
fn forwards_a_ping() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));

    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(proxy.connections(), 1);
    // The server sees the proxy as its client.
    assert!(server.cli(&["CLIENT", "LIST"]).lines().count() >= 2);

    drop(con);
    eventually_sync(Duration::from_secs(5), "proxy connection closed", || {
        proxy.connections() == 0
    });
}

#[test]
fn cut_all_closes_open_connections_and_accepts_new_ones() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());

    let mut raw = connect(proxy.port());
    assert_eq!(raw_ping(&mut raw), "+PONG\r\n");
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(proxy.connections(), 2);

    proxy.cut_all();
    assert_eq!(proxy.connections(), 0);
    assert!(
        is_closed(&mut raw),
        "raw connection still open after cut_all"
    );
    assert!(redis::cmd("PING").query::<String>(&mut con).is_err());

    let mut con2 = client.get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut con2).unwrap();
    assert_eq!(pong, "PONG");
    let mut raw2 = connect(proxy.port());
    assert_eq!(raw_ping(&mut raw2), "+PONG\r\n");
}

#[test]
fn blackhole_stalls_until_turned_off() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut existing = connect(proxy.port());
    assert_eq!(raw_ping(&mut existing), "+PONG\r\n");

    proxy.set_blackhole(true);
    existing.write_all(PING).unwrap();
    let err = read_line(&mut existing, Duration::from_millis(300)).unwrap_err();
    assert!(is_timeout(&err), "{err}");

    // New connections are accepted but stall as well.
    let mut fresh = connect(proxy.port());
    fresh.write_all(PING).unwrap();
    let err = read_line(&mut fresh, Duration::from_millis(300)).unwrap_err();
    assert!(is_timeout(&err), "{err}");
    eventually_sync(Duration::from_secs(5), "both connections open", || {
        proxy.connections() == 2
    });

    proxy.set_blackhole(false);
    // The held requests are delivered and answered.
    assert_eq!(
        read_line(&mut existing, Duration::from_secs(5))
            .unwrap()
            .as_deref(),
        Some("+PONG\r\n")
    );
    assert_eq!(
        read_line(&mut fresh, Duration::from_secs(5))
            .unwrap()
            .as_deref(),
        Some("+PONG\r\n")
    );
    assert_eq!(raw_ping(&mut existing), "+PONG\r\n");
}

#[test]
fn cut_all_during_blackhole_closes_stalled_connections() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut s = connect(proxy.port());
    proxy.set_blackhole(true);
    s.write_all(PING).unwrap();
    eventually_sync(Duration::from_secs(5), "connection registered", || {
        proxy.connections() == 1
    });
    proxy.cut_all();
    assert!(is_closed(&mut s));
    assert_eq!(proxy.connections(), 0);
}

#[test]
fn refuse_closes_new_connections_only() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut existing = connect(proxy.port());
    assert_eq!(raw_ping(&mut existing), "+PONG\r\n");

    proxy.set_refuse(true);
    let mut refused = connect(proxy.port()); // the TCP handshake itself succeeds
    assert!(is_closed(&mut refused), "refused connection was not closed");
    let client = redis::Client::open(proxy.url()).unwrap();
    assert!(client
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_err());
    assert_eq!(proxy.connections(), 1);
    assert_eq!(raw_ping(&mut existing), "+PONG\r\n");

    proxy.set_refuse(false);
    let mut fresh = connect(proxy.port());
    assert_eq!(raw_ping(&mut fresh), "+PONG\r\n");
}

#[test]
fn latency_delays_each_direction() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut s = connect(proxy.port());
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");

    proxy.set_latency(Duration::from_millis(150));
    let start = Instant::now();
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");
    let rtt = start.elapsed();
    assert!(rtt >= Duration::from_millis(300), "round trip took {rtt:?}");

    proxy.set_latency(Duration::ZERO);
    let start = Instant::now();
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");
    assert!(start.elapsed() < Duration::from_millis(150));
}

#[test]
fn upstream_death_closes_connections_and_restart_recovers() {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut s = connect(proxy.port());
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");

    server.kill();
    assert!(is_closed(&mut s));
    eventually_sync(Duration::from_secs(5), "connection dropped", || {
        proxy.connections() == 0
    });
    let mut down = connect(proxy.port());
    assert!(
        is_closed(&mut down),
        "no upstream, yet the connection stayed open"
    );

    server.restart();
    let mut s = connect(proxy.port());
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");
}

#[test]
fn drop_closes_connections_and_the_listener() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let port = proxy.port();
    let mut s = connect(port);
    assert_eq!(raw_ping(&mut s), "+PONG\r\n");
    drop(proxy);
    assert!(is_closed(&mut s));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test]
async fn works_with_an_async_client_on_a_current_thread_runtime() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");

    proxy.set_blackhole(true);
    let stalled = tokio::time::timeout(
        Duration::from_millis(300),
        redis::cmd("PING").query_async::<String>(&mut con),
    )
    .await;
    assert!(stalled.is_err(), "PING answered through a blackhole");
    proxy.set_blackhole(false);

    proxy.cut_all();
    eventually(
        Duration::from_secs(5),
        "a fresh async connection works",
        || {
            let client = client.clone();
            async move {
                match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
}
