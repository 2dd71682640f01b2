//! The sequential-latency floor of pelican's Redis protocol on this machine: the same
//! commands and scripts as the library, sent by two minimal single-threaded processes on
//! blocking sockets (no async runtime, no client library), so whatever the library adds
//! on top shows as the difference.
//!
//! `floor worker PORT QUEUE` in one process, then `floor producer PORT QUEUE N [nodedup]`
//! in another: prints p50/p90/p99 of N sequential round trips. Loopback only.
//!
//! The producer submits on one socket and keeps a blocking `XREAD` of its reply stream
//! on a second one, as the library does; the worker keeps a blocking `XREADGROUP` on one
//! socket, re-issues it as soon as an entry arrives, and completes on another. Keys and
//! group are the library's (prefix `pelican`), and the worker answers as the benchmark's
//! does, so either side can be paired with the library's side from the `throughput`
//! example to see which side adds what.
//!
//! A development probe, not a user example (those are in `crates/pelican/examples`); it
//! lives with the benchmark. It sends the library's own Lua files, read from
//! `crates/pelican/lua` at build time, and names keys through `pelican::admin::Keys`.
//! Build: `cargo build --release -p pelican-cli --example floor` (BENCHMARKS.md).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const LIB: &str = include_str!("../../pelican/lua/lib.lua");
const SUBMIT: &str = include_str!("../../pelican/lua/submit.lua");
const COMPLETE: &str = include_str!("../../pelican/lua/complete.lua");

/// A RESP value, as much of it as this probe needs.
#[derive(Debug)]
enum V {
    Str(Vec<u8>),
    Int(i64),
    Nil,
    Arr(Vec<V>),
    Err(#[allow(dead_code)] String),
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&b).unwrap();
    }

    fn read(&mut self) -> V {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line).unwrap();
        let body = &line[1..line.len() - 2];
        let n = || std::str::from_utf8(body).unwrap().parse::<i64>().unwrap();
        match line[0] {
            b'+' => V::Str(body.to_vec()),
            b'-' => V::Err(String::from_utf8_lossy(body).into_owned()),
            b':' => V::Int(n()),
            b'$' if n() < 0 => V::Nil,
            b'$' => {
                let mut v = vec![0; n() as usize + 2];
                std::io::Read::read_exact(&mut self.r, &mut v).unwrap();
                v.truncate(v.len() - 2);
                V::Str(v)
            }
            b'*' if n() < 0 => V::Nil,
            b'*' => V::Arr((0..n()).map(|_| self.read()).collect()),
            t => panic!("unexpected reply type {}", t as char),
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> V {
        self.send(args);
        self.read()
    }
}

fn s(v: &V) -> Vec<u8> {
    match v {
        V::Str(b) => b.clone(),
        V::Int(i) => i.to_string().into_bytes(),
        _ => panic!("not a string: {v:?}"),
    }
}

