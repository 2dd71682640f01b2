//! `pelican bench --via-gateway`: the same workload through `pelican gateway` (a child of
//! this binary), to measure what HTTP adds to the library. Each lane of the closed loop
//! holds a keep-alive HTTP/1.1 connection of its own (`--inflight` connections), and
//! sends `POST /v1/queues/{queue}/call` with the JSON request, one at a time.
//!
//! The client is a few lines over a TCP stream rather than an HTTP library: it writes the
//! request in one write and reads the answer by its `Content-Length` (the gateway always
//! sends one), so what is measured is the gateway, not the client's machinery. Every
//! answer is checked as the library's are.

use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest answer head read (status line and headers).
const MAX_HEAD: usize = 16 * 1024;

/// Calls through one gateway, on connections kept alive between calls.
pub struct GatewayClient {
    addr: String,
    /// The request up to its length: `POST <path> HTTP/1.1`, Host, Content-Type.
    head: Vec<u8>,
    idle: Mutex<Vec<Conn>>,
}

/// One keep-alive connection and what was read past the last answer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl GatewayClient {
    /// A client of the gateway at `addr` (host:port) calling `queue`.
    pub fn new(addr: &str, queue: &str) -> GatewayClient {
        let head = format!(
            "POST /v1/queues/{queue}/call HTTP/1.1\r\nHost: {addr}\r\n\
             Content-Type: application/json\r\nContent-Length: "
        );
        GatewayClient {
            addr: addr.to_string(),
            head: head.into_bytes(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Opens connections until `n` are idle, before a phase: keep-alive clients are
    /// connected already, and a burst of hundreds of connects in the measured window
    /// measured the kernel's accept queue, not the gateway.
    pub async fn open(&self, n: usize) -> Result<(), String> {
        let have = self.idle.lock().expect("idle lock").len();
        for _ in have..n {
            let c = self.connect().await?;
            self.idle.lock().expect("idle lock").push(c);
        }
        Ok(())
    }

    async fn connect(&self) -> Result<Conn, String> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| format!("connecting to the gateway at {}: {e}", self.addr))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(1024),
        })
    }

    /// Sends `body`; the answer's status and body.
    pub async fn call(&self, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let idle = self.idle.lock().expect("idle lock").pop();
        let mut conn = match idle {
            Some(c) => c,
            None => self.connect().await?,
        };
        let answer = conn.round_trip(&self.head, body).await?;
        self.idle.lock().expect("idle lock").push(conn);
        Ok(answer)
    }
}

impl Conn {
    async fn round_trip(&mut self, head: &[u8], body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let mut req = Vec::with_capacity(head.len() + 16 + body.len());
        req.extend_from_slice(head);
        req.extend_from_slice(body.len().to_string().as_bytes());
        req.extend_from_slice(b"\r\n\r\n");
        req.extend_from_slice(body);
        self.stream
            .write_all(&req)
            .await
            .map_err(|e| format!("sending to the gateway: {e}"))?;
        let end = loop {
            if let Some(at) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            if self.buf.len() > MAX_HEAD {
                return Err("the gateway's answer head is too long".into());
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..end])
            .map_err(|_| "the gateway's answer head is not text".to_string())?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line in {head:?}"))?;
        let len: usize = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .ok_or_else(|| format!("no Content-Length in {head:?}"))?;
        let start = end + 4;
        while self.buf.len() < start + len {
            self.fill().await?;
        }
        let body = self.buf[start..start + len].to_vec();
        self.buf.drain(..start + len);
        Ok((status, body))
    }

    async fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 4096];
        let n = self
            .stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading from the gateway: {e}"))?;
        if n == 0 {
            return Err("the gateway closed the connection".into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}
