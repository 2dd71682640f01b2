//! A lean connection for the tasks that send one command at a time on a connection of
//! their own: a consumer's `XREADGROUP BLOCK`, a producer's `XREAD BLOCK` of its reply
//! stream, a consumer's outcome writes. Plain TCP, replies read with a small RESP2 reader.
//!
//! Why not the client library's connection: these tasks need no multiplexing, and its
//! general reply parser was the largest single cost of a delivery in the worker (a
//! quarter of the worker's instructions per request under callgrind). TLS and
//! Unix-socket URLs keep using the client library (see `OwnConn`).

use redis::{ConnectionAddr, ConnectionInfo, RedisResult, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A plain TCP connection that runs one command at a time.
pub(crate) struct LeanConn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    line: Vec<u8>,
    /// Longest wait for a reply (longer than any BLOCK sent on this connection).
    timeout: Duration,
}

fn io_error(e: std::io::Error) -> redis::RedisError {
    redis::RedisError::from(e)
}

fn protocol_error(what: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected reply from Redis: {what}"),
    ))
}

impl LeanConn {
    /// Connects to a `redis://` address, authenticates and selects the database. `None`
    /// for addresses it does not handle (TLS, Unix sockets).
    pub(crate) async fn open(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Option<RedisResult<LeanConn>> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        Some(Self::open_tcp(host, *port, info, connect_timeout, timeout).await)
    }

    async fn open_tcp(
        host: &str,
        port: u16,
        info: &ConnectionInfo,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> RedisResult<LeanConn> {
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| {
                io_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connecting to Redis timed out",
                ))
            })?
            .map_err(io_error)?;
        stream.set_nodelay(true).map_err(io_error)?;
        let (r, w) = stream.into_split();
        let mut conn = LeanConn {
            r: BufReader::with_capacity(64 * 1024, r),
            w,
            line: Vec::with_capacity(64),
            timeout: connect_timeout,
        };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            conn.query(&auth).await?;
        }
        if settings.db() != 0 {
            conn.query(redis::cmd("SELECT").arg(settings.db())).await?;
        }
        conn.timeout = timeout;
        Ok(conn)
    }

    /// Sends `cmd` and reads its reply. A server error reply comes back as `Err` with its
    /// code (`NOGROUP`, `NOSCRIPT`, ...) and leaves the connection usable; after any other
    /// error it must be dropped.
    pub(crate) async fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let packed = cmd.get_packed_command();
        let timeout = self.timeout;
        let io = async {
            self.w.write_all(&packed).await.map_err(io_error)?;
            self.read_value().await
        };
        match tokio::time::timeout(timeout, io).await {
            Ok(r) => r,
            Err(_) => Err(io_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no reply from Redis in time",
            ))),
        }
    }

    /// Reads one whole reply. Arrays are assembled on an explicit stack.
    async fn read_value(&mut self) -> RedisResult<Value> {
        // open arrays: elements so far, elements still to come
        let mut stack: Vec<(Vec<Value>, usize)> = Vec::new();
        loop {
            let Some(mut v_done) = self.read_item(&mut stack).await? else {
                continue;
            };
            loop {
                match stack.last_mut() {
                    None => return Ok(v_done),
                    Some((items, left)) => {
                        items.push(v_done);
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        let (items, _) = stack.pop().expect("not empty");
                        v_done = Value::Array(items);
                    }
                }
            }
        }
    }

    /// Reads one line and what follows it; `None` when it opened a non-empty array
    /// (pushed on `stack`).
    async fn read_item(
        &mut self,
        stack: &mut Vec<(Vec<Value>, usize)>,
    ) -> RedisResult<Option<Value>> {
        self.line.clear();
        let n = self
            .r
            .read_until(b'\n', &mut self.line)
            .await
            .map_err(io_error)?;
        if n < 3 || !self.line.ends_with(b"\r\n") {
            return Err(if n == 0 {
                io_error(std::io::ErrorKind::UnexpectedEof.into())
            } else {
                protocol_error("a truncated line")
            });
        }
        let body = &self.line[1..self.line.len() - 2];
        let int = || -> RedisResult<i64> {
            std::str::from_utf8(body)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol_error("a bad length or integer"))
        };
        Ok(Some(match self.line[0] {
            b'+' if body == b"OK" => Value::Okay,
            b'+' => Value::SimpleString(String::from_utf8_lossy(body).into_owned()),
            b':' => Value::Int(int()?),
            b'$' => {
                let len = int()?;
                if len < 0 {
                    Value::Nil
                } else {
                    let mut data = vec![0; len as usize + 2];
                    self.r.read_exact(&mut data).await.map_err(io_error)?;
                    if !data.ends_with(b"\r\n") {
                        return Err(protocol_error("a bulk string without its CRLF"));
                    }
                    data.truncate(len as usize);
                    Value::BulkString(data)
                }
            }
            b'*' => {
                let len = int()?;
                if len < 0 {
                    Value::Nil
                } else if len == 0 {
                    Value::Array(Vec::new())
                } else {
                    stack.push((Vec::with_capacity((len as usize).min(4096)), len as usize));
                    return Ok(None);
                }
            }
            b'-' if !stack.is_empty() => {
                return Err(protocol_error("an error inside an array"));
            }
            b'-' => {
                // Rare: let the client library turn it into its error (with the code).
                // The whole reply has been read: the connection can go on.
                return Err(match redis::parse_redis_value(&self.line) {
                    Ok(v) => match v.extract_error() {
                        Err(e) => e,
                        Ok(_) => protocol_error("an error reply that is not one"),
                    },
                    Err(e) => e,
                });
            }
            _ => return Err(protocol_error("an unknown reply type")),
        }))
    }
}

#[cfg(test)]
mod tests {
    //! The reader against a real redis-server is covered by every test that reads from a
    //! queue; these check the reply shapes the readers meet.
    use super::*;

    #[tokio::test]
    async fn reads_nested_replies_and_errors() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            let replies: [&[u8]; 4] = [
                b"*2\r\n*2\r\n$3\r\nabc\r\n*0\r\n$-1\r\n",
                b":42\r\n",
                b"-NOGROUP No such key or consumer group\r\n",
                b"*-1\r\n",
            ];
            let mut buf = [0u8; 1024];
            for r in replies {
                let _ = s.read(&mut buf).unwrap();
                s.write_all(r).unwrap();
            }
        });
        let info =
            redis::IntoConnectionInfo::into_connection_info(format!("redis://127.0.0.1:{port}"))
                .unwrap();
        let mut c = LeanConn::open(&info, Duration::from_secs(5), Duration::from_secs(5))
            .await
            .expect("a TCP address")
            .unwrap();
        let v = c.query(&redis::cmd("X")).await.unwrap();
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Array(vec![
                    Value::BulkString(b"abc".to_vec()),
                    Value::Array(vec![])
                ]),
                Value::Nil
            ])
        );
        assert_eq!(c.query(&redis::cmd("X")).await.unwrap(), Value::Int(42));
        let e = c.query(&redis::cmd("X")).await.unwrap_err();
        assert_eq!(e.code(), Some("NOGROUP"));
        assert_eq!(c.query(&redis::cmd("X")).await.unwrap(), Value::Nil);
    }
}
