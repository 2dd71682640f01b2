//! Commands encoded as RESP by hand, as their arguments are added: the script calls a
//! worker and a producer send many times a second. The client library's `Cmd` keeps
//! every argument apart and copies them all again into the bytes it sends; here each
//! argument is encoded once, into one buffer, which is copied once more behind the
//! array's header when the command is sent ([`Command::packed`]).

use redis::{RedisWrite, ToRedisArgs};

/// `n` in decimal at the end of a buffer, before `end` more bytes: the digits are
/// `.0[.1..LEN - end]`.
fn decimal<const LEN: usize>(mut n: u64, end: usize) -> ([u8; LEN], usize) {
    let mut out = [0u8; LEN];
    let mut at = LEN - end;
    loop {
        at -= 1;
        out[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    (out, at)
}

/// Appends the RESP header `<kind><n>\r\n` (an array's or a bulk string's), built on
/// the stack and appended at once. By hand: through `write!` the headers were a fifth of
/// a producer's instructions per request, and piece by piece (a copy each for the kind,
/// the digits and the CRLF) a tenth of a script call's.
pub(crate) fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    let (mut line, at) = decimal::<24>(n as u64, 2);
    line[22] = b'\r';
    line[23] = b'\n';
    line[at - 1] = kind;
    out.extend_from_slice(&line[at - 1..]);
}

/// Appends one bulk string argument.
pub(crate) fn arg(out: &mut Vec<u8>, a: &[u8]) {
    out.reserve(a.len() + 24);
    header(out, b'$', a.len());
    out.extend_from_slice(a);
    out.push(b'\r');
    out.push(b'\n');
}

/// Appends one bulk string argument made of `parts`, in order (no separator added).
pub(crate) fn joined_arg(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + 24);
    header(out, b'$', len);
    for p in parts {
        out.extend_from_slice(p);
    }
    out.push(b'\r');
    out.push(b'\n');
}

/// `n` in decimal, on the stack: the digits are `.0[.1..]`.
pub(crate) fn digits(n: u64) -> ([u8; 20], usize) {
    decimal::<20>(n, 0)
}

/// Bytes a [`Command`] has room for from the start: a script call of a few dozen
/// requests' arguments grows it only a few times.
const START_CAPACITY: usize = 2048;

/// A command being built: its arguments, each encoded as a bulk string as it is added;
/// the array header that counts them is written when the command is sent.
#[derive(Default)]
pub(crate) struct Command {
    args: Vec<u8>,
    count: usize,
}

impl Command {
    /// A command of these first arguments (its name first).
    pub(crate) fn new(first: &[&[u8]]) -> Command {
        let mut c = Command {
            args: Vec::with_capacity(START_CAPACITY),
            count: 0,
        };
        for a in first {
            c.write_arg(a);
        }
        c
    }

    /// Adds `a`, as the client library would (a number in decimal, a slice of strings
    /// as one argument each, ...).
    pub(crate) fn arg(&mut self, a: impl ToRedisArgs) -> &mut Self {
        a.write_redis_args(self);
        self
    }

    /// The whole command, as sent.
    pub(crate) fn packed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.args.len() + 16);
        header(&mut out, b'*', self.count);
        out.extend_from_slice(&self.args);
        out
    }

    /// Its arguments, in order.
    fn each_arg(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.args[..];
        std::iter::from_fn(move || {
            // `$<len>\r\n<bytes>\r\n`, as `arg` wrote it.
            let nl = rest.iter().position(|&b| b == b'\n')?;
            let len: usize = std::str::from_utf8(&rest[1..nl - 1]).ok()?.parse().ok()?;
            let (a, after) = rest[nl + 1..].split_at(len);
            rest = &after[2..];
            Some(a)
        })
    }

    /// The same command as the client library's, for its connections (TLS, Unix
    /// sockets, the shared connection).
    pub(crate) fn to_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::Cmd::new();
        for a in self.each_arg() {
            cmd.arg(a);
        }
        cmd
    }
}

impl RedisWrite for Command {
    fn write_arg(&mut self, a: &[u8]) {
        arg(&mut self.args, a);
        self.count += 1;
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        NextArg {
            command: self,
            bytes: Vec::new(),
        }
    }
}

/// An argument written in pieces ([`RedisWrite::writer_for_next_arg`]): its length comes
/// first on the wire, so it is added whole once written.
struct NextArg<'a> {
    command: &'a mut Command,
    bytes: Vec<u8>,
}

impl std::io::Write for NextArg<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for NextArg<'_> {
    fn drop(&mut self) {
        self.command.write_arg(&self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built by hand, a command is byte for byte the client library's, and turns back
    /// into it.
    #[test]
    fn a_command_is_the_client_library_encoding() {
        let long = vec![b'y'; 100_000];
        let mut ours = Command::new(&[b"EVALSHA", b"abc", b"2"]);
        ours.arg("k1")
            .arg(&["k2", "x"][..])
            .arg(u64::MAX)
            .arg(0usize)
            .arg(7u32);
        ours.arg("")
            .arg(&long[..])
            .arg(-12i64)
            .arg(String::from("s"));
        let mut theirs = redis::cmd("EVALSHA");
        theirs.arg("abc").arg("2").arg("k1").arg(&["k2", "x"][..]);
        theirs.arg(u64::MAX).arg(0usize).arg(7u32).arg("");
        theirs.arg(&long[..]).arg(-12i64).arg(String::from("s"));
        assert_eq!(ours.packed(), theirs.get_packed_command());
        assert_eq!(
            ours.to_cmd().get_packed_command(),
            theirs.get_packed_command()
        );
        let mut numbers = Vec::new();
        for n in [0, 9, 10, 1_796_207_331_130, u64::MAX] {
            let (d, at) = digits(n);
            // the digits in two pieces make one argument
            joined_arg(&mut numbers, &[&d[at..at + 1], &d[at + 1..]]);
        }
        let mut theirs = redis::Cmd::new();
        theirs
            .arg(0)
            .arg(9)
            .arg(10)
            .arg(1_796_207_331_130u64)
            .arg(u64::MAX);
        assert_eq!(numbers, theirs.get_packed_command()[4..]);
        let empty = Command::default();
        assert_eq!(empty.packed(), b"*0\r\n");
    }

    /// An argument written in pieces is one argument.
    #[test]
    fn an_argument_written_in_pieces_is_one() {
        use std::io::Write;
        let mut c = Command::new(&[b"SET", b"k"]);
        {
            let mut w = c.writer_for_next_arg();
            w.write_all(b"ab").unwrap();
            w.write_all(b"cd").unwrap();
        }
        let _ = c.writer_for_next_arg();
        assert_eq!(
            c.packed(),
            redis::cmd("SET")
                .arg("k")
                .arg("abcd")
                .arg("")
                .get_packed_command()
        );
    }
}
