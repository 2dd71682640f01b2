//! The command line: global options and one argument struct per subcommand.
//!
//! Scripts rely on these names and flags; add, never rename.

use crate::redis_url::RedisUrl;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;

/// The Redis URL used when neither `--redis` nor `REDIS_URL` says otherwise.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// `pelican`: request/response work queues on Redis Streams.
#[derive(Debug, Parser)]
#[command(
    name = "pelican",
    version,
    about = "Request/response work queues on Redis Streams",
    long_about = "Request/response work queues on Redis Streams: dedup, recovery of crashed \
                  workers' work, dead letters, pushed results.\n\n\
                  Start with `pelican demo`: it shows the whole system in one run (and starts a \
                  throwaway redis-server if none is running).",
    after_help = "Exit codes: 0 success, 2 usage or configuration error, 3 the request failed \
                  remotely, 4 timeout/expired/dead/cancelled, 1 anything else."
)]
pub struct Cli {
    /// Options every subcommand takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand takes (before or after the subcommand's name).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Redis URL: redis://[user:password@]host[:port][/db], rediss:// for TLS, or a
    /// cluster: redis+cluster://[user:password@]host:port[,host:port...]. List several
    /// seed nodes of a cluster: a process finds it only through them, and cannot start
    /// while the only one listed is down.
    #[arg(long = "redis", env = "REDIS_URL", default_value = DEFAULT_REDIS_URL, global = true, value_name = "URL")]
    pub redis: RedisUrl,
    /// Queue name: letters, digits and . _ - : (at most 128).
    #[arg(
        long,
        env = "PELICAN_QUEUE",
        default_value = "demo",
        global = true,
        value_name = "NAME"
    )]
    pub queue: String,
    /// For rediss:// URLs: trust the CA certificate(s) in this PEM file instead of the
    /// system's roots (a private CA).
    #[arg(
        long = "tls-ca",
        env = "PELICAN_TLS_CA",
        global = true,
        value_name = "FILE"
    )]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Whether this process's own connections over plain TCP (blocking reads, outcome
    /// writes, large bodies) are pelican's lean ones (true) or the Redis client library's
    /// (false: the path TLS and Unix sockets always take) [default: true].
    #[arg(
        long,
        env = "PELICAN_LEAN_CONNECTIONS",
        global = true,
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub lean_connections: Option<bool>,
    /// Print data as JSON (stats, dead letters, worker lines, the demo's summary).
    #[arg(long, global = true)]
    pub json: bool,
    /// More log output on stderr: -v info, -vv debug, -vvv trace (default: warnings;
    /// RUST_LOG=... takes any tracing filter when -v is not given).
    #[arg(short = 'v', action = clap::ArgAction::Count, global = true)]
    pub log: u8,
    /// How logs are written on stderr: text (coloured only on a terminal, and not with
    /// NO_COLOR set), or json: one object per line (timestamp, level, message, fields,
    /// target, spans) for log shippers, the command's own messages on stderr included.
    #[arg(
        long,
        env = "PELICAN_LOG_FORMAT",
        value_enum,
        default_value_t,
        global = true,
        value_name = "FORMAT"
    )]
    pub log_format: crate::logging::LogFormat,
    /// Export spans to this OpenTelemetry collector over OTLP/HTTP, e.g.
    /// http://127.0.0.1:4318 (needs a build with the `otel` feature): a request is one
    /// trace from `pelican call` through the worker.
    #[arg(long, env = "PELICAN_OTLP", global = true, value_name = "URL")]
    pub otlp: Option<String>,
    /// Queue-wide settings; every process of a queue should use the same values.
    #[command(flatten)]
    pub settings: QueueSettings,
}

