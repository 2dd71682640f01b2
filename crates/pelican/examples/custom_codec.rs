//! A codec of your own: how requests and responses become bytes in Redis.
//!
//! The default, `pelican::Json`, suits most queues. This one, `PlainText`, carries bare
//! UTF-8 strings: the body of a request for "hello" is the five bytes `hello`, with no
//! quotes or escapes, which is what a producer or consumer written in another language
//! (or a person reading the stream in `redis-cli`) finds easiest. A codec is a type
//! implementing `pelican::Codec`, named as the last type parameter of `Producer` and
//! `Consumer`; both ends of a queue must use the same one.
//!
//! Run it against the Redis at redis://127.0.0.1:6379, or the one `REDIS_URL` names:
//!
//! ```text
//! cargo run -p pelican --example custom_codec
//! ```
//!
//! The queue is named after this process and removed at the end.

use pelican::{
    Admin, Codec, CodecError, Consumer, ConsumerConfig, ErrorKind, Producer, ProducerConfig,
    QueueConfig,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// Bodies are the text itself, UTF-8. Only values that serialize as a string (a `String`,
/// a `&str`, a unit enum variant) can be carried; anything else is a codec error.
///
/// With dedup on, the request id is a hash of the body, so an encoding must give equal
/// bytes for equal values: plain text does.
struct PlainText;

impl Codec for PlainText {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
        // serde_json's Value is the bridge from any Serialize type to "is it a string?".
        match serde_json::to_value(value) {
            Ok(Value::String(text)) => Ok(text.into_bytes()),
            Ok(other) => Err(CodecError(format!(
                "PlainText carries strings only, not {other}"
            ))),
            Err(e) => Err(CodecError(e.to_string())),
        }
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| CodecError(format!("the body is not UTF-8: {e}")))?;
        serde_json::from_value(Value::String(text.to_owned()))
            .map_err(|e| CodecError(e.to_string()))
    }
}

#[tokio::main]
async fn main() -> pelican::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let queue = QueueConfig::new(url, format!("example-text-{}", std::process::id()));

    // Request and response are Strings, carried by PlainText.
    let consumer =
        Consumer::<String, String, PlainText>::connect(queue.clone(), ConsumerConfig::default())
            .await?;
    let stop = consumer.stopper();
    let serving = tokio::spawn(consumer.serve(4, |text: String, _job| async move {
        Ok(text.chars().rev().collect::<String>())
    }));
    let producer =
        Producer::<String, String, PlainText>::connect(queue.clone(), ProducerConfig::default())
            .await?;
    let reversed = producer.call(&"hello, plain text".to_string()).await?;
    println!("\"hello, plain text\" reversed: {reversed:?}");

    // A value the codec cannot carry is refused before anything is queued.
    let numbers =
        Producer::<Vec<u32>, String, PlainText>::connect(queue.clone(), ProducerConfig::default())
            .await?;
    match numbers.submit(&vec![1, 2, 3]).await {
        Err(e) if e.kind() == ErrorKind::Codec => println!("a list of numbers: {e}"),
        Err(e) => return Err(e),
        Ok(_) => println!("a list of numbers was queued?!"),
    }

    numbers.shutdown().await?;
    producer.shutdown().await?;
    stop.stop();
    serving.await.expect("the consumer task panicked")?;
    Admin::connect(queue).await?.destroy().await?;
    Ok(())
}
