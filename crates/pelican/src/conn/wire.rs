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
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

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
const BULK_RESERVE: usize = 64 * 1024;
const ARRAY_RESERVE: usize = 64;

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
            r: BufReader::with_capacity(64 * 1024, r),
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
        if self.poisoned {
            return Err(poisoned_error());
        }
        // Cleared only once the whole reply is in: an error, a timeout or this future
        // being dropped leave the stream at an unknown point.
        self.poisoned = true;
        let packed = cmd.get_packed_command();
        let io = async {
            self.w.write_all(&packed).await.map_err(io_error)?;
            read_reply(&mut self.r, &mut self.line).await
        };
        let reply = match tokio::time::timeout(self.timeout, io).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no reply from Redis in time",
                )))
            }
        };
        self.poisoned = false;
        match reply {
            Value::ServerError(e) => Err(e.into()),
            v => Ok(v),
        }
    }
}

/// Reads one whole RESP2 reply from `r` (`line` is a scratch buffer). A server error
/// reply comes back as [`Value::ServerError`], at the top or inside an array, as from
/// `redis::parse_redis_value`. `Err` means the stream cannot be read on: an I/O error,
/// the end of the stream, or bytes that are not RESP2 within the limits above
/// ([`MAX_BULK_LEN`], [`MAX_ARRAY_LEN`], [`MAX_NESTING`]).
///
/// Arrays are assembled on an explicit stack.
pub(crate) async fn read_reply<R>(r: &mut R, line: &mut Vec<u8>) -> RedisResult<Value>
where
    R: AsyncBufRead + Unpin,
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

