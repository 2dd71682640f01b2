//! Stream reads ([`read_streams`]) against the client library's parser and a real
//! server.

use super::*;
use crate::conn::wire::buffered_header;
use crate::conn::wire::streams::{read_streams, SHARED_BULK_MAX};
use bytes::Bytes;

/// A stream read's reply as the tests build it: streams of entries, an entry's fields
/// nil (deleted while pending) or name/value pairs.
type StreamsReply = Vec<(Vec<u8>, Vec<(String, Option<Vec<(Vec<u8>, Vec<u8>)>>)>)>;

/// Field names a read hands out as static (a request entry's, for instance).
struct Names;

impl crate::conn::wire::FieldNames for Names {
    const NAMES: &'static [&'static [u8]] = &[b"head", b"body", b"tp", b"bref"];
}

fn streams_reply(streams: &StreamsReply) -> Reply {
    let bulk = |b: &[u8]| Reply::Bulk(b.to_vec());
    Reply::Array(
        streams
            .iter()
            .map(|(name, entries)| {
                let entries = entries
                    .iter()
                    .map(|(id, fields)| {
                        let fields = match fields {
                            None => Reply::NilArray,
                            Some(f) => Reply::Array(
                                f.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect(),
                            ),
                        };
                        Reply::Array(vec![bulk(id.as_bytes()), fields])
                    })
                    .collect();
                Reply::Array(vec![bulk(name), Reply::Array(entries)])
            })
            .collect(),
    )
}

/// Reads `bytes` with [`read_streams`] through a buffer of `cap` bytes (both kinds of
/// error as one).
fn read_streams_bytes(bytes: &[u8], cap: usize) -> RedisResult<Streams> {
    let mut r = BufReader::with_capacity(cap, bytes);
    read_streams::<_, Names>(&mut r, &mut Vec::new())
        .now_or_never()
        .expect("the reader waited on input that had ended")
        .and_then(|r| r)
}

/// What the reply reads as through the client library's parser and the conversion the
/// other connections use.
/// Streams as plain values, to compare: each name with its entries' ids and fields.
type Plain = Vec<(Vec<u8>, Vec<(String, Vec<(Bytes, Bytes)>)>)>;

fn streams_the_library_reads(bytes: &[u8]) -> Plain {
    let v = redis::parse_redis_value(bytes).unwrap();
    plain(
        crate::conn::reply::read_into_streams(v)
            .into_iter()
            .map(|(n, e)| (n.into(), e))
            .collect(),
    )
}

