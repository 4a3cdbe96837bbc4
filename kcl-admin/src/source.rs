//! Which stream a lease table's leases are of: a Kinesis stream, or a DynamoDB table's stream
//! (`--source dynamodb-streams`, as for the example binary), read the way the fleet reads it.

use kcl_aws::{DynamoDbStreamsSource, KinesisShardSource};
use kcl_core::{
    BackendError, RecordBatch, Shard, ShardId, ShardIterator, ShardSource, StartingPosition,
};

/// The stream flags shared by the commands that read it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StreamArgs {
    /// `kinesis` or `dynamodb-streams`.
    #[arg(long, env = "KCL_SOURCE", default_value = "kinesis")]
    source: String,
    /// The stream: a Kinesis stream's name or ARN; with `--source dynamodb-streams`, a DynamoDB
    /// stream ARN.
    #[arg(long, env = "KCL_STREAM")]
    stream: Option<String>,
    /// With `--source dynamodb-streams`: the table whose current stream it is.
    #[arg(long, env = "KCL_TABLE")]
    table: Option<String>,
}

impl StreamArgs {
    /// Whether a stream was named.
    pub(crate) fn given(&self) -> bool {
        self.stream.is_some() || self.table.is_some()
    }

    /// The stream, as the fleet reads it; `None` if none was named.
    pub(crate) async fn open(&self, sdk: &aws_config::SdkConfig) -> anyhow::Result<Option<Source>> {
        match (self.source.as_str(), &self.stream, &self.table) {
            ("kinesis", None, None) | ("dynamodb-streams", None, None) => Ok(None),
            ("kinesis", Some(stream), None) => Ok(Some(Source::Kinesis(KinesisShardSource::new(
                sdk,
                stream.clone(),
            )))),
            ("kinesis", _, Some(_)) => {
                anyhow::bail!("invalid --table: only used with --source dynamodb-streams")
            }
            ("dynamodb-streams", stream, table) => Ok(Some(Source::DynamoDb(
                DynamoDbStreamsSource::find(sdk, table.as_deref(), stream.as_deref()).await?,
            ))),
            (other, _, _) => {
                anyhow::bail!("invalid --source {other}: want kinesis or dynamodb-streams")
            }
        }
    }

    /// Whether `name` (a multi-stream lease key's stream name) is the stream named: a Kinesis
    /// stream's name, or the name in its ARN (`arn:…:stream/NAME`). A DynamoDB stream's
    /// multi-stream id is not matched.
    pub(crate) fn names(&self, name: &str) -> bool {
        if !self.is_kinesis() {
            return false;
        }
        self.stream
            .as_deref()
            .map(|s| s.rsplit_once(":stream/").map_or(s, |(_, n)| n))
            .is_some_and(|s| s == name)
    }

    /// Whether the stream is a Kinesis stream's.
    pub(crate) fn is_kinesis(&self) -> bool {
        self.source == "kinesis"
    }

    /// What names the stream in messages.
    pub(crate) fn name(&self) -> &str {
        self.stream
            .as_deref()
            .or(self.table.as_deref())
            .unwrap_or("(none)")
    }
}

/// A Kinesis stream or a DynamoDB table's stream.
#[derive(Debug)]
pub(crate) enum Source {
    Kinesis(KinesisShardSource),
    DynamoDb(DynamoDbStreamsSource),
}

impl ShardSource for Source {
    async fn list_shards(&self) -> Result<Vec<Shard>, BackendError> {
        match self {
            Self::Kinesis(s) => s.list_shards().await,
            Self::DynamoDb(s) => s.list_shards().await,
        }
    }

    async fn shard_iterator(
        &self,
        shard: &ShardId,
        position: &StartingPosition,
    ) -> Result<ShardIterator, BackendError> {
        match self {
            Self::Kinesis(s) => s.shard_iterator(shard, position).await,
            Self::DynamoDb(s) => s.shard_iterator(shard, position).await,
        }
    }

    async fn get_records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, BackendError> {
        match self {
            Self::Kinesis(s) => s.get_records(iterator, limit).await,
            Self::DynamoDb(s) => s.get_records(iterator, limit).await,
        }
    }
}
