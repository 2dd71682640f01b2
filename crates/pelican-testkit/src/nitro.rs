//! A client of Nitro's `pubsub` wire format, written from the captured traces as raw
//! Redis commands: what Nitro's Go producer and consumer send, byte for byte in the
//! command names and arguments. Tests use it to stand in for Nitro's own processes.
//!
//! Producer: `XGROUP CREATE s s $ MKSTREAM`, `XADD s * msg <json>`, then per poll
//! `GET error-key:<s>.<id>.error`, `GET result-key:<s>.<id>`, `DEL` of the key found.
//! Consumer: `XPENDING s s IDLE <idletime> - + 50`, then `XAUTOCLAIM s s <me> <idletime>
//! <id-1> COUNT 1` of one candidate, else `XREADGROUP GROUP s <me> COUNT 1 BLOCK 1
//! STREAMS s >`; a heartbeat thread per message sending `XCLAIM s s <me> 0 <id> JUSTID`
//! every idletime / 2; answers `SET <key> <value> EX <ttl> NX`, `XACK`, `XDEL`, stopping
//! before XACK when the key exists (Nitro's `ErrAlreadySet`); a graceful hand-back
//! `XCLAIM s s <me> 0 <id> IDLE <idletime>`.
//!
//! Everything is synchronous (a blocking connection, a thread per heartbeat), usable
//! from plain tests and, on a multi-threaded runtime, from async ones.

use redis::Value;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Nitro's `response-entry-timeout` default, as `SET ... EX`.
pub const RESPONSE_TTL_SECS: u64 = 3600;

/// The result key of entry `id` of stream `stream`.
pub fn result_key(stream: &str, id: &str) -> String {
    format!("result-key:{stream}.{id}")
}

/// The error key of entry `id` of stream `stream`.
pub fn error_key(stream: &str, id: &str) -> String {
    format!("error-key:{stream}.{id}.error")
}

/// Nitro's `decrementMsgIdByOne`: `T-(S-1)`, or `(T-1)-18446744073709551615` when S = 0,
/// or `0`.
pub fn decrement_id(id: &str) -> String {
    let Some((t, s)) = id.split_once('-') else {
        return "0".into();
    };
    let (Ok(t), Ok(s)) = (t.parse::<u64>(), s.parse::<u64>()) else {
        return "0".into();
    };
    if s > 0 {
        format!("{t}-{}", s - 1)
    } else if t > 0 {
        format!("{}-{}", t - 1, u64::MAX)
    } else {
        "0".into()
    }
}

/// A version-4 UUID string, as `uuid.NewString()` makes Nitro's consumer names.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    for chunk in b.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("nitro client: redis url")
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("nitro client: connect")
}

/// What a Nitro producer's poll found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The result key's JSON.
    Result(String),
    /// The error key's text.
    Error(String),
}

/// Nitro's producer, as raw commands.
pub struct NitroProducer {
    conn: redis::Connection,
    stream: String,
}

impl NitroProducer {
    /// Connects and creates stream and group (`XGROUP CREATE s s $ MKSTREAM`; BUSYGROUP
    /// ignored, as Nitro does when the stream then exists).
    pub fn new(url: &str, stream: &str) -> NitroProducer {
        let mut conn = connect(url);
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(stream)
            .arg("$")
            .arg("MKSTREAM")
            .query(&mut conn);
        if let Err(e) = r {
            assert_eq!(e.code(), Some("BUSYGROUP"), "XGROUP CREATE: {e}");
        }
        NitroProducer {
            conn,
            stream: stream.to_string(),
        }
    }

    /// `XADD <s> * msg <json>`: the request id.
    pub fn produce(&mut self, json: &str) -> String {
        redis::cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg("msg")
            .arg(json)
            .query(&mut self.conn)
            .expect("XADD")
    }

    /// One poll of one request: `GET` the error key, then the result key; the key found
    /// is deleted. The error wins.
    pub fn check(&mut self, id: &str) -> Option<Answer> {
        let ek = error_key(&self.stream, id);
        let err: Option<String> = redis::cmd("GET")
            .arg(&ek)
            .query(&mut self.conn)
            .expect("GET");
        if let Some(text) = err {
            let _: i64 = redis::cmd("DEL")
                .arg(&ek)
                .query(&mut self.conn)
                .expect("DEL");
            return Some(Answer::Error(text));
        }
        let rk = result_key(&self.stream, id);
        let res: Option<String> = redis::cmd("GET")
            .arg(&rk)
            .query(&mut self.conn)
            .expect("GET");
        let res = res?;
        let _: i64 = redis::cmd("DEL")
            .arg(&rk)
            .query(&mut self.conn)
            .expect("DEL");
        Some(Answer::Result(res))
    }

