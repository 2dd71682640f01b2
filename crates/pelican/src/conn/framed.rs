//! Commands whose one large argument is written from where it lies: the SETs of stored
//! bodies and answers (`protocol/stored`), and XADDs of large bodies without dedup, sent on a lean connection
//! by [`super::wire::LeanConn::send_parts`] (`writev`). The client library would copy
//! every byte into a command, a pipeline and a frame: three copies of each body, the
//! largest cost of a 100 KB submission.

use super::command::{arg, header};
use std::borrow::Cow;

/// A command whose one large argument is written in place: the RESP bytes before it
/// (ending with its bulk header), the argument, the bytes after it.
pub(crate) struct Framed<'a> {
    head: Vec<u8>,
    value: &'a [u8],
    tail: Cow<'static, [u8]>,
}

/// Bytes of `args` as bulk strings (at most: headers counted at their widest).
fn encoded_len(args: &[&[u8]]) -> usize {
    args.iter().map(|a| a.len() + 16).sum()
}

impl<'a> Framed<'a> {
    /// The command `before... value after...`.
    pub(crate) fn new(before: &[&[u8]], value: &'a [u8], after: &[&[u8]]) -> Framed<'a> {
        let mut head = Vec::with_capacity(32 + encoded_len(before));
        header(&mut head, b'*', before.len() + 1 + after.len());
        for a in before {
            arg(&mut head, a);
        }
        header(&mut head, b'$', value.len());
        let tail = if after.is_empty() {
            Cow::Borrowed(&b"\r\n"[..])
        } else {
            let mut tail = Vec::with_capacity(2 + encoded_len(after));
            tail.extend_from_slice(b"\r\n");
            for a in after {
                arg(&mut tail, a);
            }
            Cow::Owned(tail)
        };
        Framed { head, value, tail }
    }

    /// A command whose last argument is `value`, the ones before it written already, in
    /// `head` (the array's header first, counting `value`).
    pub(crate) fn ending_with(mut head: Vec<u8>, value: &'a [u8]) -> Framed<'a> {
        header(&mut head, b'$', value.len());
        Framed {
            head,
            value,
            tail: Cow::Borrowed(&b"\r\n"[..]),
        }
    }

    /// Its three pieces, in order, for one write.
    pub(crate) fn parts(&self) -> [&[u8]; 3] {
        [&self.head, self.value, &self.tail]
    }
}

/// Pieces of one write, small ones copied together: a piece under [`JOIN_BELOW`] bytes
/// goes into a buffer with its small neighbours, a larger one is written from where it
/// lies. A batch of small commands is then one buffer and one `write` (not three
/// `iovec`s per command, 64 to a `writev`), and a batch of large bodies keeps them
/// uncopied.
pub(crate) struct Joined<'a> {
    buf: Vec<u8>,
    /// Each piece: a range of `buf`, or a large piece as it is.
    pieces: Vec<Result<std::ops::Range<usize>, &'a [u8]>>,
}

/// Pieces shorter than this are copied into [`Joined`]'s buffer.
pub(crate) const JOIN_BELOW: usize = 4096;

impl<'a> Joined<'a> {
    pub(crate) fn new(parts: impl IntoIterator<Item = &'a [u8]>) -> Joined<'a> {
        let mut j = Joined {
            buf: Vec::new(),
            pieces: Vec::new(),
        };
        for p in parts {
            if p.is_empty() {
                continue;
            }
            if p.len() >= JOIN_BELOW {
                j.pieces.push(Err(p));
                continue;
            }
            let start = j.buf.len();
            j.buf.extend_from_slice(p);
            match j.pieces.last_mut() {
                Some(Ok(r)) if r.end == start => r.end = j.buf.len(),
                _ => j.pieces.push(Ok(start..j.buf.len())),
            }
        }
        j
    }

    /// The pieces to write, in order.
    pub(crate) fn parts(&self) -> Vec<&[u8]> {
        self.pieces
            .iter()
            .map(|p| match p {
                Ok(r) => &self.buf[r.clone()],
                Err(large) => *large,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(f: &Framed<'_>) -> Vec<u8> {
        f.parts().concat()
    }

    #[test]
    fn a_framed_command_is_the_client_library_encoding() {
        let value = vec![7u8; 100_000];
        let set = Framed::new(&[b"SET", b"k"], &value, &[b"PX", b"123"]);
        let theirs = redis::cmd("SET")
            .arg("k")
            .arg(&value)
            .arg("PX")
            .arg(123)
            .get_packed_command();
        assert_eq!(joined(&set), theirs);
        let last = Framed::new(&[b"XADD", b"s", b"*", b"body"], b"", &[]);
        let long = vec![b'y'; 1234567];
        let many: Vec<&[u8]> = std::iter::repeat_n(&b"a"[..], 10).collect();
        let odd = Framed::new(&many, &long, &[b"0", b"9"]);
        let mut c = redis::cmd("a");
        for _ in 1..10 {
            c.arg("a");
        }
        assert_eq!(
            joined(&odd),
            c.arg(&long).arg("0").arg("9").get_packed_command()
        );
        let theirs = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("body")
            .arg("")
            .get_packed_command();
        assert_eq!(joined(&last), theirs);
        for value in [&b""[..], b"v", &long] {
            let mut head = Vec::new();
            header(&mut head, b'*', 4);
            for a in [&b"XADD"[..], b"s", b"*"] {
                arg(&mut head, a);
            }
            let theirs = redis::cmd("XADD")
                .arg("s")
                .arg("*")
                .arg(value)
                .get_packed_command();
            assert_eq!(joined(&Framed::ending_with(head, value)), theirs);
        }
    }

    #[test]
    fn small_pieces_are_joined_and_large_ones_written_where_they_lie() {
        let large = vec![1u8; JOIN_BELOW];
        let small: Vec<Framed<'_>> = (0..3)
            .map(|_| Framed::new(&[b"XADD", b"s", b"*", b"body"], b"tiny", &[]))
            .collect();
        let big = Framed::new(&[b"SET", b"k"], &large, &[b"PX", b"10"]);
        let all: Vec<&[u8]> = small
            .iter()
            .chain([&big])
            .chain(&small)
            .flat_map(|f| f.parts())
            .collect();
        let j = Joined::new(all.iter().copied());
        let parts = j.parts();
        // The small commands and the SET's head in one piece, the body as it lies, then
        // the SET's tail with the small commands after it.
        assert_eq!(parts.len(), 3);
        assert!(std::ptr::eq(parts[1], large.as_slice()));
        assert_eq!(parts.concat(), all.concat());
        assert!(Joined::new([&b""[..]]).parts().is_empty());
    }
}