fn arr(v: &V) -> &[V] {
    match v {
        V::Arr(a) => a,
        _ => panic!("not an array: {v:?}"),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Loads `lib.lua` and `body` as a function library of the probe's own, as the library
/// loads its scripts (`crates/pelican/src/protocol/scripts/library.rs`), and returns the
/// function's name, for `FCALL`.
fn load(c: &mut Conn, script: &str, body: &str) -> Vec<u8> {
    let name = format!("pelican_floor_{script}");
    let code = format!(
        "#!lua name={name}\n{LIB}\nredis.register_function('{name}', function(KEYS, ARGV)\n\
         begin_call()\n{body}\nend)\n"
    );
    c.call(&[b"FUNCTION", b"LOAD", b"REPLACE", code.as_bytes()]);
    name.into_bytes()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args[2].parse().unwrap();
    let q = &args[3];
    let keys = pelican::admin::Keys::new("pelican", q);
    let stream = keys.stream();
    // The scripts take the prefixes and append the request or producer id themselves.
    let reqp = keys.req("");
    let replyp = keys.reply("");
    let group = keys.group().as_bytes();
    let mut a = Conn::open(port);
    let mut b = Conn::open(port);
    let _ = a.call(&[
        b"XGROUP",
        b"CREATE",
        stream.as_bytes(),
        group,
        b"0",
        b"MKSTREAM",
    ]);
    match args[1].as_str() {
        "worker" => {
            let complete = load(&mut a, "complete", COMPLETE);
            let read = |c: &mut Conn| {
                c.send(&[
                    b"XREADGROUP",
                    b"GROUP",
                    group,
                    b"w",
                    b"COUNT",
                    b"1",
                    b"BLOCK",
                    b"0",
                    b"STREAMS",
                    stream.as_bytes(),
                    b">",
                ])
            };
            read(&mut b);
            loop {
                let v = b.read();
                read(&mut b);
                let streams = arr(&v);
                let entry = &arr(&arr(&streams[0])[1])[0];
                let sid = s(&arr(entry)[0]);
                let f = arr(&arr(entry)[1]);
                let field = |name: &[u8]| {
                    (0..f.len())
                        .step_by(2)
                        .find(|&i| s(&f[i]) == name)
                        .map(|i| s(&f[i + 1]))
                        .unwrap_or_default()
                };
                // the answer the library's benchmark worker gives: {"i": N, "ok": true}
                let body = field(b"body");
                let text = String::from_utf8_lossy(&body);
                let i: String = text
                    .split("\"i\":")
                    .nth(1)
                    .unwrap_or("0")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let outcome = format!("O{{\"i\":{i},\"ok\":true}}").into_bytes();
                // the entry's head: `<rid>;<from>;<deadline>;<at>;<index>`
                let head = String::from_utf8(field(b"head")).unwrap_or_default();
                let h = pelican::admin::EntryHead::parse(&head).expect("a head of five parts");
                // complete.lua's flags: the index flag, "t" (a small entry), "-" (no
                // stored answer)
                let flags = format!("{}t-", h.index);
                let now = now_ms().to_string();
                let _ = a.call(&[
                    b"FCALL",
                    &complete,
                    b"3",
                    stream.as_bytes(),
                    reqp.as_bytes(),
                    replyp.as_bytes(),
                    group,
                    b"300000",
                    b"1000",
                    now.as_bytes(),
                    &sid,
                    h.rid.as_bytes(),
                    h.from.as_bytes(),
                    h.deadline.as_bytes(),
                    flags.as_bytes(),
                    &outcome,
                ]);
            }
        }
        _ => {
            let n: usize = args[4].parse().unwrap();
            let dedup = args.get(5).map(|x| x != "nodedup").unwrap_or(true);
            let submit = load(&mut a, "submit", SUBMIT);
            let me = format!("p{}", std::process::id());
            let reply = format!("{replyp}{me}");
            let salt = now_ms();
            // the reply stream must exist: outcomes are pushed with NOMKSTREAM
            let mut last = s(&a.call(&[b"XADD", reply.as_bytes(), b"*", b"floor", b"created"]));
            let xread = |c: &mut Conn, last: &[u8]| {
                c.send(&[
                    b"XREAD",
                    b"COUNT",
                    b"100",
                    b"BLOCK",
                    b"0",
                    b"STREAMS",
                    reply.as_bytes(),
                    last,
                ])
            };
            xread(&mut b, &last);
            let mut lat = Vec::with_capacity(n);
            for i in 0..n {
                let body = format!("{{\"i\":{i},\"data\":\"{salt}{}\"}}", "x".repeat(64));
                let rid = format!("{salt}-{i}");
                let now = now_ms();
                let (now_s, dl, ttl) = (
                    now.to_string(),
                    (now + 30_000).to_string(),
                    (330_000).to_string(),
                );
                let t0 = Instant::now();
                if dedup {
                    let _ = a.call(&[
                        b"FCALL",
                        &submit,
                        b"3",
                        stream.as_bytes(),
                        reqp.as_bytes(),
                        replyp.as_bytes(),
                        now_s.as_bytes(),
                        me.as_bytes(),
                        group,
                        b"300000",
                        b"1000",
                        rid.as_bytes(),
                        dl.as_bytes(),
                        ttl.as_bytes(),
                        b"",
                        b"",
                        body.as_bytes(),
                    ]);
                } else {
                    let _ = a.call(&[
                        b"XADD",
                        stream.as_bytes(),
                        b"*",
                        b"head",
                        format!("{rid};{me};{dl};{now_s};0").as_bytes(),
                        b"body",
                        body.as_bytes(),
                    ]);
                }
                // wait for this request's outcome on the reply stream
                'wait: loop {
                    let v = b.read();
                    let entries = arr(&arr(&arr(&v)[0])[1]);
                    let mut done = false;
                    for e in entries {
                        last = s(&arr(e)[0]);
                        if arr(&arr(e)[1]).iter().any(|x| s(x) == rid.as_bytes()) {
                            done = true;
                        }
                    }
                    xread(&mut b, &last);
                    if done {
                        break 'wait;
                    }
                }
                lat.push(t0.elapsed().as_micros() as u64);
            }
            lat.sort_unstable();
            let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
            println!(
                "floor {} n={n}: p50 {}us p90 {}us p99 {}us",
                if dedup { "dedup" } else { "nodedup" },
                p(0.5),
                p(0.9),
                p(0.99)
            );
        }
    }
}
