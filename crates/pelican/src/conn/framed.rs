//! Commands whose one large argument is written from where it lies: the SETs of stored
//! bodies and answers, and XADDs of large bodies without dedup, sent on a lean connection
//! by [`super::wire::LeanConn::send_parts`] (`writev`). The client library would copy
//! every byte into a command, a pipeline and a frame: three copies of each body, the
//! largest cost of a 100 KB submission.

use super::wire::bulk_header;

/// A command whose one large argument is written in place: the RESP bytes before it
/// (ending with its bulk header), the argument, the bytes after it.
pub(crate) struct Framed<'a> {
    head: Vec<u8>,
    value: &'a [u8],
    tail: Vec<u8>,
}

impl<'a> Framed<'a> {
    /// The command `before... value after...`.
    pub(crate) fn new(before: &[&[u8]], value: &'a [u8], after: &[&[u8]]) -> Framed<'a> {
        let arg = |out: &mut Vec<u8>, a: &[u8]| {
            out.extend_from_slice(&bulk_header(a.len()));
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        };
        let mut head = format!("*{}\r\n", before.len() + 1 + after.len()).into_bytes();
        for a in before {
            arg(&mut head, a);
        }
        head.extend_from_slice(&bulk_header(value.len()));
        let mut tail = b"\r\n".to_vec();
        for a in after {
            arg(&mut tail, a);
        }
        Framed { head, value, tail }
    }

    /// Its three pieces, in order, for one write.
    pub(crate) fn parts(&self) -> [&[u8]; 3] {
        [&self.head, self.value, &self.tail]
    }
}

/// One value to store by a plain `SET <key> <body> PX <ttl_ms>` (a stored request body or
/// answer).
pub(crate) struct StoredBody<'a> {
    pub(crate) key: String,
    pub(crate) body: &'a [u8],
    pub(crate) ttl_ms: u64,
}

impl StoredBody<'_> {
    /// The SET, its body written in place.
    pub(crate) fn framed(&self) -> Framed<'_> {
        let ttl = self.ttl_ms.to_string();
        Framed::new(
            &[b"SET", self.key.as_bytes()],
            self.body,
            &[b"PX", ttl.as_bytes()],
        )
    }

    /// The SET as the client library sends it (connections that are not lean ones).
    pub(crate) fn cmd(&self) -> redis::Cmd {
        let mut c = redis::cmd("SET");
        c.arg(&self.key).arg(self.body).arg("PX").arg(self.ttl_ms);
        c
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
        let set = StoredBody {
            key: "k".into(),
            body: &value,
            ttl_ms: 123,
        };
        assert_eq!(joined(&set.framed()), set.cmd().get_packed_command());
        let last = Framed::new(&[b"XADD", b"s", b"*", b"body"], b"", &[]);
        let theirs = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("body")
            .arg("")
            .get_packed_command();
        assert_eq!(joined(&last), theirs);
    }
}
