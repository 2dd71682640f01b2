//! The JSON API under `/api/` that the page uses (documented in the README). Reads are
//! GETs; mutations are POSTs, checked by [`crate::http::Policy::mutation`], and are not
//! routed at all with `--read-only`. Every error is `{"error": {"kind", "message"}}`
//! (`crate::http::error`) with a status that says whose fault it is: 400 bad input,
//! 401/403 no token or foreign origin, 404 unknown queue, request or dead letter, 500
//! Redis refused, 503 Redis unreachable.

use super::reply;
use super::sampler::{self, ConsumerNow, PartitionNow, Point, QueueNow};
use super::App;
use crate::http::error::redis_error;
use crate::http::{parse, ApiError, Kind};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use pelican::admin::Keys;
use pelican::{Admin, ErrorKind};
use redis::Value;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Dead letters listed on the queue page.
pub const DEAD_SHOWN: usize = 100;
/// Least time between two SCANs for a queue name not seen yet.
const LOOKUP_EVERY: Duration = Duration::from_secs(2);
/// Held entries listed per partition on the queue page.
const HELD_SHOWN: usize = 100;
/// How long a request for a queue just found in Redis waits for its first sample.
const FIRST_SAMPLE_WAIT: Duration = Duration::from_secs(3);

type ApiResult<T> = Result<Json<T>, ApiError>;