/// Queue-wide settings (the library's `QueueConfig`); unset means the library's default.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Queue settings (the same for every process of a queue)")]
pub struct QueueSettings {
    /// How long a finished request's outcome stays cached for identical requests
    /// (and for producers that missed the push) [default: 300000].
    #[arg(long, global = true, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub result_ttl: Option<u64>,
    /// How long a handler's failure answers NEW submissions of the same request; 0: a
    /// new submission runs the request again (callers waiting while it ran all get the
    /// failure, and it stays recorded for --result-ttl either way); at most --result-ttl
    /// [default: 0].
    #[arg(long, global = true, value_name = "MS")]
    pub failure_ttl: Option<u64>,
    /// Largest request or response body accepted, in bytes; a larger entry met by a
    /// worker is dead-lettered [default: 4194304].
    #[arg(long, global = true, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=536_870_912))]
    pub max_body_bytes: Option<u64>,
    /// Most dead letters kept (older ones are trimmed, approximately) [default: 10000].
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub dead_maxlen: Option<u64>,
    /// A consumer that owns nothing and has been idle this long is removed from the
    /// group (a killed worker's name) [default: 3600000].
    #[arg(long, global = true, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub consumer_gc_after: Option<u64>,
    /// How many partitions (streams) the queue is split into, e.g. to spread it over the
    /// nodes of a Redis Cluster; the queue records it and refuses other values
    /// [default: 1].
    #[arg(long, global = true, env = "PELICAN_PARTITIONS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: Option<u32>,
    /// Where a queue of several partitions puts them in a Redis Cluster's slots: auto
    /// (the layout the queue has recorded; spread for a new queue), spread (each
    /// partition's hash tag chosen so the partitions spread evenly over the masters) or
    /// legacy (tags `Q#p`, where they happen to hash: queues created by builds before
    /// the spread layout). A process whose layout differs from the queue's is refused
    /// [default: auto].
    #[arg(long, global = true, env = "PELICAN_PARTITION_LAYOUT", value_name = "LAYOUT", value_parser = ["auto", "spread", "legacy"])]
    pub partition_layout: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the whole system in one run: producers with duplicates, worker processes, one
    /// killed and its work recovered, a poison request dead-lettered, a summary table.
    Demo(DemoArgs),
    /// Serve the queue until SIGINT/SIGTERM, then shut down gracefully.
    Worker(WorkerArgs),
    /// Submit one request and print the response JSON.
    Call(CallArgs),
    /// The queue at a glance.
    Stats,
    /// Inspect, requeue or drop dead letters.
    Dead(DeadArgs),
    /// One request: queued, in work (by whom, for how long, which delivery), or its
    /// cached outcome. Exits 1 when Redis knows nothing of it.
    Inspect(InspectArgs),
    /// Measure throughput and latency with the BullMQ peer benchmark's workload.
    ///
    /// One producer (this process) and --workers worker processes on a fresh queue
    /// (bench-<8 hex digits>; --queue is not used). Payload {"i": N, "data": "<64 x>"},
    /// answer {"i": N, "ok": true}, every answer checked. Warm-up (not measured),
    /// throughput (closed loop of --inflight lanes), latency (one request at a time).
    /// Needs a Redis on this machine (--redis, loopback only); the queue's keys are
    /// deleted at the end. With --json it prints one line of JSON.
    Bench(BenchArgs),
    /// A live web dashboard of every queue under the key prefix: numbers and charts,
    /// consumers, dead letters (requeue, purge), request lookup. Prints its address (with
    /// a login link that carries the token for the buttons) and serves until Ctrl-C. On a
    /// Redis Cluster (redis+cluster://) it finds the queues on every master and breaks
    /// each queue's numbers down by partition.
    Dashboard(DashboardArgs),
    /// Nitro's wire format (Arbitrum's Redis-streams pubsub): serve a stream Nitro's
    /// producers write (`worker`), send a request as they do (`call`), look at a stream
    /// (`stats`). --queue is not used; --stream names the stream.
    Nitro(NitroArgs),
    /// An HTTP gateway for callers in any language: `POST /v1/queues/{queue}/call` with
    /// the request as the body answers with the response (dedup, recovery, dead letters
    /// and deadlines as for any producer); `POST .../requests` and `GET
    /// .../requests/{id}` for callers that cannot hold a connection. One producer per
    /// queue, shared by every connection. --queue is not used.
    Gateway(GatewayArgs),
}