fn plain(s: Streams) -> Plain {
    s.into_iter()
        .map(|(n, e)| {
            (
                n.to_vec(),
                e.into_iter()
                    .map(|e| (e.id.to_string(), e.fields))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn a_stream_read_reads_as_through_the_client_library() {
    let large = vec![b'x'; SHARED_BULK_MAX + 10];
    let streams: StreamsReply = vec![
        (
            b"s1".to_vec(),
            vec![
                (
                    "1-0".into(),
                    Some(vec![
                        (b"rid".to_vec(), b"r1".to_vec()),
                        (b"body".to_vec(), large.clone()),
                        (b"e".to_vec(), Vec::new()),
                    ]),
                ),
                ("2-0".into(), None),
                ("3-0".into(), Some(Vec::new())),
            ],
        ),
        (b"s2".to_vec(), Vec::new()),
    ];
    let mut bytes = Vec::new();
    streams_reply(&streams).encode(&mut bytes);
    for cap in [1, 7, 64, 16 * 1024] {
        let ours = read_streams_bytes(&bytes, cap).unwrap();
        assert_eq!(
            plain(ours),
            streams_the_library_reads(&bytes),
            "buffer {cap}"
        );
    }
    // A timed-out block (nil), a server error (the whole reply: its code), an error
    // inside the reply and other shapes (protocol errors).
    assert!(read_streams_bytes(b"*-1\r\n", 64).unwrap().is_empty());
    assert!(read_streams_bytes(b"*0\r\n", 64).unwrap().is_empty());
    let e = read_streams_bytes(b"-NOGROUP no such group\r\n", 64).unwrap_err();
    assert_eq!(e.code(), Some("NOGROUP"));
    for bad in [
        &b"*1\r\n-ERR inside\r\n"[..],
        b":1\r\n",
        b"*1\r\n*3\r\n$1\r\na\r\n*0\r\n*0\r\n",
        b"*1\r\n*2\r\n$1\r\na\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*1\r\n$1\r\nk\r\n",
        b"*1\r\n*2\r\n$-1\r\n*0\r\n",
        b"*1\r\n*2\r\n$1\r\na\r\n*1\r\n*2\r\n$2\r\n\xff\xfe\r\n*0\r\n",
        // a bulk string without its CRLF, and a length past every limit (read whole in
        // the reader's buffer: the fast way leaves both to the slow one, which says so)
        b"*1\r\n*2\r\n$1\r\nabc\r\n*0\r\n",
        b"*1\r\n*2\r\n$99999999999999999999\r\n*0\r\n",
        b"*1\r\n*99999999999999999999\r\n",
    ] {
        let r = read_streams_bytes(bad, 64).map(|_| Value::Nil);
        assert!(
            is_protocol_error(&r),
            "{:?}: {r:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

fn streams() -> impl Strategy<Value = StreamsReply> {
    let value = prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..40),
        1 => (SHARED_BULK_MAX - 2..SHARED_BULK_MAX + 2).prop_map(|n| vec![b'\r'; n]),
    ];
    let fields = prop::option::weighted(
        0.9,
        prop::collection::vec((prop::collection::vec(any::<u8>(), 0..8), value), 0..5),
    );
    let entry = ("[0-9]{1,13}-[0-9]{1,3}", fields);
    prop::collection::vec(
        (
            prop::collection::vec(any::<u8>(), 1..12),
            prop::collection::vec(entry, 0..6),
        ),
        0..3,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn stream_reads_read_as_through_the_client_library(s in streams(), cap in with_cap()) {
        let mut bytes = Vec::new();
        streams_reply(&s).encode(&mut bytes);
        let ours = read_streams_bytes(&bytes, cap).unwrap();
        prop_assert_eq!(plain(ours), streams_the_library_reads(&bytes));
        // Cut anywhere: an error, never a shorter reply.
        for end in (0..bytes.len()).step_by(1 + bytes.len() / 50) {
            prop_assert!(read_streams_bytes(&bytes[..end], cap).is_err());
        }
    }
}

#[tokio::test]
async fn a_stream_read_on_a_real_server_reads_as_through_the_client_library() {
    let server = RedisServer::start();
    let mut sync = server.sync_connection();
    let large = vec![b'y'; 100_000];
    for i in 0..50u32 {
        let body: &[u8] = if i % 10 == 3 { &large } else { b"small" };
        let _: String = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("i")
            .arg(i)
            .arg("body")
            .arg(body)
            .query(&mut sync)
            .unwrap();
    }
    let read = || {
        let mut c = redis::cmd("XREAD");
        c.arg("COUNT").arg(100).arg("STREAMS").arg("s").arg("0");
        c
    };
    let theirs: Value = read().query(&mut sync).unwrap();
    // The same reply through the client library and its conversion, and through ours.
    let want: Streams = crate::conn::reply::read_into_streams(theirs)
        .into_iter()
        .map(|(n, e)| (n.into(), e))
        .collect();
    assert_eq!(want[0].1.len(), 50);
    let mut c = lean(&server.url(), Duration::from_secs(5)).await;
    let ours = c.query_streams::<Names>(&read()).await.unwrap();
    assert_eq!(plain(ours), plain(want));
    // A server error leaves it usable; a read that finds nothing is empty.
    let mut bad = redis::cmd("XREADGROUP");
    bad.arg("GROUP")
        .arg("g")
        .arg("c")
        .arg("STREAMS")
        .arg("s")
        .arg(">");
    assert_eq!(
        c.query_streams::<Names>(&bad).await.unwrap_err().code(),
        Some("NOGROUP")
    );
    let mut none = redis::cmd("XREAD");
    none.arg("STREAMS").arg("s").arg("$");
    assert!(c.query_streams::<Names>(&none).await.unwrap().is_empty());
    assert_eq!(
        c.query(&ping()).await.unwrap(),
        Value::SimpleString("PONG".into())
    );
}

/// The fast way takes a header only when it is whole and a plain length; anything else
/// is left to the slow way.
#[test]
fn a_header_is_taken_in_place_only_when_whole_and_plain() {
    assert_eq!(buffered_header(b"$5\r\nhello\r\n"), Some((b'$', 5, 4)));
    assert_eq!(buffered_header(b"*0\r\n"), Some((b'*', 0, 4)));
    assert_eq!(
        buffered_header(b"$123456789\r\n"),
        Some((b'$', 123_456_789, 12))
    );
    for not in [
        &b""[..],
        b"$",
        b"$12",
        b"$12\r",
        b"$\r\n",
        b"$-1\r\n",
        b"$1x\r\n",
        b"$5\rx",
        b"$1234567890\r\n",
    ] {
        assert_eq!(
            buffered_header(not),
            None,
            "{:?}",
            String::from_utf8_lossy(not)
        );
    }
}