    /// Polls every 5 ms (Nitro's test `check-result-interval`) until answered; panics
    /// after `timeout`.
    pub fn await_answer(&mut self, id: &str, timeout: Duration) -> Answer {
        let start = Instant::now();
        loop {
            if let Some(a) = self.check(id) {
                return a;
            }
            assert!(
                start.elapsed() < timeout,
                "no answer to entry {id} of {} within {timeout:?}",
                self.stream
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Awaits every id, in any order; answers by id.
    pub fn await_all(&mut self, ids: &[String], timeout: Duration) -> HashMap<String, Answer> {
        let start = Instant::now();
        let mut out = HashMap::new();
        while out.len() < ids.len() {
            for id in ids {
                if !out.contains_key(id) {
                    if let Some(a) = self.check(id) {
                        out.insert(id.clone(), a);
                    }
                }
            }
            assert!(
                start.elapsed() < timeout,
                "{} of {} requests on {} unanswered after {timeout:?}",
                ids.len() - out.len(),
                ids.len(),
                self.stream
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        out
    }
}

/// A message a Nitro consumer got: the entry id and its `msg` field (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The entry id (the request id).
    pub id: String,
    /// The `msg` field.
    pub msg: Option<String>,
}

/// Nitro's consumer, as raw commands, with its heartbeat threads.
pub struct NitroConsumer {
    url: String,
    conn: redis::Connection,
    stream: String,
    name: String,
    idletime: Duration,
    heartbeats: HashMap<String, (Arc<AtomicBool>, JoinHandle<()>)>,
}

impl NitroConsumer {
    /// A consumer named by a fresh UUID, with `idletime-to-autoclaim` = `idletime`.
    pub fn new(url: &str, stream: &str, idletime: Duration) -> NitroConsumer {
        NitroConsumer {
            url: url.to_string(),
            conn: connect(url),
            stream: stream.to_string(),
            name: uuid_v4(),
            idletime,
            heartbeats: HashMap::new(),
        }
    }

    /// Its name in the group.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn idle_ms(&self) -> u64 {
        self.idletime.as_millis() as u64
    }

    /// One `Consume` call (retry on): an idle entry through XPENDING IDLE + XAUTOCLAIM
    /// (the first candidate; Nitro picks one at random), else XREADGROUP COUNT 1 BLOCK 1.
    /// Starts the message's heartbeat.
    pub fn consume(&mut self) -> Option<Message> {
        let m = self.claim_idle().or_else(|| self.read_new())?;
        self.start_heartbeat(&m.id);
        Some(m)
    }

    fn claim_idle(&mut self) -> Option<Message> {
        let pend: Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg("IDLE")
            .arg(self.idle_ms())
            .arg("-")
            .arg("+")
            .arg(50)
            .query(&mut self.conn)
            .ok()?;
        let Value::Array(pend) = pend else {
            return None;
        };
        let first = pend.first()?;
        let Value::Array(rec) = first else {
            return None;
        };
        let id = str_of(rec.first()?)?;
        let claimed: redis::RedisResult<Value> = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg(&self.name)
            .arg(self.idle_ms())
            .arg(decrement_id(&id))
            .arg("COUNT")
            .arg(1)
            .query(&mut self.conn);
        let Ok(Value::Array(parts)) = claimed else {
            return None;
        };
        entries(parts.get(1)?).into_iter().next()
    }

    fn read_new(&mut self) -> Option<Message> {
        let v: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.stream)
            .arg(&self.name)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(1)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query(&mut self.conn)
            .ok()?;
        let Value::Array(streams) = v else {
            return None;
        };
        let Value::Array(s) = streams.first()? else {
            return None;
        };
        entries(s.get(1)?).into_iter().next()
    }

    fn start_heartbeat(&mut self, id: &str) {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, stream, name, id2) = (
            self.url.clone(),
            self.stream.clone(),
            self.name.clone(),
            id.to_string(),
        );
        let every = self.idletime / 2;
        let s2 = stop.clone();
        let h = std::thread::spawn(move || {
            let mut conn = connect(&url);
            while !s2.load(Ordering::SeqCst) {
                let _: redis::RedisResult<Value> = redis::cmd("XCLAIM")
                    .arg(&stream)
                    .arg(&stream)
                    .arg(&name)
                    .arg(0)
                    .arg(&id2)
                    .arg("JUSTID")
                    .query(&mut conn);
                let until = Instant::now() + every;
                while Instant::now() < until && !s2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        self.heartbeats.insert(id.to_string(), (stop, h));
    }

    /// `msg.Ack()`: stops the heartbeat (sends nothing to Redis).
    pub fn ack(&mut self, id: &str) {
        if let Some((stop, h)) = self.heartbeats.remove(id) {
            stop.store(true, Ordering::SeqCst);
            let _ = h.join();
        }
    }

    /// `SetResult`: `SET result-key NX EX`, then XACK and XDEL; `false` (Nitro's
    /// `ErrAlreadySet`) when the key existed, and then neither XACK nor XDEL is sent.
    pub fn set_result(&mut self, id: &str, json: &str) -> bool {
        let key = result_key(&self.stream, id);
        self.answer(id, &key, json)
    }

    /// `SetError`: the same with the error key and plain text.
    pub fn set_error(&mut self, id: &str, text: &str) -> bool {
        let key = error_key(&self.stream, id);
        self.answer(id, &key, text)
    }

    fn answer(&mut self, id: &str, key: &str, value: &str) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("EX")
            .arg(RESPONSE_TTL_SECS)
            .arg("NX")
            .query(&mut self.conn)
            .expect("SET");
        if set.is_none() {
            return false;
        }
        let _: i64 = redis::cmd("XACK")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg(id)
            .query(&mut self.conn)
            .expect("XACK");
        let _: i64 = redis::cmd("XDEL")
            .arg(&self.stream)
            .arg(id)
            .query(&mut self.conn)
            .expect("XDEL");
        true
    }

    /// A graceful stop's hand-back: `XCLAIM s s <me> 0 <id> IDLE <idletime>` (counts a
    /// delivery, as Nitro's does); stops the heartbeat first.
    pub fn hand_back(&mut self, id: &str) {
        self.ack(id);
        let _: Value = redis::cmd("XCLAIM")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg(&self.name)
            .arg(0)
            .arg(id)
            .arg("IDLE")
            .arg(self.idle_ms())
            .query(&mut self.conn)
            .expect("XCLAIM IDLE");
    }

    /// Takes entry `id` whoever holds it, as Nitro's heartbeat does after a stall
    /// (`XCLAIM s s <me> 0 <id> JUSTID`), and starts beating it.
    pub fn steal(&mut self, id: &str) {
        let _: Value = redis::cmd("XCLAIM")
            .arg(&self.stream)
            .arg(&self.stream)
            .arg(&self.name)
            .arg(0)
            .arg(id)
            .arg("JUSTID")
            .query(&mut self.conn)
            .expect("XCLAIM JUSTID");
        self.start_heartbeat(id);
    }

    /// Serves messages with `handler` (JSON in; `Ok` result JSON, `Err` error text) until
    /// `stop` is set, as Nitro's valnode loop does: Set* then Ack; sleeps 1 ms instead of
    /// valnode's 1 s when there is nothing. Returns the ids it answered.
    pub fn serve(
        &mut self,
        stop: &AtomicBool,
        mut handler: impl FnMut(&str) -> Result<String, String>,
    ) -> Vec<String> {
        let mut served = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let Some(m) = self.consume() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let answered = match m.msg.as_deref().map(&mut handler) {
                Some(Ok(json)) => self.set_result(&m.id, &json),
                Some(Err(text)) => self.set_error(&m.id, &text),
                None => false,
            };
            self.ack(&m.id);
            if answered {
                served.push(m.id);
            }
        }
        served
    }
}

impl Drop for NitroConsumer {
    fn drop(&mut self) {
        for (_, (stop, h)) in self.heartbeats.drain() {
            stop.store(true, Ordering::SeqCst);
            let _ = h.join();
        }
    }
}

fn str_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn entries(v: &Value) -> Vec<Message> {
    let Value::Array(es) = v else { return vec![] };
    es.iter()
        .filter_map(|e| {
            let Value::Array(parts) = e else { return None };
            let id = str_of(parts.first()?)?;
            let msg = match parts.get(1) {
                Some(Value::Array(f)) => f
                    .chunks(2)
                    .find(|kv| str_of(&kv[0]).as_deref() == Some("msg"))
                    .and_then(|kv| kv.get(1).and_then(str_of)),
                _ => None,
            };
            Some(Message { id, msg })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_decremented_as_nitro_does() {
        assert_eq!(
            decrement_id("1796067354580-0"),
            "1796067354579-18446744073709551615"
        );
        assert_eq!(decrement_id("1796067314245-3"), "1796067314245-2");
        assert_eq!(decrement_id("0-0"), "0");
        assert_eq!(decrement_id("junk"), "0");
    }

    #[test]
    fn names_are_uuid_v4() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(uuid_v4(), u);
    }
}
