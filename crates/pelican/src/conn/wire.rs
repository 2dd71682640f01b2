//! A lean connection for the tasks that send one command at a time on a connection of
//! their own: a consumer's `XREADGROUP BLOCK`, a producer's `XREAD BLOCK` of its reply
//! stream, a consumer's outcome writes. Plain TCP, replies read with a small RESP2 reader
//! ([`read_reply`]).
//!
//! Why not the client library's connection: these tasks need no multiplexing, and its
//! general reply parser was the largest single cost of a delivery in the worker (a
//! quarter of the worker's instructions per request under callgrind). TLS and
//! Unix-socket URLs keep using the client library (see `OwnConn`).
//!
//! A connection is poisoned by any failure other than a server error reply (an I/O
//! error, a reply that is not RESP2, a timeout, a call dropped half way): the stream is
//! then at an unknown point, and the next reply read could be the rest of an old one.
//! Every later call fails at once with a dropped-connection error, so callers reconnect.

use redis::{ConnectionAddr, ConnectionInfo, RedisResult, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

mod streams;
pub(crate) use streams::{FieldNames, NoNames, Streams};

/// Longest bulk string a reply may claim: Redis' own `proto-max-bulk-len` default, so
/// no value Redis stores can exceed it.
const MAX_BULK_LEN: usize = 512 * 1024 * 1024;

/// Most elements an array reply may claim. Far above any reply pelican asks for (a
/// read returns at most its `COUNT` entries, a script a batch of flags); a header past
/// it is garbage.
const MAX_ARRAY_LEN: usize = 1 << 24;

/// Deepest nesting of arrays (pelican's replies nest 4 deep; the client library stops
/// at 100).
const MAX_NESTING: usize = 64;

/// Bytes reserved for a bulk string, and elements for an array, before they arrive:
/// past this the buffer grows with what is received, never with what a header claims.
/// A bulk string of up to this size is read into one allocation, never moved by a
/// growth (a 100 KB body grown from 64 KiB was copied once more).
const BULK_RESERVE: usize = 1 << 20;
const ARRAY_RESERVE: usize = 64;
/// How much more room a bulk string's buffer gets at a time past [`BULK_RESERVE`].
const BULK_GROW: usize = 1 << 20;
/// The reader's own buffer. Every byte of a reply that arrives through it is copied once
/// more, and each read fills it: after a large body, the read for the next reply's header
/// takes up to this much of the next body with it. 16 KiB rather than 64: at 100 KB the
/// copies through it were 12-16 % of the worker's samples; a reply of many small entries
/// (128 entries of 64-byte bodies, ~25 KB) takes two reads instead of one.
const READ_BUFFER: usize = 16 * 1024;
/// The least rest of a bulk string read from the socket straight into its buffer; a
/// smaller one goes through the reader's buffer, which reads what follows with it (one
/// read for the rest and the next reply's start, not two).
const DIRECT_READ_MIN: usize = 16 * 1024;

/// A plain TCP connection that runs one command at a time.
pub(crate) struct LeanConn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    line: Vec<u8>,
    /// Longest wait for a reply (longer than any BLOCK sent on this connection).
    timeout: Duration,
    /// Set while a call is under way and left set when it fails: see the module docs.
    poisoned: bool,
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

/// What every call on a poisoned connection gets: an error `is_connection_dropped`
/// recognises, so callers reconnect.
fn poisoned_error() -> redis::RedisError {
    io_error(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "connection abandoned after an earlier call failed mid-reply; open a new one",
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
            r: BufReader::with_capacity(READ_BUFFER, r),
            w,
            line: Vec::with_capacity(64),
            timeout: connect_timeout,
            poisoned: false,
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
    /// code (`NOGROUP`, `NOSCRIPT`, ...) and leaves the connection usable. Any other
    /// error poisons it: this call and every later one fail, the later ones at once and
    /// with an error `is_connection_dropped` recognises.
    pub(crate) async fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let packed = cmd.get_packed_command();
        let reply = self.send_parts(&[&packed], 1).await?.pop();
        into_result(reply.expect("one reply for one command"))
    }

    /// Sends a stream read (`XREADGROUP`, `XREAD`) and reads its reply straight into
    /// entries ([`streams::read_streams`]; field names among `F`'s static). Errors as
    /// for [`LeanConn::query`].
    pub(crate) async fn query_streams<F: FieldNames>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> RedisResult<Streams> {
        let packed = cmd.get_packed_command();
        self.exchange(&[&packed], async |r, line| {
            streams::read_streams::<_, F>(r, line).await
        })
        .await?
    }
}

impl LeanConn {
    /// Whether the last call left it usable (see the module docs on poisoning).
    pub(crate) fn is_usable(&self) -> bool {
        !self.poisoned
    }

    /// Sends one write made of `parts` (RESP commands, already encoded, in pieces: a large
    /// value is written from where it lies, not copied into a command buffer first) and
    /// reads `replies` replies. Server error replies come back as [`Value::ServerError`]
    /// in their place; any other failure poisons the connection, as in [`LeanConn::query`].
    pub(crate) async fn send_parts(
        &mut self,
        parts: &[&[u8]],
        replies: usize,
    ) -> RedisResult<Vec<Value>> {
        self.exchange(parts, async |r, line| {
            let mut out = Vec::with_capacity(replies);
            for _ in 0..replies {
                out.push(read_reply(r, line).await?);
            }
            Ok(out)
        })
        .await
    }

    /// Sends `parts` in one write and reads with `read`, within the timeout. Only an `Ok`
    /// from `read` leaves the connection usable: an error, a timeout or this future being
    /// dropped leave the stream at an unknown point, and every later call fails at once.
    async fn exchange<T>(
        &mut self,
        parts: &[&[u8]],
        read: impl AsyncFnOnce(&mut BufReader<OwnedReadHalf>, &mut Vec<u8>) -> RedisResult<T>,
    ) -> RedisResult<T> {
        if self.poisoned {
            return Err(poisoned_error());
        }
        self.poisoned = true;
        let io = async {
            write_all_vectored(&mut self.w, parts)
                .await
                .map_err(io_error)?;
            read(&mut self.r, &mut self.line).await
        };
        let out = match tokio::time::timeout(self.timeout, io).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no reply from Redis in time",
                )))
            }
        };
        self.poisoned = false;
        Ok(out)
    }
}

