//! Nitro's producer, as raw commands (see the module docs).

use super::{connect, error_key, result_key};
use std::collections::HashMap;
use std::time::{Duration, Instant};

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
