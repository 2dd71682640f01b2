//! Nitro's consumer, as raw commands, with its heartbeat threads (see the module docs).

use super::{connect, decrement_id, error_key, result_key, str_of, uuid_v4, RESPONSE_TTL_SECS};
use redis::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
        let _: Value = self
            .xclaim(id)
            .arg("IDLE")
            .arg(self.idle_ms())
            .query(&mut self.conn)
            .expect("XCLAIM IDLE");
    }

    /// `XCLAIM s s <me> 0 <id>`: the options go after it.
    fn xclaim(&self, id: &str) -> redis::Cmd {
        let mut c = redis::cmd("XCLAIM");
        c.arg(&self.stream)
            .arg(&self.stream)
            .arg(&self.name)
            .arg(0)
            .arg(id);
        c
    }

    /// Takes entry `id` whoever holds it, as Nitro's heartbeat does after a stall
    /// (`XCLAIM s s <me> 0 <id> JUSTID`), and starts beating it.
    pub fn steal(&mut self, id: &str) {
        let _: Value = self
            .xclaim(id)
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