impl Command {
    /// The subcommand's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Demo(_) => "demo",
            Command::Worker(_) => "worker",
            Command::Call(_) => "call",
            Command::Stats => "stats",
            Command::Dead(_) => "dead",
            Command::Inspect(_) => "inspect",
            Command::Bench(_) => "bench",
            Command::Dashboard(_) => "dashboard",
            Command::Nitro(_) => "nitro",
            Command::Gateway(_) => "gateway",
        }
    }
}

/// `pelican dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// Address to serve on. Loopback by default; any other address needs --token.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// The token that unlocks requeue and purge (and, on a non-loopback address,
    /// everything): at least 16 characters. Default: a random one, printed in the login
    /// link at start.
    #[arg(long, env = "PELICAN_DASHBOARD_TOKEN", value_name = "TOKEN")]
    pub token: Option<String>,
    /// Serve no mutation at all: no requeue, no purge.
    #[arg(long)]
    pub read_only: bool,
    /// Key prefix of the queues to show (the library's QueueConfig::prefix).
    #[arg(long, default_value = "pelican", value_name = "PREFIX")]
    pub prefix: String,
}

/// `pelican gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Address to serve on. Loopback by default; any other address needs --token.
    #[arg(long, default_value = "127.0.0.1:8090", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// A token every request must carry as `Authorization: Bearer TOKEN` (at least 16
    /// characters). Without it the gateway is open to whoever reaches its loopback port.
    #[arg(long, env = "PELICAN_GATEWAY_TOKEN", value_name = "TOKEN")]
    pub token: Option<String>,
    /// The queues served, comma-separated (default: any queue a caller names).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub queues: Vec<String>,
    /// A call's timeout when it gives none (`Pelican-Timeout` header or `?timeout_ms=`), in
    /// ms: how long the caller waits, and the request's deadline in the queue.
    #[arg(long, default_value_t = 30_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub default_timeout: u64,
    /// The longest timeout a call may ask for, in ms (longer ones are cut to it); also the
    /// longest `wait_ms` of a result request.
    #[arg(long, default_value_t = 300_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_timeout: u64,
    /// Calls handled at once (waiting for their answer included); past it a call is
    /// refused with 503 and Retry-After, never queued in memory.
    #[arg(long, default_value_t = 10_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_inflight: u64,
    /// On SIGINT/SIGTERM: how long calls in progress may take to finish, in ms, before
    /// the gateway exits anyway (their requests are then withdrawn unless someone else
    /// waits for them).
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub shutdown_timeout: u64,
    /// Threads serving HTTP. One thread serves tens of thousands of calls a second and
    /// spends the least CPU per call; more threads use more cores but spend more per call
    /// (tasks woken across threads).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads: u64,
}

/// `pelican inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The request id (`pelican call` prints it with -v; `pelican stats` lists those in
    /// flight; with dedup on it is the hash of the body).
    #[arg(value_name = "RID")]
    pub rid: String,
}

/// `pelican demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Requests the producers submit (duplicates included; the poison comes on top).
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(10..=100_000))]
    pub requests: u64,
    /// Producers (each with its own connection and reply stream).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub producers: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=32))]
    pub workers: u64,
    /// Concurrency of each worker.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub concurrency: u64,
    /// How long the workers' handler works on one request, in ms.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    pub handler_ms: u64,
    /// Idle time after which a dead worker's requests are taken over, in ms.
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..))]
    pub claim_idle: u64,
    /// Deliveries after which the poison request is dead-lettered.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub max_deliveries: u32,
    /// Always start a throwaway redis-server on a free loopback port, even if one answers
    /// at --redis.
    #[arg(long)]
    pub throwaway_redis: bool,
    /// Keep the demo queue's keys at the end (to look at them with `pelican stats`).
    #[arg(long)]
    pub keep: bool,
}