async fn read_item<R>(r: &mut R, line: &mut Vec<u8>) -> RedisResult<Item>
where
    R: AsyncBufRead + Unpin,
{
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

fn integer(body: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol_error("a bad length or integer"))
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
/// arrive: a header claiming more than is sent costs what is sent, not what it claims.
async fn read_bulk<R>(r: &mut R, len: usize) -> RedisResult<Vec<u8>>
where
    R: AsyncBufRead + Unpin,
{
    let want = len + 2;
    let mut data = Vec::with_capacity(want.min(BULK_RESERVE));
    while data.len() < want {
        let buf = r.fill_buf().await.map_err(io_error)?;
        if buf.is_empty() {
            return Err(io_error(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let n = buf.len().min(want - data.len());
        data.extend_from_slice(&buf[..n]);
        r.consume(n);
    }
    if !data.ends_with(b"\r\n") {
        return Err(protocol_error("a bulk string without its CRLF"));
    }
    data.truncate(len);
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use pelican_testkit::{Proxy, RedisServer};
    use proptest::prelude::*;

    /// Reads one reply from `bytes` through a buffer of `cap` bytes. The input is in
    /// memory and ends, so the reader must finish without waiting.
    fn read_bytes(bytes: &[u8], cap: usize) -> RedisResult<Value> {
        let mut r = BufReader::with_capacity(cap, bytes);
        read_reply(&mut r, &mut Vec::new())
            .now_or_never()
            .expect("the reader waited on input that had ended")
    }

    fn server_error(line: &str) -> Value {
        let v = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        assert!(matches!(v, Value::ServerError(_)), "{v:?}");
        v
    }

    fn is_protocol_error(r: &RedisResult<Value>) -> bool {
        matches!(r, Err(e) if e.is_io_error() && e.to_string().contains("unexpected reply"))
    }

    #[test]
    fn reads_nested_replies_and_errors() {
        let v = read_bytes(b"*3\r\n*2\r\n$3\r\nabc\r\n*0\r\n$-1\r\n-ERR inner\r\n", 64);
        assert_eq!(
            v.unwrap(),
            Value::Array(vec![
                Value::Array(vec![
                    Value::BulkString(b"abc".to_vec()),
                    Value::Array(vec![])
                ]),
                Value::Nil,
                server_error("ERR inner"),
            ])
        );
        assert_eq!(read_bytes(b":42\r\n", 64).unwrap(), Value::Int(42));
        assert_eq!(read_bytes(b"*-1\r\n", 64).unwrap(), Value::Nil);
        let Value::ServerError(e) = read_bytes(b"-NOGROUP No such group\r\n", 64).unwrap() else {
            panic!("not an error reply");
        };
        assert_eq!(e.code(), "NOGROUP");
    }

    #[test]
    fn lengths_past_the_limits_and_negative_lengths_are_protocol_errors() {
        let past_bulk = format!("${}\r\n", MAX_BULK_LEN + 1);
        let past_array = format!("*{}\r\n", MAX_ARRAY_LEN + 1);
        let deep = "*1\r\n".repeat(MAX_NESTING + 1) + ":1\r\n";
        let cases: [&[u8]; 7] = [
            past_bulk.as_bytes(),
            b"$9223372036854775807\r\n",
            b"$-2\r\n",
            past_array.as_bytes(),
            b"*9223372036854775807\r\n",
            b"*-2\r\n",
            deep.as_bytes(),
        ];
        for bytes in cases {
            let r = read_bytes(bytes, 64);
            assert!(
                is_protocol_error(&r),
                "{:?}: {r:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let nested = "*1\r\n".repeat(MAX_NESTING) + ":1\r\n";
        assert!(read_bytes(nested.as_bytes(), 64).is_ok());
    }

    /// The largest single allocation the current thread asked for, so a test can see
    /// what a reply made the reader reserve.
    mod probe {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub(super) struct LargestAlloc;

        thread_local! {
            static LARGEST: Cell<usize> = const { Cell::new(0) };
        }

        fn note(size: usize) {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }

        /// Runs `f` and returns what it returned and the largest allocation it made.
        pub(super) fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
            LARGEST.with(|l| l.set(0));
            let out = f();
            (out, LARGEST.with(Cell::get))
        }

        // SAFETY: forwards every call to the system allocator unchanged.
        unsafe impl GlobalAlloc for LargestAlloc {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                note(layout.size());
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                note(new_size);
                unsafe { System.realloc(ptr, layout, new_size) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) }
            }
        }
    }

    #[global_allocator]
    static ALLOC: probe::LargestAlloc = probe::LargestAlloc;

    #[test]
    fn a_header_claiming_much_costs_only_what_arrives() {
        // Headers at the limits, then a few bytes and the end of the stream.
        let bulk = format!("${MAX_BULK_LEN}\r\nabc");
        let array = format!("*{MAX_ARRAY_LEN}\r\n").repeat(MAX_NESTING) + ":1\r\n";
        for bytes in [bulk, array] {
            let (r, largest) = probe::largest_alloc(|| read_bytes(bytes.as_bytes(), 4096));
            assert!(
                matches!(&r, Err(e) if e.is_connection_dropped()),
                "must end at EOF: {r:?}"
            );
            assert!(largest <= 1 << 20, "allocated {largest} bytes at once");
        }
    }

    async fn lean(url: &str, timeout: Duration) -> LeanConn {
        let info = redis::IntoConnectionInfo::into_connection_info(url).unwrap();
        LeanConn::open(&info, Duration::from_secs(5), timeout)
            .await
            .expect("a TCP address")
            .unwrap()
    }

    fn ping() -> redis::Cmd {
        redis::cmd("PING")
    }

    #[tokio::test]
    async fn a_server_error_reply_leaves_the_connection_usable() {
        let server = RedisServer::start();
        let mut c = lean(&server.url(), Duration::from_secs(5)).await;
        c.query(redis::cmd("SET").arg("k").arg("v")).await.unwrap();
        let e = c
            .query(redis::cmd("LPUSH").arg("k").arg("x"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
        let e = c.query(redis::cmd("INCR").arg("k")).await.unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{e}");
        assert_eq!(
            c.query(&ping()).await.unwrap(),
            Value::SimpleString("PONG".into())
        );
    }

    /// A call that timed out leaves its reply to come; the next call must not take it
    /// for its own.
    #[tokio::test]
    async fn after_a_timeout_the_late_reply_is_never_taken_for_the_next_one() {
        let server = RedisServer::start();
        let mut c = lean(&server.url(), Duration::from_millis(100)).await;
        let e = c
            .query(redis::cmd("BLPOP").arg("late").arg(30))
            .await
            .unwrap_err();
        assert!(e.is_timeout(), "{e}");
        // The blocked BLPOP gets its element: its reply is now on the way.
        let mut other = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg("late")
            .arg("stale")
            .query_async(&mut other)
            .await
            .unwrap();
        let r = c.query(redis::cmd("ECHO").arg("fresh")).await;
        assert!(
            matches!(&r, Err(e) if e.is_connection_dropped()),
            "a poisoned connection answered: {r:?}"
        );
        // ... and stays poisoned.
        let r = c.query(&ping()).await;
        assert!(matches!(&r, Err(e) if e.is_connection_dropped()), "{r:?}");
    }

    /// A timeout in the middle of a long reply (a slow network) leaves the rest unread;
    /// the rest must not be read as the next reply, even if it looks like one.
    #[tokio::test]
    async fn after_a_timeout_mid_reply_the_rest_is_never_read_as_a_reply() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut c = lean(&proxy.url(), Duration::from_millis(300)).await;
        // 1 MiB of "+stale\r\n": 64 chunks through the proxy, 50 ms each.
        let value = "+stale\r\n".repeat(128 * 1024);
        c.query(redis::cmd("SET").arg("big").arg(&value))
            .await
            .unwrap();
        proxy.set_latency(Duration::from_millis(50));
        let e = c.query(redis::cmd("GET").arg("big")).await.unwrap_err();
        assert!(e.is_timeout(), "{e}");
        proxy.set_latency(Duration::ZERO);
        let r = c.query(&ping()).await;
        assert!(
            matches!(&r, Err(e) if e.is_connection_dropped()),
            "a poisoned connection answered: {r:?}"
        );
    }

    /// A reply as the tests build it: what it encodes to, and what it reads as.
    #[derive(Debug, Clone)]
    enum Reply {
        Simple(String),
        Error(String),
        Int(i64),
        Bulk(Vec<u8>),
        NilBulk,
        NilArray,
        Array(Vec<Reply>),
    }

    impl Reply {
        fn encode(&self, out: &mut Vec<u8>) {
            match self {
                Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
                Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
                Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
                Reply::Bulk(b) => {
                    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                    out.extend_from_slice(b);
                    out.extend_from_slice(b"\r\n");
                }
                Reply::NilBulk => out.extend_from_slice(b"$-1\r\n"),
                Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
                Reply::Array(items) => {
                    out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                    for i in items {
                        i.encode(out);
                    }
                }
            }
        }

        fn value(&self) -> Value {
            match self {
                Reply::Simple(s) if s == "OK" => Value::Okay,
                Reply::Simple(s) => Value::SimpleString(s.clone()),
                Reply::Error(s) => server_error(s),
                Reply::Int(i) => Value::Int(*i),
                Reply::Bulk(b) => Value::BulkString(b.clone()),
                Reply::NilBulk | Reply::NilArray => Value::Nil,
                Reply::Array(items) => Value::Array(items.iter().map(Reply::value).collect()),
            }
        }
    }

    fn reply() -> impl Strategy<Value = Reply> {
        // any text without a line feed (a lone CR is fine)
        let line = "[^\n]{0,16}";
        let leaf = prop_oneof![
            prop_oneof![Just("OK".to_string()), line].prop_map(Reply::Simple),
            ("[A-Z]{1,10}", prop::option::of(line)).prop_map(|(code, detail)| match detail {
                Some(d) => Reply::Error(format!("{code} {d}")),
                None => Reply::Error(code),
            }),
            any::<i64>().prop_map(Reply::Int),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Reply::Bulk),
            prop::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'$')], 0..6)
                .prop_map(Reply::Bulk),
            Just(Reply::NilBulk),
            Just(Reply::NilArray),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop::collection::vec(inner, 0..6).prop_map(Reply::Array)
        })
    }

    /// A broken copy of `bytes`: one byte replaced, dropped or added.
    fn corrupt(bytes: &[u8], at: prop::sample::Index, how: u8, with: u8) -> Vec<u8> {
        let mut b = bytes.to_vec();
        let i = at.index(b.len());
        match how % 3 {
            0 => b[i] = with,
            1 => {
                b.remove(i);
            }
            _ => b.insert(i, with),
        }
        b
    }

    fn with_cap() -> impl Strategy<Value = usize> {
        prop_oneof![1..8usize, Just(4096usize)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn reads_what_the_client_library_reads(r in reply(), cap in with_cap()) {
            let mut bytes = Vec::new();
            r.encode(&mut bytes);
            let want = r.value();
            prop_assert_eq!(redis::parse_redis_value(&bytes).unwrap(), want.clone());
            prop_assert_eq!(read_bytes(&bytes, cap).unwrap(), want);
        }

        #[test]
        fn a_truncated_reply_fails_in_both(r in reply(), cap in with_cap()) {
            let mut bytes = Vec::new();
            r.encode(&mut bytes);
            for end in 0..bytes.len() {
                let cut = &bytes[..end];
                prop_assert!(redis::parse_redis_value(cut).is_err(), "client library read {:?}", cut);
                let ours = read_bytes(cut, cap);
                prop_assert!(ours.is_err(), "read {:?} from {:?}", ours, cut);
            }
        }

        #[test]
        fn a_corrupted_reply_reads_as_in_the_client_library_or_fails(
            r in reply(),
            at in any::<prop::sample::Index>(),
            how in any::<u8>(),
            with in prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'*'), Just(b'$'), Just(b'-'), Just(b'9'), any::<u8>()],
            cap in with_cap(),
        ) {
            let mut bytes = Vec::new();
            r.encode(&mut bytes);
            let bad = corrupt(&bytes, at, how, with);
            // Stricter than the client library is fine (RESP3 types, spaces around
            // numbers, lone LFs); reading something else than it does is not.
            if let Ok(v) = read_bytes(&bad, cap) {
                prop_assert_eq!(redis::parse_redis_value(&bad).ok(), Some(v), "{:?}", bad);
            }
        }
    }
}
