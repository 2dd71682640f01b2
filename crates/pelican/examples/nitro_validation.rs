//! Nitro's block validation over its Redis-streams wire format: a validation worker (what
//! Nitro's valnode runs) and a validator client's producer, both pelican, in one process.
//! Either side can be Nitro's own Go process instead.
//!
//! `cargo run -p pelican --features nitro --example nitro_validation -- redis://127.0.0.1:6379`

use pelican::nitro::validation::{BatchInfo, Bytes, GoGlobalState, Hash, ValidationInput};
use pelican::nitro::{Consumer, ConsumerConfig, Producer, ProducerConfig, StreamConfig};
use pelican::HandlerError;
use std::time::Duration;

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    // Nitro names a validation stream after the module root: `<prefix>stream:<root>`.
    let module_root: Hash = "0x8b104a2e80ac6165dc58b9048de12f301d70b02a0ab51396c22b4b4b802a16a4"
        .parse()
        .expect("a hash");
    let stream = StreamConfig::new(url, format!("stream:{module_root}"));

    // The worker: validates one block per request (here: pretends to).
    let worker = Consumer::<ValidationInput, GoGlobalState>::connect(
        stream.clone(),
        ConsumerConfig::default().with_prefetch(2).with_dedup(true),
    )
    .await?;
    let stop = worker.stopper();
    let served = tokio::spawn(worker.serve(2, |input: ValidationInput, job| async move {
        if input.batch_info.is_empty() {
            return Err(HandlerError::fail("no batch to validate"));
        }
        println!(
            "validating block {} (entry {}, delivery {})",
            input.id,
            job.entry_id(),
            job.delivery_count()
        );
        let mut end = input.start_state.clone();
        end.pos_in_batch += 1;
        Ok(end)
    }));

    // The validator client's side.
    let producer = Producer::<ValidationInput, GoGlobalState>::connect(
        stream,
        ProducerConfig::default().with_request_timeout(Duration::from_secs(30)),
    )
    .await?;
    let input = ValidationInput {
        id: 42,
        batch_info: vec![BatchInfo {
            number: 3,
            data: Bytes(b"batch bytes".to_vec()),
        }],
        start_state: GoGlobalState {
            batch: 3,
            ..GoGlobalState::default()
        },
        ..ValidationInput::default()
    };
    let end = producer.call(&input).await?;
    println!(
        "end state: batch {} position {} block hash {}",
        end.batch, end.pos_in_batch, end.block_hash
    );
    let err = producer
        .call(&ValidationInput::default())
        .await
        .unwrap_err();
    println!("an input without batches: {err}");

    producer.shutdown().await?;
    stop.stop();
    served.await.expect("worker task")
}