/// `pelican worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// What to do with each request (JSON in, JSON out): echo, sleep:MS, fail-if:FIELD,
    /// crash-if:FIELD, or several joined by commas, run in order (e.g. crash-if:poison,sleep:50).
    #[arg(long, default_value = "echo", value_name = "H")]
    pub handler: String,
    /// Requests handled at once.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Requests held at once, in work and read ahead (default: --concurrency, so an idle
    /// worker never waits while a busy one hoards work).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub prefetch: Option<u64>,
    /// Idle time after which a request held by a worker that stopped renewing its lease
    /// (it died) is taken over, in ms.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub claim_idle: u64,
    /// Deliveries after which a request is dead-lettered instead of delivered again.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub max_deliveries: u32,
    /// How long to wait for requests in work on SIGINT/SIGTERM before releasing them, in ms.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub shutdown_timeout: u64,
    /// The consumer's name in the group (default: host-pid-random).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print one line per handled request on stdout (JSON with --json).
    #[arg(long)]
    pub verbose: bool,
    /// Serve metrics in Prometheus text format at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9464, or 0.0.0.0:9464 for a Prometheus that scrapes pods: the queue's
    /// counters and histograms (pelican_requests_*, pelican_deliveries_*,
    /// pelican_handler_duration_seconds, ...; labelled with the queue's name), no bodies or
    /// request ids, no authentication.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// How the queue's bodies are decoded: json (the default codec), or raw (bytes as
    /// they are, `pelican::Raw`; with --exec they travel base64-encoded, with --http as
    /// application/octet-stream). raw needs --exec or --http.
    #[arg(long, value_enum, default_value_t = BodyCodec::Json)]
    pub codec: BodyCodec,
    /// A handler in any language (--exec, --http).
    #[command(flatten)]
    pub external: ExternalArgs,
}

/// How `pelican worker` decodes bodies (`--codec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BodyCodec {
    /// JSON (the default codec).
    Json,
    /// Raw bytes (`pelican::Raw`).
    Raw,
}

/// A handler outside the process, for `pelican worker` and `pelican nitro worker`
/// (README, "From any language").
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "A handler in any language")]
#[command(group = clap::ArgGroup::new("external").args(["exec", "http"]).multiple(false))]
pub struct ExternalArgs {
    /// Hand each request to long-lived child processes running this command (split into
    /// words as a shell would, no shell run): they read one JSON line per request on
    /// stdin and write one line per answer on stdout, after a hello line each way.
    #[arg(long, value_name = "CMD", conflicts_with = "handler")]
    pub exec: Option<String>,
    /// How many child processes --exec runs (--concurrency is spread over them)
    /// [default: 1].
    #[arg(long, value_name = "N", requires = "exec", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub processes: Option<u64>,
    /// POST each request to this http:// URL, --concurrency at once over keep-alive
    /// connections: 2xx answers with the body, another 4xx fails for good with the body
    /// as the message, 408, 429, 5xx or no connection retries.
    #[arg(long, value_name = "URL", conflicts_with = "handler")]
    pub http: Option<String>,
    /// Longest a request may take in --exec or --http, in ms: past it the request is
    /// handed back (an --exec child is then taken for hung and restarted) [default:
    /// 300000].
    #[arg(long, value_name = "MS", requires = "external", value_parser = clap::value_parser!(u64).range(1..))]
    pub handler_timeout: Option<u64>,
    /// Longest an --exec child may take to write its hello line, in ms [default: 30000].
    #[arg(long, value_name = "MS", requires = "exec", value_parser = clap::value_parser!(u64).range(1..))]
    pub start_timeout: Option<u64>,
}

/// `pelican call`.
#[derive(Debug, Clone, Args)]
pub struct CallArgs {
    /// Request id of your choosing (the dedup key: calls with the same id share one answer).
    #[arg(long, value_name = "RID")]
    pub id: Option<String>,
    /// Give up after this long, in ms (the request's deadline in the queue, too).
    #[arg(long, default_value_t = 30_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Submit as a new request even if an identical one is in flight or cached.
    #[arg(long)]
    pub no_dedup: bool,
    /// The request, as JSON (`-` reads it from stdin).
    #[arg(value_name = "JSON")]
    pub request: String,
}

/// `pelican dead`.
#[derive(Debug, Clone, Args)]
pub struct DeadArgs {
    /// What to do with the dead letters.
    #[command(subcommand)]
    pub command: DeadCommand,
}

