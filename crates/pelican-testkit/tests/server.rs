//! Tests for `RedisServer`: start-up, kill/restart with an append-only file, cleanup;
//! and `free_port`, which shares its ports with the servers.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use pelican_testkit::{free_port, RedisServer};

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn starts_and_answers_ping() {
    let server = RedisServer::start();
    let port = server.port();
    assert!((20000..=55000).contains(&port), "port {port}");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    assert!(process_exists(server.pid()));
    assert!(server.dir().is_dir());
    assert!(server.log_path().is_file());

    let mut con = server.sync_connection();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(server.cli(&["PING"]), "PONG");

    // Defaults: no RDB snapshots, no AOF, loopback only.
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]), "save");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
    assert_eq!(server.cli(&["CONFIG", "GET", "bind"]), "bind\n127.0.0.1");
    // Error replies come back as text, not panics.
    assert!(server
        .cli(&["NOSUCHCOMMAND"])
        .starts_with("ERR unknown command"));
}

#[test]
fn kill_and_restart_with_appendonly_keeps_acknowledged_writes() {
    let mut server = RedisServer::builder().appendonly(true).start();
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendfsync"]),
        "appendfsync\nalways"
    );
    assert_eq!(server.cli(&["SET", "k-cli", "v1"]), "OK");
    {
        let mut con = server.sync_connection();
        let () = redis::cmd("SET")
            .arg("k-conn")
            .arg("v2")
            .query(&mut con)
            .unwrap();
    }
    let (port, old_pid) = (server.port(), server.pid());

    server.kill();
    server.kill(); // idempotent
    assert!(!server.is_running());
    assert!(
        !process_exists(old_pid),
        "redis-server {old_pid} survived kill()"
    );
    assert!(server
        .client()
        .get_connection_with_timeout(Duration::from_millis(500))
        .is_err());

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.cli(&["GET", "k-cli"]), "v1");
    let mut con = server.sync_connection();
    let v: String = redis::cmd("GET").arg("k-conn").query(&mut con).unwrap();
    assert_eq!(v, "v2");
}

#[test]
fn restart_without_appendonly_loses_data_but_keeps_port() {
    let mut server = RedisServer::start();
    assert_eq!(server.cli(&["SET", "k", "v"]), "OK");
    let port = server.port();
    server.restart(); // restart also works without an explicit kill
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["EXISTS", "k"]), "0");
}

#[test]
fn builder_extra_args_and_fixed_port() {
    let port = free_port();
    let server = RedisServer::builder()
        .arg("--maxmemory")
        .arg("10mb")
        .port(port)
        .start();
    assert_eq!(server.port(), port);
    assert_eq!(
        server.cli(&["CONFIG", "GET", "maxmemory"]),
        "maxmemory\n10485760"
    );
}

#[test]
fn drop_kills_the_process_and_removes_the_dir_even_on_panic() {
    let seen: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = RedisServer::start();
        *seen.lock().unwrap() = Some((server.pid(), server.dir().to_path_buf()));
        panic!("intentional panic while a RedisServer is alive");
    }));
    assert!(result.is_err());
    let (pid, dir) = seen.lock().unwrap().clone().unwrap();
    assert!(
        !process_exists(pid),
        "redis-server {pid} survived the panic"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn parallel_servers_get_distinct_ports() {
    let servers: Vec<RedisServer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(RedisServer::start)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4);
    for s in &servers {
        assert_eq!(s.cli(&["PING"]), "PONG");
    }
}

#[test]
fn free_ports_are_bindable_and_never_handed_out_twice() {
    let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    for &p in &ports {
        std::net::TcpListener::bind(("127.0.0.1", p))
            .unwrap_or_else(|e| panic!("port {p} from free_port is not bindable: {e}"));
    }
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    for s in &servers {
        assert!(
            !distinct.contains(&s.port()),
            "a server got free_port's {}",
            s.port()
        );
    }
}
