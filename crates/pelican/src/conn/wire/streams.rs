//! Stream reads (`XREADGROUP`, `XREAD`) read straight into entries, for the lean
//! connection ([`super::LeanConn::query_streams`]).

use super::{
    buffered_header, buffered_value, into_result, io_error, length, protocol_error, read_bulk,
    read_item, Item, ARRAY_RESERVE, MAX_ARRAY_LEN, MAX_BULK_LEN,
};
use crate::conn::reply::RawEntry;
use bytes::{Bytes, BytesMut};
use redis::{RedisResult, Value};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// A stream read's reply: each stream's name with its entries (empty for a nil reply,
/// a block that timed out).
pub(crate) type Streams = Vec<(Bytes, Vec<RawEntry>)>;

/// The field names a stream read expects (the protocol says which: its entries' fields),
/// handed out as static `Bytes`, neither copied nor counted. A type, not a value: each
/// read is compiled for its names, compared as the constants they are.
pub(crate) trait FieldNames {
    const NAMES: &'static [&'static [u8]];
}

/// No field name kept static (the names are data, request ids say).
pub(crate) struct NoNames;

impl FieldNames for NoNames {
    const NAMES: &'static [&'static [u8]] = &[];
}

/// Bulk strings shorter than this are read into a reply's shared buffers; longer ones
/// get a buffer of their own (read around the reader's, see [`read_bulk`]).
pub(super) const SHARED_BULK_MAX: usize = 4096;
/// A reply's shared buffers are allocated this large (or as large as one bulk string).
const SHARED_CHUNK: usize = 16 * 1024;

/// Reads a stream read's reply (RESP2: nil, or `[[name, [[id, [field, value, ...] or
/// nil], ...]], ...]`) straight into entries, where [`super::read_reply`] and the
/// conversion after it made a `Vec` for every name, value and array: the small names and
/// values of a reply are copied into a few shared buffers and handed out as `Bytes` of
/// them. The outer `Err`: the stream cannot be read on (I/O, a reply of another shape: a
/// protocol error); the inner one: a server error reply, read whole, with its code.
/// Field names among `F`'s ([`FieldNames`], the protocol's) are handed out as static.
pub(super) async fn read_streams<R, F>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> RedisResult<RedisResult<Streams>>
where
    R: AsyncRead + Unpin,
    F: FieldNames,
{
    let mut shared = BytesMut::new();
    // Only the whole reply may be a server error (the connection is then where it
    // should be); one inside it is a protocol error.
    let n = match read_item(r, line).await? {
        Item::Array(n) => n,
        Item::Value(Value::Nil) => return Ok(Ok(Vec::new())),
        Item::Value(Value::Array(a)) if a.is_empty() => return Ok(Ok(Vec::new())),
        Item::Value(v @ Value::ServerError(_)) => return Ok(into_result(v).map(|_| Vec::new())),
        Item::Value(_) => return Err(protocol_error("a stream read's reply that is not one")),
    };
    let mut streams = Vec::with_capacity(n.min(ARRAY_RESERVE));
    for _ in 0..n {
        expect_pair(r, line).await?;
        let name = read_bulk_shared(r, line, &mut shared).await?;
        let count = read_array_header(r, line).await?.unwrap_or(0);
        let mut entries = Vec::with_capacity(count.min(ARRAY_RESERVE));
        for _ in 0..count {
            expect_pair(r, line).await?;
            let id = read_bulk_shared(r, line, &mut shared).await?;
            let id: Arc<str> = std::str::from_utf8(&id)
                .map_err(|_| protocol_error("an entry id that is not UTF-8"))?
                .into();
            // nil: an entry deleted while pending (XREADGROUP of the history).
            let flat = read_array_header(r, line).await?.unwrap_or(0);
            if flat % 2 != 0 {
                return Err(protocol_error("an entry with an odd number of fields"));
            }
            let mut fields = Vec::with_capacity((flat / 2).min(ARRAY_RESERVE));
            for _ in 0..flat / 2 {
                let k = match buffered_name::<F>(r.buffer()) {
                    Some((name, used)) => {
                        r.consume(used);
                        name
                    }
                    None => read_bulk_shared(r, line, &mut shared).await?,
                };
                let v = read_bulk_shared(r, line, &mut shared).await?;
                fields.push((k, v));
            }
            entries.push(RawEntry { id, fields });
        }
        streams.push((name, entries));
    }
    Ok(Ok(streams))
}

