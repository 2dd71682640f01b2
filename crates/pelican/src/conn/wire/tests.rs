//! The lean connection against a real redis-server, the testkit's proxy, and
//! redis-rs' own parser (proptest).

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

#[test]
fn integers_parse_as_with_str_parse() {
    for text in [
        "0",
        "7",
        "-1",
        "-0",
        "123456789012345678",
        "-123456789012345678",
        "9223372036854775807",
        "-9223372036854775808",
        "1234567890123456789",
    ] {
        assert_eq!(
            integer(text.as_bytes()).ok(),
            Some(text.parse::<i64>().unwrap()),
            "{text}"
        );
    }
    for bad in [
        "",
        "-",
        "1a",
        " 1",
        "1 ",
        "--1",
        "9223372036854775808",
        "1.5",
        "x",
    ] {
        assert!(integer(bad.as_bytes()).is_err(), "{bad:?}");
    }
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

#[test]
fn large_bulks_read_around_the_buffer_leave_the_next_reply_whole() {
    // Sizes about the direct-read bound and past the first reservation, each followed by
    // another reply in the same stream, through buffers smaller and larger than the rest.
    for size in [
        DIRECT_READ_MIN - 1,
        DIRECT_READ_MIN,
        100_000,
        BULK_RESERVE + 3,
    ] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut bytes = format!("*2\r\n${size}\r\n").into_bytes();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(b"\r\n:7\r\n$3\r\nend\r\n");
        for cap in [1, 4096, 64 * 1024] {
            let mut r = BufReader::with_capacity(cap, bytes.as_slice());
            let mut line = Vec::new();
            let first = read_reply(&mut r, &mut line).now_or_never().unwrap();
            let want = Value::Array(vec![Value::BulkString(body.clone()), Value::Int(7)]);
            assert!(first.unwrap() == want, "size {size}, buffer {cap}");
            let next = read_reply(&mut r, &mut line).now_or_never().unwrap();
            assert_eq!(next.unwrap(), Value::BulkString(b"end".to_vec()));
            // Cut inside the body: the end of the stream, not a short value.
            let cut = &bytes[..bytes.len() - 30 - size / 2];
            let r = read_bytes(cut, cap);
            assert!(
                matches!(&r, Err(e) if e.is_connection_dropped()),
                "size {size}, buffer {cap}: {r:?}"
            );
        }
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

mod streams;