/// `GET /api/info`: what the page needs to know about this dashboard.
pub async fn info(State(app): State<Arc<App>>, h: HeaderMap) -> Json<serde_json::Value> {
    Json(json!({
        "prefix": app.prefix,
        "redis": app.redis_shown,
        "read_only": app.read_only,
        "can_mutate": !app.read_only && app.policy.has_credentials(&h),
        "interval_ms": sampler::INTERVAL.as_millis() as u64,
        "history": sampler::HISTORY,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// One queue on the overview.
#[derive(Serialize)]
struct Overview<'a> {
    #[serde(flatten)]
    now: &'a QueueNow,
    history: Vec<&'a Point>,
}

/// `GET /api/queues`: every queue with its numbers and history.
pub async fn queues(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let b = app.board.read().expect("board lock");
    let queues: Vec<Overview> = b
        .queues
        .values()
        .map(|q| Overview {
            now: &q.now,
            history: q.history.iter().collect(),
        })
        .collect();
    Json(json!({
        "sampled_at_ms": b.sampled_at_ms,
        "error": b.error,
        "queues": queues,
    }))
}

/// A request a consumer holds.
#[derive(Debug, Serialize)]
struct Held {
    entry: String,
    rid: Option<String>,
    /// Since submission (Redis clock), ms.
    age_ms: u64,
    /// Since the last delivery or lease renewal, ms.
    idle_ms: u64,
    deliveries: u64,
    body_len: Option<usize>,
}

/// A consumer and what it holds.
#[derive(Serialize)]
struct ConsumerView<'a> {
    #[serde(flatten)]
    consumer: &'a ConsumerNow,
    held: Vec<Held>,
}

/// `GET /api/queues/{queue}`: numbers, history, partitions (each one's figures, and on a
/// cluster the master serving it), consumers with what each holds.
pub async fn queue(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> ApiResult<serde_json::Value> {
    app.known(&name).await?;
    let (now, history, parts, error, sampled_at_ms) = {
        let b = app.board.read().expect("board lock");
        let q = b.queues.get(&name);
        (
            q.map(|q| q.now.clone()),
            q.map(|q| q.history.iter().cloned().collect::<Vec<_>>()),
            q.map(|q| q.parts.clone()),
            b.error.clone(),
            b.sampled_at_ms,
        )
    };
    let Some(now) = now else {
        return Err(ApiError::new(
            Kind::NotFound,
            format!("queue {name:?} is gone from Redis"),
        ));
    };
    let parts = parts.unwrap_or_default();
    let mut held = held(&app, &parts)
        .await
        .map_err(|e| redis_error("reading what the consumers hold", &e))?;
    let consumers: Vec<ConsumerView> = parts
        .iter()
        .flat_map(|p| p.consumers.iter())
        .map(|c| ConsumerView {
            consumer: c,
            held: held
                .remove(&(c.partition.clone(), c.name.clone()))
                .unwrap_or_default(),
        })
        .collect();
    Ok(Json(json!({
        "queue": now,
        "history": history,
        "partitions": parts,
        "consumers": consumers,
        "error": error,
        "sampled_at_ms": sampled_at_ms,
    })))
}

type HeldMap = std::collections::HashMap<(String, String), Vec<Held>>;

/// What each consumer holds: `XPENDING` (extended) per partition, then each entry's rid.
async fn held(app: &App, parts: &[PartitionNow]) -> redis::RedisResult<HeldMap> {
    let mut conn = app.conn.clone();
    let mut out = HeldMap::new();
    for p in parts.iter().filter(|p| p.in_flight > 0) {
        let keys = Keys::new(&app.prefix, &p.tag);
        let (time, pending): ((u64, u64), Value) = redis::pipe()
            .cmd("TIME")
            .cmd("XPENDING")
            .arg(keys.stream())
            .arg(keys.group())
            .arg("-")
            .arg("+")
            .arg(HELD_SHOWN)
            .query_async(&mut conn)
            .await?;
        let now = time.0 * 1000 + time.1 / 1000;
        let rows: Vec<(String, String, u64, u64)> = reply::array(&pending)
            .iter()
            .filter_map(|e| {
                let a = reply::array(e);
                Some((
                    reply::string(a.first()?)?,
                    reply::string(a.get(1)?)?,
                    reply::int(a.get(2)?)?.max(0) as u64,
                    reply::int(a.get(3)?)?.max(0) as u64,
                ))
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let mut pipe = redis::pipe();
        for (id, ..) in &rows {
            pipe.cmd("XRANGE").arg(keys.stream()).arg(id).arg(id);
        }
        let entries: Vec<Value> = pipe.query_async(&mut conn).await?;
        for ((id, consumer, idle, deliveries), e) in rows.into_iter().zip(entries) {
            let fields = reply::array(&e)
                .first()
                .map(|e| reply::array(e).get(1).cloned().unwrap_or(Value::Nil));
            let get = |n: &str| fields.as_ref().and_then(|f| reply::field(f, n));
            out.entry((p.tag.clone(), consumer))
                .or_default()
                .push(Held {
                    age_ms: reply::id_ms(&id).map_or(0, |at| now.saturating_sub(at)),
                    // the head's request id (`rid` in the layout before it)
                    rid: match get(pelican::admin::HEAD_FIELD).and_then(reply::string) {
                        Some(h) => pelican::admin::EntryHead::parse(&h).map(|h| h.rid.to_string()),
                        None => get("rid").and_then(reply::string),
                    },
                    body_len: get("body").and_then(reply::bytes).map(<[u8]>::len),
                    entry: id,
                    idle_ms: idle,
                    deliveries,
                });
        }
    }
    Ok(out)
}

/// `GET /api/queues/{queue}/dead`: the count and the oldest dead letters.
pub async fn dead(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> ApiResult<serde_json::Value> {
    let letters = app
        .with_admin(&name, |a| async move { a.dead_letters(DEAD_SHOWN).await })
        .await?;
    let total = app
        .board
        .read()
        .expect("board lock")
        .queues
        .get(&name)
        .map_or(letters.len() as u64, |q| q.now.dead_letters);
    Ok(Json(json!({
        "total": total.max(letters.len() as u64),
        "shown": DEAD_SHOWN,
        "letters": letters,
    })))
}

/// `GET /api/queues/{queue}/requests/{rid}`: what `pelican inspect` shows.
pub async fn request(
    State(app): State<Arc<App>>,
    Path((name, rid)): Path<(String, String)>,
) -> ApiResult<pelican::admin::RequestInfo> {
    let found = app
        .with_admin(&name, |a| {
            let rid = rid.clone();
            async move { a.inspect(&rid).await }
        })
        .await;
    match found {
        Ok(Some(info)) => Ok(Json(info)),
        Ok(None) => Err(ApiError::new(
            Kind::NotFound,
            format!(
                "queue {name:?} knows no request {rid:?}: it was never submitted, finished \
                 more than result_ttl ago, expired, or was submitted with dedup off"
            ),
        )),
        Err(e) if e.kind == Kind::BadRequest => Err(ApiError::new(
            Kind::BadRequest,
            format!("{rid:?} is not a request id: {}", e.message),
        )),
        Err(e) => Err(e),
    }
}

/// `POST /api/queues/{queue}/dead/{id}/requeue`: one dead letter back on the queue.
pub async fn requeue(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<serde_json::Value> {
    app.policy.mutation(&h)?;
    check_dead_id(&id)?;
    let admin = app.admin(&name).await?;
    let done = admin
        .requeue(std::slice::from_ref(&id), app.requeue_timeout)
        .await
        .map_err(|e| app.failed(&name, &e))?;
    match done.into_iter().next().and_then(|(_, new)| new) {
        Some(entry) => {
            tracing::info!(queue = %name, id = %id, entry = %entry, "dashboard: requeued a dead letter");
            Ok(Json(json!({ "id": id, "entry": entry })))
        }
        None => Err(ApiError::new(
            Kind::NotFound,
            format!("queue {name:?} has no dead letter {id} (or it had no body to requeue)"),
        )),
    }
}

/// A dead-letter id as the list gives it: `<ms>-<seq>`, or `<partition>/<ms>-<seq>`, each
/// number within 64 bits (Redis refuses more, and that is bad input, not a Redis fault).
fn check_dead_id(id: &str) -> Result<(), ApiError> {
    let sid = match id.split_once('/') {
        Some((p, sid)) if parse::decimal_u64(p).is_some() => sid,
        Some(_) => "",
        None => id,
    };
    match parse::stream_id(sid) {
        Some(_) => Ok(()),
        None => Err(ApiError::new(
            Kind::BadRequest,
            format!(
                "{id:?} is not a dead-letter id; ids look like 1700000000000-0, or \
                 3/1700000000000-0 in a queue of several partitions (both numbers within 64 bits)"
            ),
        )),
    }
}

/// `POST /api/queues/{queue}/dead/requeue-all`.
pub async fn requeue_all(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<serde_json::Value> {
    app.policy.mutation(&h)?;
    let admin = app.admin(&name).await?;
    let n = admin
        .requeue_all(app.requeue_timeout)
        .await
        .map_err(|e| app.failed(&name, &e))?;
    tracing::info!(queue = %name, n, "dashboard: requeued every dead letter");
    Ok(Json(json!({ "requeued": n })))
}

/// `POST /api/queues/{queue}/dead/purge`: deletes every dead letter.
pub async fn purge(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<serde_json::Value> {
    app.policy.mutation(&h)?;
    let admin = app.admin(&name).await?;
    let n = admin
        .purge_dead()
        .await
        .map_err(|e| app.failed(&name, &e))?;
    tracing::info!(queue = %name, n, "dashboard: purged the dead letters");
    Ok(Json(json!({ "purged": n })))
}

impl App {
    /// The queue's admin handle, if the queue is known: made once per queue and again
    /// after a Redis outage (a connection made before it fails its first command).
    async fn admin(&self, name: &str) -> Result<Arc<Admin>, ApiError> {
        self.known(name).await?;
        let outages = self.board.read().expect("board lock").outages;
        let mut admins = self.admins.lock().await;
        if let Some((a, made_after)) = admins.get(name) {
            if *made_after == outages {
                return Ok(a.clone());
            }
        }
        let partitions = self
            .partitions(name)
            .await
            .map_err(|e| redis_error("reading the queue's partitions", &e))?;
        let cfg = self.queue_config(name)?.with_partitions(partitions);
        let admin = Arc::new(Admin::connect(cfg).await.map_err(ApiError::from)?);
        admins.insert(name.to_string(), (admin.clone(), outages));
        Ok(admin)
    }

    /// Runs a read on the queue's admin handle; a read that met a dropped connection
    /// (Redis restarted since the last command) is sent once more on a fresh one.
    async fn with_admin<T, F, Fut>(&self, name: &str, read: F) -> Result<T, ApiError>
    where
        F: Fn(Arc<Admin>) -> Fut,
        Fut: std::future::Future<Output = pelican::Result<T>>,
    {
        let admin = self.admin(name).await?;
        match read(admin).await {
            Ok(v) => Ok(v),
            Err(e) if dropped(&e) && self.board.read().expect("board lock").error.is_none() => {
                self.admins.lock().await.remove(name);
                let admin = self.admin(name).await?;
                read(admin).await.map_err(|e| self.failed(name, &e))
            }
            Err(e) => Err(self.failed(name, &e)),
        }
    }

    /// The answer to a library error met on queue `name`; a connection error drops its
    /// admin handle, so the next request connects afresh.
    fn failed(&self, name: &str, e: &pelican::Error) -> ApiError {
        if dropped(e) {
            if let Ok(mut admins) = self.admins.try_lock() {
                admins.remove(name);
            }
        }
        ApiError::from(e)
    }

    /// How many partitions the queue has: its record (`P:{Q}:partitions`), else the
    /// partition tags found (`Q#p`), else one.
    async fn partitions(&self, name: &str) -> redis::RedisResult<u32> {
        let mut conn = self.conn.clone();
        let recorded: Option<String> = redis::cmd("GET")
            .arg(Keys::new(&self.prefix, name).partitions())
            .query_async(&mut conn)
            .await?;
        if let Some((n, _)) = recorded.and_then(|v| pelican::PartitionLayout::parse_record(&v)) {
            return Ok(n.max(1));
        }
        let b = self.board.read().expect("board lock");
        let found = b
            .queues
            .get(name)
            .map_or(&[][..], |q| &q.now.partitions[..]);
        Ok(found
            .iter()
            .filter_map(|tag| {
                tag.split_once('#')?
                    .1
                    .split('~')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max()
            .map_or(1, |p| p + 1))
    }

    /// 400 for a name that cannot be a queue's.
    pub fn check_name(&self, name: &str) -> Result<(), ApiError> {
        self.queue_config(name).map(|_| ())
    }

    fn queue_config(&self, name: &str) -> Result<pelican::QueueConfig, ApiError> {
        pelican::QueueConfig::new(self.global.redis.as_str(), name)
            .with_prefix(self.prefix.clone())
            .validate()
            .map_err(|e| {
                ApiError::new(
                    Kind::BadRequest,
                    format!("{name:?} is not a queue name: {}", e.message()),
                )
            })?;
        let mut g = self.global.clone();
        g.queue = name.to_string();
        Ok(g.queue_config()
            .map_err(|e| ApiError::new(Kind::BadRequest, e.message))?
            .with_prefix(self.prefix.clone()))
    }

    /// Ok when the board has the queue, or it was just found in Redis and is sampled
    /// within [`FIRST_SAMPLE_WAIT`]; 404 for a queue not in Redis; 503 while Redis
    /// cannot be reached (at once when the last sample failed: a SCAN would only wait
    /// for the connection to time out).
    pub async fn known(&self, name: &str) -> Result<(), ApiError> {
        self.check_name(name)?;
        let down = {
            let b = self.board.read().expect("board lock");
            if b.queues.contains_key(name) {
                return Ok(());
            }
            b.error.clone()
        };
        if let Some(why) = down {
            return Err(ApiError::new(
                Kind::Unavailable,
                format!("cannot look for queue {name:?}: {why}"),
            ));
        }
        // At most one SCAN per interval for names nobody has seen: a page (or a script)
        // asking for many unknown queues must not scan the key space each time.
        let recent = {
            let mut last = self.last_lookup.lock().expect("lookup lock");
            let recent = last.is_some_and(|t| t.elapsed() < LOOKUP_EVERY);
            if !recent {
                *last = Some(Instant::now());
            }
            recent
        };
        let found = if recent {
            let b = self.board.read().expect("board lock");
            b.queues
                .iter()
                .map(|(n, q)| (n.clone(), q.now.partitions.iter().cloned().collect()))
                .collect()
        } else {
            let mut conn = self.conn.clone();
            sampler::discover_now(&mut conn, &self.prefix, &self.board)
                .await
                .map_err(|e| redis_error("looking for queues", &e))?
        };
        if found.contains_key(name) {
            // Just found: its first sample comes within the sampler's interval.
            let until = Instant::now() + FIRST_SAMPLE_WAIT;
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if self
                    .board
                    .read()
                    .expect("board lock")
                    .queues
                    .contains_key(name)
                {
                    return Ok(());
                }
            }
            return Err(ApiError::new(
                Kind::Unavailable,
                format!("queue {name:?} was found but could not be read from Redis yet"),
            ));
        }
        Err(ApiError::new(
            Kind::NotFound,
            format!(
                "no queue {name:?} under key prefix {:?} on {} (queues are found by their \
                 request or dead-letter stream); known: {}",
                self.prefix,
                self.redis_shown,
                if found.is_empty() {
                    "none".to_string()
                } else {
                    found.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ),
        ))
    }
}

/// Whether `e` is a connection that dropped (Redis restarted or went away since it was
/// made).
fn dropped(e: &pelican::Error) -> bool {
    e.kind() == ErrorKind::Redis
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<redis::RedisError>())
            .is_some_and(|r| r.is_connection_dropped() || r.is_io_error())
}