/// Writes every byte of `parts`, in as few `writev` calls as the kernel allows.
async fn write_all_vectored(w: &mut OwnedWriteHalf, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut at = 0; // the part being written
    let mut off = 0; // bytes of it already written
    while at < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[at][off..])
            .chain(parts[at + 1..].iter().copied())
            .take(64)
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while at < parts.len() && n >= parts[at].len() - off {
            n -= parts[at].len() - off;
            at += 1;
            off = 0;
        }
        off += n;
    }
    Ok(())
}

/// A reply as a result: a server error reply as `Err` with its code, anything else as it is.
pub(crate) fn into_result(v: Value) -> RedisResult<Value> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

/// Reads one whole RESP2 reply from `r` (`line` is a scratch buffer). A server error
/// reply comes back as [`Value::ServerError`], at the top or inside an array, as from
/// `redis::parse_redis_value`. `Err` means the stream cannot be read on: an I/O error,
/// the end of the stream, or bytes that are not RESP2 within the limits above
/// ([`MAX_BULK_LEN`], [`MAX_ARRAY_LEN`], [`MAX_NESTING`]).
///
/// Arrays are assembled on an explicit stack.
pub(crate) async fn read_reply<R>(r: &mut BufReader<R>, line: &mut Vec<u8>) -> RedisResult<Value>
where
    R: AsyncRead + Unpin,
{
    // open arrays: elements so far, elements still to come
    let mut stack: Vec<(Vec<Value>, usize)> = Vec::new();
    loop {
        let mut v_done = match read_item(r, line).await? {
            Item::Value(v) => v,
            Item::Array(len) => {
                if stack.len() >= MAX_NESTING {
                    return Err(protocol_error("arrays nested too deep"));
                }
                stack.push((Vec::with_capacity(len.min(ARRAY_RESERVE)), len));
                continue;
            }
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

/// One header line and what follows it.
enum Item {
    /// A whole value.
    Value(Value),
    /// The header of a non-empty array of this many elements.
    Array(usize),
}

async fn read_item<R>(r: &mut BufReader<R>, line: &mut Vec<u8>) -> RedisResult<Item>
where
    R: AsyncRead + Unpin,
{
    if let Some(item) = buffered_item(r) {
        return Ok(item);
    }
    line.clear();
    let n = r.read_until(b'\n', line).await.map_err(io_error)?;
    if n < 3 || !line.ends_with(b"\r\n") {
        return Err(if n == 0 || !line.ends_with(b"\n") {
            io_error(std::io::ErrorKind::UnexpectedEof.into())
        } else {
            protocol_error("a line without its CR or type")
        });
    }
    let body = &line[1..line.len() - 2];
    Ok(Item::Value(match line[0] {
        b'+' if body == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(
            std::str::from_utf8(body)
                .map_err(|_| protocol_error("a simple string that is not UTF-8"))?
                .to_owned(),
        ),
        b':' => Value::Int(integer(body)?),
        b'$' => match length(body, MAX_BULK_LEN)? {
            None => Value::Nil,
            Some(len) => Value::BulkString(read_bulk(r, len).await?),
        },
        b'*' => match length(body, MAX_ARRAY_LEN)? {
            None => Value::Nil,
            Some(0) => Value::Array(Vec::new()),
            Some(len) => return Ok(Item::Array(len)),
        },
        // Rare: let the client library turn it into its error (with the code).
        b'-' => match redis::parse_redis_value(line) {
            Ok(v @ Value::ServerError(_)) => v,
            Ok(_) => return Err(protocol_error("an error reply that is not one")),
            Err(_) => return Err(protocol_error("an error reply that is not UTF-8")),
        },
        _ => return Err(protocol_error("an unknown reply type")),
    }))
}

/// Most digits a header's length has on the fast way (above [`MAX_BULK_LEN`]'s nine, a
/// header goes the slow way, which refuses it).
const HEADER_DIGITS: usize = 9;

/// The header line at the start of `buf` when the reader's buffer holds all of it and it
/// gives a plain length (digits only: not nil's `-1`): its kind byte, the length, and the
/// bytes the line takes with its CRLF. `None` sends the caller the slow way
/// ([`read_item`], `read_until`), which reads what is missing and reports what is wrong:
/// the fast way only takes what it can check in place.
pub(super) fn buffered_header(buf: &[u8]) -> Option<(u8, usize, usize)> {
    let (&kind, rest) = buf.split_first()?;
    let mut n = 0usize;
    for (i, &b) in rest.iter().enumerate().take(HEADER_DIGITS + 1) {
        match b {
            b'0'..=b'9' => n = n * 10 + usize::from(b - b'0'),
            b'\r' if i > 0 => {
                return (rest.get(i + 1) == Some(&b'\n')).then_some((kind, n, i + 3));
            }
            _ => return None,
        }
    }
    None
}

/// A bulk string at the start of `buf` when the reader's buffer holds all of it (header,
/// value, CRLF): the value, and the bytes it takes. `None`: read it the slow way.
#[inline]
pub(super) fn buffered_value(buf: &[u8]) -> Option<(&[u8], usize)> {
    let (kind, len, head) = buffered_header(buf)?;
    let end = head + len;
    if kind != b'$' || buf.get(end..end + 2)? != b"\r\n" {
        return None;
    }
    Some((&buf[head..end], end + 2))
}

/// [`read_item`]'s fast way: an item the reader's buffer holds whole (an array's header,
/// a non-negative integer, a bulk string with its value), read from there. `None`: the
/// slow way (anything else, and whatever is wrong).
fn buffered_item<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> Option<Item> {
    let buf = r.buffer();
    let (kind, n, head) = buffered_header(buf)?;
    let (item, used) = match kind {
        b':' => (Item::Value(Value::Int(n as i64)), head),
        b'*' if n == 0 => (Item::Value(Value::Array(Vec::new())), head),
        b'*' if n <= MAX_ARRAY_LEN => (Item::Array(n), head),
        b'$' => {
            let (value, used) = buffered_value(buf)?;
            (Item::Value(Value::BulkString(value.to_vec())), used)
        }
        _ => return None,
    };
    r.consume(used);
    Some(item)
}

/// A RESP integer or length: an optional `-`, then 1 to 18 decimal digits (a header of
/// every bulk string, so parsed by hand: through `str::parse` it was 4 % of a worker's
/// instructions). Longer ones, rare, go through `str::parse` for its overflow checks.
fn integer(body: &[u8]) -> RedisResult<i64> {
    let bad = || protocol_error("a bad length or integer");
    let (negative, digits) = match body.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, body),
    };
    if digits.is_empty() || digits.len() > 18 {
        return std::str::from_utf8(body)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad);
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad());
        }
        n = n * 10 + i64::from(d - b'0');
    }
    Ok(if negative { -n } else { n })
}