/// `pelican dead ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum DeadCommand {
    /// List dead letters, oldest first: reason, deliveries, last consumer, body preview.
    List {
        /// Show at most this many.
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: usize,
    },
    /// Put dead letters back on the queue as fresh requests.
    Requeue {
        /// Dead-letter ids (from `pelican dead list`).
        #[arg(
            value_name = "ID",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        ids: Vec<String>,
        /// Requeue every dead letter.
        #[arg(long)]
        all: bool,
        /// Deadline of the requeued requests, from now, in ms.
        #[arg(long, default_value_t = 300_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
    },
    /// Delete every dead letter.
    Purge,
}

/// `pelican bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Requests of the throughput phase.
    #[arg(long, default_value_t = 20_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// Most requests outstanding at once in the throughput phase (lanes of the closed
    /// loop: each submits, awaits the answer, submits the next).
    #[arg(long, default_value_t = 1_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub inflight: u64,
    /// Requests of the latency phase, strictly one at a time (0 skips it).
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    pub latency_requests: u64,
    /// Unmeasured warm-up requests before the throughput phase (at most 100 in flight).
    #[arg(long, default_value_t = 1_000, value_name = "N")]
    pub warmup: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,
    /// Requests each worker handles at once.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Deliveries each worker holds at once (default: twice --concurrency, so reading
    /// the next batch overlaps handling this one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub prefetch: Option<u64>,
    /// Length of the payload's "data" string, in bytes. Above --max-body-bytes (4 MiB
    /// by default) the queue's limit is raised to fit, for this run.
    #[arg(long, default_value_t = 64, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(0..=67_108_864))]
    pub payload_bytes: u64,
    /// Length of the filler each answer carries, in bytes (0: none): large responses.
    /// Needs --codec raw (the answer is then the request's index, a 1 and the x's).
    #[arg(long, default_value_t = 0, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(0..=67_108_864))]
    pub response_bytes: u64,
    /// How bodies are encoded: json (the default codec), postcard (the same structs in
    /// postcard's binary format) or raw (`pelican::Raw`, bytes as they are: the payload
    /// is the request's index as 8 bytes, then the x's).
    #[arg(long, value_enum, default_value_t = BenchCodec::Json)]
    pub codec: BenchCodec,
    /// Switch dedup off: every submission is its own request (fewer Redis commands).
    #[arg(long)]
    pub no_dedup: bool,
    /// Run as the bench's worker process (started by `pelican bench` itself).
    #[arg(long, hide = true)]
    pub serve_worker: bool,
    /// Send the requests through a `pelican gateway` (started by the bench) over HTTP
    /// instead of a producer in this process: one keep-alive connection per lane
    /// (--inflight connections), JSON bodies, dedup on.
    #[arg(long, conflicts_with = "no_dedup")]
    pub via_gateway: bool,
    /// With --via-gateway: the gateway's --threads.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "via_gateway", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub gateway_threads: u64,
}

impl BenchArgs {
    /// Deliveries held at once per worker.
    pub fn prefetch(&self) -> u64 {
        self.prefetch.unwrap_or(2 * self.concurrency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_redis_password() {
        let cli =
            Cli::try_parse_from(["pelican", "--redis", "redis://app:hunter2@db:6379", "stats"])
                .expect("valid arguments");
        assert_eq!(cli.global.redis.as_str(), "redis://app:hunter2@db:6379");
        let shown = format!("{cli:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://app:***@db:6379"), "{shown}");
    }

    /// `--lean-connections` (`PELICAN_LEAN_CONNECTIONS`) reaches the queue's config:
    /// lean unless turned off with 0/false/no/off; anything else is a usage error.
    #[test]
    fn lean_connections_can_be_turned_off() {
        let lean = |args: &[&str]| {
            let mut all = vec!["pelican", "--redis", "redis://127.0.0.1:6379"];
            all.extend_from_slice(args);
            all.push("stats");
            Cli::try_parse_from(all)
                .map(|c| c.global.queue_config().expect("valid").lean_connections)
        };
        if std::env::var_os("PELICAN_LEAN_CONNECTIONS").is_none() {
            assert!(lean(&[]).unwrap(), "lean by default");
        }
        for off in ["0", "false", "no", "off"] {
            assert!(!lean(&["--lean-connections", off]).unwrap(), "{off}");
        }
        assert!(lean(&["--lean-connections", "1"]).unwrap());
        assert!(lean(&["--lean-connections", "maybe"]).is_err());
    }
}

/// `pelican nitro`.
#[derive(Debug, Clone, Args)]
pub struct NitroArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: NitroCommand,
}