/// An array's header inside a stream read's reply: its length, `None` for nil.
async fn read_array_header<R>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> RedisResult<Option<usize>>
where
    R: AsyncRead + Unpin,
{
    if let Some((b'*', n, used)) = buffered_header(r.buffer()) {
        if n <= MAX_ARRAY_LEN {
            r.consume(used);
            return Ok(Some(n));
        }
    }
    match read_item(r, line).await? {
        Item::Array(n) => Ok(Some(n)),
        Item::Value(Value::Nil) => Ok(None),
        Item::Value(Value::Array(a)) if a.is_empty() => Ok(Some(0)),
        Item::Value(_) => Err(protocol_error("not an array where a stream read has one")),
    }
}

async fn expect_pair<R>(r: &mut BufReader<R>, line: &mut Vec<u8>) -> RedisResult<()>
where
    R: AsyncRead + Unpin,
{
    match read_array_header(r, line).await? {
        Some(2) => Ok(()),
        _ => Err(protocol_error("not a pair where a stream read has one")),
    }
}

/// A bulk string: a short one copied into `shared` and split off it, a long one read
/// into a buffer of its own.
async fn read_bulk_shared<R>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
    shared: &mut BytesMut,
) -> RedisResult<Bytes>
where
    R: AsyncRead + Unpin,
{
    if let Some((value, used)) = buffered_bulk(r.buffer(), shared) {
        r.consume(used);
        return Ok(value);
    }
    line.clear();
    let n = r.read_until(b'\n', line).await.map_err(io_error)?;
    if n < 3 || line[0] != b'$' || !line.ends_with(b"\r\n") {
        return Err(if n == 0 || !line.ends_with(b"\n") {
            io_error(std::io::ErrorKind::UnexpectedEof.into())
        } else {
            protocol_error("not a bulk string where a stream read has one")
        });
    }
    let Some(len) = length(&line[1..line.len() - 2], MAX_BULK_LEN)? else {
        return Err(protocol_error(
            "a nil where a stream read has a bulk string",
        ));
    };
    if len >= SHARED_BULK_MAX {
        return Ok(Bytes::from(read_bulk(r, len).await?));
    }
    let want = len + 2;
    make_room(shared, want);
    while shared.len() < want {
        let buffered = r.fill_buf().await.map_err(io_error)?;
        if buffered.is_empty() {
            return Err(io_error(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let take = buffered.len().min(want - shared.len());
        shared.extend_from_slice(&buffered[..take]);
        r.consume(take);
    }
    if !shared.ends_with(b"\r\n") {
        return Err(protocol_error("a bulk string without its CRLF"));
    }
    let mut b = shared.split();
    b.truncate(len);
    Ok(b.freeze())
}

/// Room for `want` more bytes in `shared`: a new chunk when the current one is full.
fn make_room(shared: &mut BytesMut, want: usize) {
    if shared.capacity() - shared.len() < want {
        *shared = BytesMut::with_capacity(SHARED_CHUNK.max(want));
    }
}

/// A field name among `F`'s at the start of `buf`, whole: as a static `Bytes`, and the
/// bytes it took. Six or more names a delivery of a pelican request, each otherwise a
/// copy into the shared buffer and a reference count.
fn buffered_name<F: FieldNames>(buf: &[u8]) -> Option<(Bytes, usize)> {
    let (value, used) = buffered_value(buf)?;
    let name = F::NAMES.iter().find(|n| **n == value)?;
    Some((Bytes::from_static(name), used))
}

/// A short bulk string read from the reader's buffer when all of it is there (header,
/// value, CRLF): the value copied into `shared` and split off it, and the bytes it took.
/// The common case of a stream read: one `read` brings many entries. `None`: read it the
/// slow way.
fn buffered_bulk(buf: &[u8], shared: &mut BytesMut) -> Option<(Bytes, usize)> {
    let (value, used) = buffered_value(buf)?;
    if value.len() >= SHARED_BULK_MAX {
        return None;
    }
    make_room(shared, value.len());
    shared.extend_from_slice(value);
    Some((shared.split().freeze(), used))
}