/// A bulk or array length: `None` for the nil reply (-1), at most `max`.
fn length(body: &[u8], max: usize) -> RedisResult<Option<usize>> {
    match integer(body)? {
        -1 => Ok(None),
        n if n < 0 => Err(protocol_error("a negative length")),
        n if n as u64 > max as u64 => Err(protocol_error("a length past the limit")),
        n => Ok(Some(n as usize)),
    }
}

/// The `len` bytes of a bulk string and their CRLF, in a buffer that grows as they
/// arrive: a header claiming more than is sent costs what is sent, not what it claims
/// (beyond [`BULK_RESERVE`], the buffer is reserved a megabyte at a time). What the
/// reader holds already is copied; a rest of [`DIRECT_READ_MIN`] bytes or more is read
/// from the socket straight into the buffer, around the reader's own (a large body is
/// copied once, not twice: the reader's buffer would take the rest in pieces of its size
/// and copy each one on).
async fn read_bulk<R>(r: &mut BufReader<R>, len: usize) -> RedisResult<Vec<u8>>
where
    R: AsyncRead + Unpin,
{
    use bytes::BufMut;
    use tokio::io::AsyncReadExt;
    let want = len + 2;
    let mut data = Vec::with_capacity(want.min(BULK_RESERVE));
    while data.len() < want {
        let rest = want - data.len();
        if r.buffer().is_empty() && rest >= DIRECT_READ_MIN {
            if data.capacity() == data.len() {
                data.reserve(rest.min(BULK_GROW));
            }
            let room = (data.capacity() - data.len()).min(rest);
            let n = r
                .get_mut()
                .read_buf(&mut (&mut data).limit(room))
                .await
                .map_err(io_error)?;
            if n == 0 {
                return Err(io_error(std::io::ErrorKind::UnexpectedEof.into()));
            }
        } else {
            let buffered = r.fill_buf().await.map_err(io_error)?;
            if buffered.is_empty() {
                return Err(io_error(std::io::ErrorKind::UnexpectedEof.into()));
            }
            let n = buffered.len().min(rest);
            data.extend_from_slice(&buffered[..n]);
            r.consume(n);
        }
    }
    if !data.ends_with(b"\r\n") {
        return Err(protocol_error("a bulk string without its CRLF"));
    }
    data.truncate(len);
    Ok(data)
}

#[cfg(test)]
mod tests;
