//! `pelican`: the project's main job (`pelican demo`) and the operator's tool (worker,
//! call, stats, dead letters). Parses the command line, sets up logging and the runtime,
//! runs one subcommand and maps its outcome to an exit code (see `exit`).
//!
//! Layout: `cli` (arguments), one file per subcommand (`demo`, `worker`, `call`, `stats`,
//! `dead`, `inspect`, `bench`, `nitro`, `gateway/`: the HTTP gateway for callers in any
//! language; `dashboard/`: the web dashboard), and their helpers: `http/` (what the HTTP
//! surfaces share: errors, security policy, strict parsing), `handlers` (the worker's
//! built-in handlers), `external` (handlers in any language: `--exec` child processes,
//! `--http` endpoints), `pool` (the demo's worker
//! processes), `summary` (the demo's table), `redis_local` (reachability, throwaway
//! redis-server), `redis_url` (a URL whose Debug hides the password), `logging` (stderr
//! logs and `--otlp` span export), `malloc` (the C allocator's settings), `metrics_http`,
//! `process`, `context`, `fmt`, `out` (standard output, and why SIGPIPE stays ignored).

/// `println!` through [`out`]: a reader of standard output that went away ends the
/// process quietly (SIGPIPE), without making every socket write able to end it.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), true)
    };
}

/// `print!` through [`out`] (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), false)
    };
}

mod bench;
mod call;
mod cli;
mod context;
mod dashboard;
mod dead;
mod demo;
mod exit;
mod external;
mod fmt;
mod gateway;
mod handlers;
mod http;
mod inspect;
mod logging;
mod malloc;
mod metrics_http;
mod nitro;
mod out;
mod pool;
mod process;
mod redis_local;
mod redis_url;
mod stats;
mod summary;
mod worker;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    malloc::keep_freed_memory();
    let cli = Cli::parse();
    let telemetry = match logging::init(
        cli.global.log,
        cli.global.log_format,
        cli.global.otlp.as_deref(),
        &format!("pelican-{}", cli.command.name()),
    ) {
        Ok(t) => t,
        Err(e) => return exit::finish(Err(e)),
    };
    // The bench's producer and worker processes share the cores with redis-server: a
    // single-threaded runtime costs them ~25-30 % less CPU per request. The gateway's
    // too, unless told otherwise (--threads): about a third less CPU per call than on
    // two threads, for the same rate (docs/benchmarks/2026-12-06-1b1c4c5-gateway.md).
    let mut builder = match &cli.command {
        Command::Bench(_) => tokio::runtime::Builder::new_current_thread(),
        Command::Gateway(a) if a.threads == 1 => tokio::runtime::Builder::new_current_thread(),
        Command::Gateway(a) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(a.threads as usize);
            b
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return exit::finish(Err(exit::CliError::failure(format!("cannot start: {e}")))),
    };
    let g = &cli.global;
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Demo(a) => demo::run(g, a).await,
            Command::Worker(a) => worker::run(g, a).await,
            Command::Call(a) => call::run(g, a).await,
            Command::Stats => stats::run(g).await,
            Command::Dead(a) => dead::run(g, &a.command).await,
            Command::Inspect(a) => inspect::run(g, &a.rid).await,
            Command::Bench(a) => bench::run(g, a).await,
            Command::Dashboard(a) => dashboard::run(g, a).await,
            Command::Nitro(a) => nitro::run(g, a).await,
            Command::Gateway(a) => gateway::run(g, a).await,
        }
    });
    // Background tasks (reply readers, the metrics listener) must not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    telemetry.shutdown();
    exit::finish(result)
}
