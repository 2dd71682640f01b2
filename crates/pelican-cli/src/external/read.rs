//! Reading a child's output one line at a time, with a limit on a line's length (a child
//! that writes without end must not fill our memory).

use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// A line, in the buffer, without its end.
    Line,
    /// A line longer than the limit: its first bytes are in the buffer.
    TooLong,
    /// The end of the stream (a last line without `\n` is returned as a line first).
    Eof,
}

/// Reads one line into `buf` (cleared first), without its `\n` (or `\r\n`). A line
/// longer than `max`: `TooLong`, with its first `max` bytes in `buf`; with `skip_rest`
/// the rest of the line is read and dropped, otherwise it stays unread.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
    skip_rest: bool,
) -> io::Result<Read> {
    buf.clear();
    let mut too_long = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if too_long {
                Read::TooLong
            } else if buf.is_empty() {
                Read::Eof
            } else {
                Read::Line
            });
        }
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if !too_long {
            buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            too_long = chunk.len() > room;
        }
        r.consume(used);
        if done {
            if too_long {
                return Ok(Read::TooLong);
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Read::Line);
        }
        if too_long && !skip_rest {
            return Ok(Read::TooLong);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn lines_are_read_with_a_limit() {
        let data: &[u8] = b"one\r\ntwo\n0123456789abc\nlast";
        let mut r = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        loop {
            let k = read_line(&mut r, &mut buf, 10, true).await.unwrap();
            if k == Read::Eof {
                break;
            }
            got.push((k, String::from_utf8(buf.clone()).unwrap()));
        }
        assert_eq!(
            got,
            [
                (Read::Line, "one".to_string()),
                (Read::Line, "two".into()),
                (Read::TooLong, "0123456789".into()),
                (Read::Line, "last".into()),
            ]
        );
        let mut r = BufReader::with_capacity(4, &b"0123456789abc\nnext\n"[..]);
        assert_eq!(
            read_line(&mut r, &mut buf, 10, false).await.unwrap(),
            Read::TooLong
        );
    }
}
