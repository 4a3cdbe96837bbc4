//! Enhanced fan-out on Kinesis: the stream consumer and `SubscribeToShard`.
//!
//! Why it is written the way it is:
//! - **Describe first, register if missing.** Every worker of a fleet starts the same way;
//!   the first registers the consumer and the others find it. Two registering at once is
//!   fine: the loser's `ResourceInUseException` is transient, and its next describe finds
//!   the winner's consumer. A consumer is usable only once `ACTIVE` (seconds after
//!   registering), so this polls until then, with a delay doubling from 50 ms to 1 s.
//! - **Shard end** is an event with a null continuation sequence number and the child shards,
//!   as KCL Java reads it. The SDK delivers a missing continuation as an empty string.
//! - **Errors inside the event stream** (after the call succeeded) go through the same
//!   mapping as call errors; an unknown one is transient, so that the worker subscribes again.

use std::time::Duration;

use aws_sdk_kinesis::types::{
    self as sdk, ConsumerStatus, ShardIteratorType, SubscribeToShardEventStream,
};
use futures_util::stream;
use kcl_core::{
    BackendError, ConsumerId, ErrorKind, SequenceNumber, ShardId, StartingPosition, Subscription,
    SubscriptionEvent,
};

use super::{KinesisShardSource, StreamRef, convert_children, convert_record, to_sdk_time};
use crate::error::backend_error;

/// Registers consumer `name` on the source's stream, or finds it; returns its ARN once ACTIVE.
pub(super) async fn register(
    source: &KinesisShardSource,
    name: &str,
) -> Result<ConsumerId, BackendError> {
    let stream_arn = stream_arn(source).await?;
    let what = format!("consumer {name} of {}", source.stream);
    let mut pause = Duration::from_millis(50);
    let mut registered = false;
    loop {
        let described = source
            .client
            .describe_stream_consumer()
            .stream_arn(&stream_arn)
            .consumer_name(name)
            .send()
            .await;
        match described {
            Ok(out) => match out.consumer_description {
                Some(c) if c.consumer_status == ConsumerStatus::Active => {
                    return Ok(ConsumerId::new(c.consumer_arn));
                }
                Some(c) if c.consumer_status == ConsumerStatus::Deleting => {
                    return Err(BackendError::new(
                        ErrorKind::Retryable,
                        "register_consumer",
                        format!("{what} is being deleted; it is registered again once gone"),
                    ));
                }
                // Creating.
                _ => {}
            },
            Err(e) => {
                let error = backend_error("register_consumer", &what, e);
                match error.kind() {
                    ErrorKind::NotFound if !registered => {
                        registered = register_once(source, &stream_arn, name, &what).await?;
                    }
                    // Just registered: describing may not find it yet.
                    ErrorKind::NotFound => {}
                    // The worker retries transient failures, with backoff.
                    _ => return Err(error),
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// `RegisterStreamConsumer`; true if this call registered it, false if another worker is.
async fn register_once(
    source: &KinesisShardSource,
    stream_arn: &str,
    name: &str,
    what: &str,
) -> Result<bool, BackendError> {
    let result = source
        .client
        .register_stream_consumer()
        .stream_arn(stream_arn)
        .consumer_name(name)
        .send()
        .await;
    match result {
        Ok(_) => {
            tracing::info!(consumer = name, stream = %source.stream, "registered the stream consumer");
            Ok(true)
        }
        Err(e) => {
            let error = backend_error("register_consumer", what, e);
            // In use: registered meanwhile by another worker.
            if error.kind() == ErrorKind::Retryable {
                Ok(false)
            } else {
                Err(error)
            }
        }
    }
}

/// The stream's ARN, which the consumer calls need.
async fn stream_arn(source: &KinesisShardSource) -> Result<String, BackendError> {
    let name = match &source.stream {
        StreamRef::Arn(arn) => return Ok(arn.clone()),
        StreamRef::Name(name) => name,
    };
    let out = source
        .client
        .describe_stream_summary()
        .stream_name(name)
        .send()
        .await
        .map_err(|e| backend_error("register_consumer", &source.stream, e))?;
    out.stream_description_summary
        .map(|s| s.stream_arn)
        .ok_or_else(|| {
            BackendError::new(
                ErrorKind::Retryable,
                "register_consumer",
                format!("{}: the answer carried no stream ARN", source.stream),
            )
        })
}

/// `SubscribeToShard`, its events as a stream.
pub(super) async fn subscribe(
    source: &KinesisShardSource,
    consumer: &ConsumerId,
    shard: &ShardId,
    position: &StartingPosition,
) -> Result<Subscription, BackendError> {
    let what = source.shard_what(shard);
    let start = sdk_position(position)
        .map_err(|e| BackendError::new(ErrorKind::Fatal, "subscribe", format!("{what}: {e}")))?;
    let out = source
        .client
        .subscribe_to_shard()
        .consumer_arn(consumer.as_str())
        .shard_id(shard.as_str())
        .starting_position(start)
        .send()
        .await
        .map_err(|e| backend_error("subscribe", &what, e))?;
    let state = (out.event_stream, source.stream.clone(), what);
    Ok(Box::pin(stream::unfold(
        state,
        |(mut events, stream, what)| async move {
            loop {
                let event = match events.recv().await {
                    Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(event))) => {
                        convert_event(event, &stream)
                    }
                    // A kind of event newer than this SDK.
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(e) => Err(backend_error("subscription", &what, e)),
                };
                return Some((event, (events, stream, what)));
            }
        },
    )))
}

fn sdk_position(
    position: &StartingPosition,
) -> Result<sdk::StartingPosition, aws_smithy_types::error::operation::BuildError> {
    let builder = sdk::StartingPosition::builder();
    let builder = match position {
        StartingPosition::TrimHorizon => builder.r#type(ShardIteratorType::TrimHorizon),
        StartingPosition::Latest => builder.r#type(ShardIteratorType::Latest),
        StartingPosition::AtTimestamp(at) => builder
            .r#type(ShardIteratorType::AtTimestamp)
            .timestamp(to_sdk_time(*at)),
        StartingPosition::AtSequence(seq) => builder
            .r#type(ShardIteratorType::AtSequenceNumber)
            .sequence_number(seq.as_str()),
        StartingPosition::AfterSequence(seq) => builder
            .r#type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq.as_str()),
    };
    builder.build()
}

fn convert_event(
    event: sdk::SubscribeToShardEvent,
    stream: &StreamRef,
) -> Result<SubscriptionEvent, BackendError> {
    let records = event
        .records
        .into_iter()
        .map(|r| convert_record(r, "subscription", stream))
        .collect::<Result<_, _>>()?;
    let continuation = match event.continuation_sequence_number.as_str() {
        "" => None,
        text => Some(SequenceNumber::parse(text).ok_or_else(|| {
            BackendError::new(
                ErrorKind::Fatal,
                "subscription",
                format!("{stream}: invalid continuation sequence number `{text}`"),
            )
        })?),
    };
    Ok(SubscriptionEvent {
        records,
        continuation,
        millis_behind_latest: u64::try_from(event.millis_behind_latest).ok(),
        child_shards: convert_children(
            event.child_shards.as_deref().unwrap_or_default(),
            "subscription",
            stream,
        )?,
    })
}
