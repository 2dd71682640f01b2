//! The bench's worker process (`pelican bench --serve-worker`, started by the bench):
//! answers `{"i": N, "data": ..}` with `{"i": N, "ok": true}` until SIGTERM, then shuts
//! down gracefully. It prints one line on stdout, [`READY_LINE`], once it is connected.

use super::load::raw_answer;
use super::workers::READY_LINE;
use super::{BenchRequest, BenchResponse};
use crate::cli::{BenchArgs, BenchCodec, Global};
use crate::exit::{CliError, CliResult};
use pelican::{Bytes, Consumer, ConsumerConfig, HandlerError, Job, Postcard, Raw, Stopper};
use std::io::Write;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Serves the queue named by `--queue` until SIGTERM or SIGINT.
pub async fn run(g: &Global, args: &BenchArgs) -> CliResult {
    let queue = g.queue_config()?;
    let cfg = ConsumerConfig::default().with_prefetch(args.prefetch() as usize);
    let signal_error =
        |e: std::io::Error| CliError::failure(format!("cannot listen for signals: {e}"));
    let term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    if args.codec == BenchCodec::Raw {
        let consumer = Consumer::<Bytes, Bytes, Raw>::connect(queue, cfg)
            .await
            .map_err(|e| g.error(&e))?;
        listen(consumer.stopper(), term, int)?;
        let filler = args.response_bytes as usize;
        return consumer
            .serve(
                args.concurrency as usize,
                move |req: Bytes, _job: Job| async move { Ok(raw_answer(&req, filler)) },
            )
            .await
            .map_err(|e| g.error(&e));
    }
    if args.codec == BenchCodec::Postcard {
        let consumer = Consumer::<BenchRequest, BenchResponse, Postcard>::connect(queue, cfg)
            .await
            .map_err(|e| g.error(&e))?;
        listen(consumer.stopper(), term, int)?;
        return consumer
            .serve(args.concurrency as usize, answer)
            .await
            .map_err(|e| g.error(&e));
    }
    let consumer = Consumer::<BenchRequest, BenchResponse>::connect(queue, cfg)
        .await
        .map_err(|e| g.error(&e))?;
    listen(consumer.stopper(), term, int)?;
    consumer
        .serve(args.concurrency as usize, answer)
        .await
        .map_err(|e| g.error(&e))
}

/// The answer to a request of the structs workload.
async fn answer(req: BenchRequest, _job: Job) -> Result<BenchResponse, HandlerError> {
    Ok(BenchResponse { i: req.i, ok: true })
}

/// Stops the consumer on the first SIGTERM or SIGINT (exits on the second), and tells
/// the bench this worker is ready.
fn listen(stop: Stopper, mut term: Signal, mut int: Signal) -> CliResult {
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.stop();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        std::process::exit(crate::exit::FAILURE.into());
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY_LINE}")
            .and_then(|()| out.flush())
            .map_err(|e| CliError::failure(format!("cannot tell the bench we are ready: {e}")))?;
    }
    Ok(())
}
