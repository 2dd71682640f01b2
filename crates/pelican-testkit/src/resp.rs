//! A tiny blocking RESP2 client used for readiness probes, independent of the
//! `redis` crate so that probing never depends on client-side handshakes.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text when it is a status or a bulk string.
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
}

/// Where a probe connects: `127.0.0.1:port`, or a Unix socket (the way in to a server
/// whose only TCP port speaks TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Addr {
    Tcp(u16),
    Unix(PathBuf),
}

/// The stream under a [`RespConn`].
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// A short-lived connection to `addr` with the given I/O timeout.
pub(crate) struct RespConn {
    reader: BufReader<Stream>,
}

impl RespConn {
    pub(crate) fn connect(addr: &Addr, timeout: Duration) -> io::Result<RespConn> {
        let stream = match addr {
            Addr::Tcp(port) => {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
                let stream = TcpStream::connect_timeout(&addr, timeout)?;
                stream.set_read_timeout(Some(timeout))?;
                stream.set_write_timeout(Some(timeout))?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            Addr::Unix(path) => {
                // A Unix socket connects at once or fails (no handshake over a network).
                let stream = UnixStream::connect(path)?;
                stream.set_read_timeout(Some(timeout))?;
                stream.set_write_timeout(Some(timeout))?;
                Stream::Unix(stream)
            }
        };
        Ok(RespConn {
            reader: BufReader::new(stream),
        })
    }

    pub(crate) fn command(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out)?;
        read_reply(&mut self.reader)
    }
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of a reply",
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| protocol_error("non UTF-8 reply header"))
}

fn parse_len(s: &str) -> io::Result<i64> {
    s.parse()
        .map_err(|_| protocol_error(format!("bad length {s:?}")))
}

fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" => Ok(Reply::Status(rest.to_string())),
        "-" => Ok(Reply::Error(rest.to_string())),
        ":" => Ok(Reply::Int(parse_len(rest)?)),
        "$" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut buf = vec![0u8; len as usize + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(len as usize);
            Ok(Reply::Bulk(Some(buf)))
        }
        "*" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Reply::Array(None));
            }
            let items = (0..len)
                .map(|_| read_reply(r))
                .collect::<io::Result<Vec<_>>>()?;
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(protocol_error(format!("unexpected reply line {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut BufReader::new(bytes))
    }

    #[test]
    fn parses_replies() {
        assert_eq!(parse(b"+PONG\r\n").unwrap(), Reply::Status("PONG".into()));
        assert_eq!(
            parse(b"-LOADING x\r\n").unwrap(),
            Reply::Error("LOADING x".into())
        );
        assert_eq!(parse(b":42\r\n").unwrap(), Reply::Int(42));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nbc".to_vec()))
        );
        assert_eq!(
            parse(b"*2\r\n+a\r\n$1\r\nb\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Status("a".into()),
                Reply::Bulk(Some(b"b".to_vec()))
            ]))
        );
        assert!(parse(b"+PON").is_err());
        assert!(parse(b"").is_err());
    }
}
