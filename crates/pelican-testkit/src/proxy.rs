//! A fault-injecting TCP proxy built on plain std threads.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::sys::lock;

/// Timeout for connecting to the upstream server.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Size of the forwarding buffer (one "chunk").
const CHUNK: usize = 16 * 1024;

/// A TCP proxy between clients and a Redis server for fault injection.
///
/// Runs on plain std threads (one acceptor, two per connection), so it works from
/// any test, sync or async, whatever the runtime. Stops on Drop: the listener is
/// closed and every connection cut.
///
/// Faults:
/// - [`cut_all`](Self::cut_all): close every current connection, both sides.
/// - [`set_blackhole`](Self::set_blackhole): connections stay open but nothing is
///   forwarded; the proxy stops reading, so TCP back-pressure stalls the peers.
///   Bytes already read (at most one chunk per direction) are held, not dropped,
///   and delivered when the blackhole is turned off.
/// - [`set_refuse`](Self::set_refuse): new connections are accepted and closed at once.
/// - [`set_latency`](Self::set_latency): delay every forwarded chunk.
///
/// When the upstream cannot be reached (e.g. the server is killed), new client
/// connections are closed right after accept, and existing ones are closed when the
/// upstream side closes.
pub struct Proxy {
    port: u16,
    upstream_port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Notified whenever the blackhole is turned off or connections are removed.
    changed: Condvar,
    stopping: AtomicBool,
}

#[derive(Default)]
struct State {
    blackhole: bool,
    refuse: bool,
    latency: Duration,
    next_id: u64,
    conns: HashMap<u64, Conn>,
}

/// Handles used only to shut a proxied connection down from outside its threads.
struct Conn {
    client: TcpStream,
    upstream: TcpStream,
}

impl Conn {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

impl Shared {
    /// Removes and shuts down connection `id` (no-op if already gone).
    fn close(&self, id: u64) {
        let mut st = lock(&self.state);
        if let Some(conn) = st.conns.remove(&id) {
            conn.close();
            self.changed.notify_all();
        }
    }

    fn cut_all(&self) {
        let mut st = lock(&self.state);
        for (_, conn) in st.conns.drain() {
            conn.close();
        }
        self.changed.notify_all();
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.shared.state);
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("upstream_port", &self.upstream_port)
            .field("connections", &st.conns.len())
            .field("blackhole", &st.blackhole)
            .field("refuse", &st.refuse)
            .field("latency", &st.latency)
            .finish()
    }
}

impl Proxy {
    /// Starts a proxy on a free 127.0.0.1 port forwarding to `127.0.0.1:upstream_port`.
    /// Each accepted client gets its own upstream connection.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("pelican-testkit: cannot bind the proxy on 127.0.0.1");
        let port = listener
            .local_addr()
            .expect("pelican-testkit: proxy has no local address")
            .port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{port}-accept"))
                .spawn(move || accept_loop(listener, upstream, shared))
                .expect("pelican-testkit: cannot start the proxy thread")
        };
        Proxy {
            port,
            upstream_port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The upstream port it forwards to.
    pub fn upstream_port(&self) -> u16 {
        self.upstream_port
    }

    /// `"redis://127.0.0.1:PORT"` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Closes every current connection (both the client and the upstream side) now;
    /// clients see EOF. New connections are still accepted.
    pub fn cut_all(&self) {
        self.shared.cut_all();
    }

    /// While on, existing and new connections stay open but no bytes are forwarded in
    /// either direction: the proxy stops reading, so TCP back-pressure stalls the
    /// peers. Bytes already read are held and delivered when turned off.
    pub fn set_blackhole(&self, on: bool) {
        lock(&self.shared.state).blackhole = on;
        self.shared.changed.notify_all();
    }

    /// While on, new connections are accepted and closed at once (existing ones are
    /// not affected; combine with [`cut_all`](Self::cut_all) for a full outage).
    pub fn set_refuse(&self, on: bool) {
        lock(&self.shared.state).refuse = on;
    }

    /// Adds this delay before every chunk forwarded, in each direction
    /// (`Duration::ZERO` = none). Applies to chunks read from now on.
    pub fn set_latency(&self, d: Duration) {
        lock(&self.shared.state).latency = d;
    }

    /// The number of currently open proxied connections.
    pub fn connections(&self) -> usize {
        lock(&self.shared.state).conns.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor blocked in accept(); it sees `stopping` and returns,
        // closing the listener.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
            Duration::from_secs(1),
        );
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // Pump threads notice their sockets shutting down and exit by themselves.
        self.shared.cut_all();
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let client = match incoming {
            Ok(s) => s,
            Err(_) => {
                // E.g. EMFILE or ECONNABORTED: do not spin.
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if lock(&shared.state).refuse {
            drop(client);
            continue;
        }
        // On error (upstream unreachable...) the client socket is dropped, i.e. closed.
        let _ = open_connection(client, upstream, &shared);
    }
}

/// Connects upstream, registers the pair and starts one pump thread per direction.
fn open_connection(
    client: TcpStream,
    upstream: SocketAddr,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    let server = TcpStream::connect_timeout(&upstream, UPSTREAM_CONNECT_TIMEOUT)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let conn = Conn {
        client: client.try_clone()?,
        upstream: server.try_clone()?,
    };
    let (client_read, server_read) = (client.try_clone()?, server.try_clone()?);
    let id = {
        let mut st = lock(&shared.state);
        let id = st.next_id;
        st.next_id += 1;
        st.conns.insert(id, conn);
        id
    };
    for (name, from, to) in [("up", client_read, server), ("down", server_read, client)] {
        let shared2 = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name(format!("proxy-conn{id}-{name}"))
            .spawn(move || pump(from, to, id, shared2));
        if let Err(e) = spawned {
            shared.close(id);
            return Err(e);
        }
    }
    Ok(())
}

/// Forwards bytes `from` -> `to` until either side closes or the connection is cut,
/// then closes the whole connection (both directions).
fn pump(mut from: TcpStream, mut to: TcpStream, id: u64, shared: Arc<Shared>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let latency = {
            let mut st = lock(&shared.state);
            while st.blackhole && st.conns.contains_key(&id) {
                st = shared.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if !st.conns.contains_key(&id) {
                break; // cut while we held the chunk
            }
            st.latency
        };
        if !latency.is_zero() {
            // Injected fault, not synchronization.
            thread::sleep(latency);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    shared.close(id);
}