/// `pelican nitro ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum NitroCommand {
    /// Serve a Nitro stream until SIGINT/SIGTERM, then hand the work in hand back.
    Worker(NitroWorkerArgs),
    /// Send one request as Nitro's producers do and print the response JSON.
    Call(NitroCallArgs),
    /// A Nitro stream at a glance: length, group, consumers, answer keys, dedup jobs.
    Stats(StreamArg),
}

/// `--stream`.
#[derive(Debug, Clone, Args)]
pub struct StreamArg {
    /// The stream (and consumer group) name, e.g. stream:0x<module root>.
    #[arg(long, value_name = "NAME")]
    pub stream: String,
}

/// `pelican nitro worker`.
#[derive(Debug, Clone, Args)]
pub struct NitroWorkerArgs {
    #[command(flatten)]
    pub stream: StreamArg,
    /// What to do with each request (JSON in, JSON out): echo, sleep:MS, fail-if:FIELD,
    /// crash-if:FIELD, or several joined by commas. echo answers the request unchanged.
    #[arg(long, default_value = "echo", value_name = "H")]
    pub handler: String,
    /// Requests handled at once.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Requests held at once, in work and read ahead (default: --concurrency).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub prefetch: Option<u64>,
    /// Nitro's idletime-to-autoclaim: a request idle this long is taken over, in ms. The
    /// same for every process of the stream, Nitro's included.
    #[arg(long, default_value_t = 300_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(3..))]
    pub idletime: u64,
    /// Nitro's max-retry-count: a request taken over after more deliveries than this is
    /// answered "too many retries"; -1 = unlimited (Nitro's default).
    #[arg(long, default_value_t = -1, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..=1_000_000))]
    pub max_retry_count: i64,
    /// Nitro's response-entry-timeout: the TTL of result and error keys, in seconds
    /// (0: no expiry).
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    pub response_ttl: u64,
    /// Solve identical requests once: copies in flight together share one handler run,
    /// and a repeat of a request solved within --dedup-cache-ttl is answered from a cache.
    #[arg(long)]
    pub dedup: bool,
    /// With --dedup: how long a solved request's result answers its repeats, in ms; 0
    /// keeps no cache (only copies in flight together are joined) [default: 300000, as
    /// pelican's own queues keep results].
    #[arg(long, value_name = "MS", requires = "dedup")]
    pub dedup_cache_ttl: Option<u64>,
    /// How long to wait for the requests in work on SIGINT/SIGTERM before handing them
    /// back, in ms.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub shutdown_timeout: u64,
    /// The consumer's name in the group (default: host-pid-random).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print one line per handler run on stdout (JSON with --json).
    #[arg(long)]
    pub verbose: bool,
    /// A handler in any language (--exec, --http).
    #[command(flatten)]
    pub external: ExternalArgs,
}

/// `pelican nitro call`.
#[derive(Debug, Clone, Args)]
pub struct NitroCallArgs {
    #[command(flatten)]
    pub stream: StreamArg,
    /// Give up after this long, in ms (by the Redis clock); the request is withdrawn.
    #[arg(long, default_value_t = 30_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// How often the answer keys are polled, in ms.
    #[arg(long, default_value_t = 10, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub poll_interval: u64,
    /// The request, as JSON (`-` reads it from stdin).
    #[arg(value_name = "JSON")]
    pub request: String,
}

/// How the bench's bodies are encoded (`--codec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchCodec {
    /// JSON (the default codec): `{"i": N, "data": "<x...>"}`, answered `{"i": N, "ok": true}`.
    Json,
    /// Raw bytes (`pelican::Raw`): N as 8 bytes (little-endian) then the x's, answered
    /// with the same 8 bytes and a 1.
    Raw,
    /// The JSON workload's structs in postcard's binary format (`pelican::Postcard`).
    Postcard,
}

impl BenchCodec {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BenchCodec::Json => "json",
            BenchCodec::Raw => "raw",
            BenchCodec::Postcard => "postcard",
        }
    }
}
