//! [`AnySource`]: a Kinesis stream or a DynamoDB table's stream, chosen at run time (by a
//! program's settings) and read exactly as the source itself reads it.

use chrono::{DateTime, Utc};
use kcl_core::{
    BackendError, ConsumerId, InitialPosition, RecordBatch, Shard, ShardId, ShardIterator,
    ShardSource, StartingPosition, Subscription,
};

use crate::{DynamoDbStreamsSource, KinesisShardSource};

/// A Kinesis stream or a DynamoDB table's stream: one [`ShardSource`] type for a program
/// that reads either, as its settings say. Every call goes to the source inside.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnySource {
    /// A Kinesis stream.
    Kinesis(KinesisShardSource),
    /// A DynamoDB table's stream.
    DynamoDb(DynamoDbStreamsSource),
}

/// `$call` on the source inside `$any`, named `$s`.
macro_rules! each {
    ($any:expr, $s:ident => $call:expr) => {
        match $any {
            AnySource::Kinesis($s) => $call,
            AnySource::DynamoDb($s) => $call,
        }
    };
}

impl ShardSource for AnySource {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        each!(self, s => s.list_shards().await)
    }

    async fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        each!(self, s => s.shard_iterator(shard, position).await)
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        each!(self, s => s.get_records(iterator, limit).await)
    }

    async fn register_consumer(&self, name: &str) -> Result<ConsumerId, BackendError> {
        each!(self, s => s.register_consumer(name).await)
    }

    async fn subscribe(
        &self,
        consumer: &ConsumerId,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<Subscription, BackendError> {
        each!(self, s => s.subscribe(consumer, shard, position).await)
    }

    fn initial_position(&self, shard: &ShardId) -> Option<InitialPosition> {
        each!(self, s => s.initial_position(shard))
    }

    fn is_retired(&self, shard: &ShardId) -> bool {
        each!(self, s => s.is_retired(shard))
    }

    fn now(&self, shard: &ShardId) -> DateTime<Utc> {
        each!(self, s => s.now(shard))
    }
}
