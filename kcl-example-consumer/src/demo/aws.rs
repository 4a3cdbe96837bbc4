//! `demo --endpoints`: the same script on Kinesis and DynamoDB, or on their emulators
//! (`eval "$(localstack/emulator up)"` sets `AWS_ENDPOINT_URL_KINESIS` and
//! `AWS_ENDPOINT_URL_DYNAMODB`). The demo creates a stream and a lease table of its own, named
//! `kcl-demo-<time>`, and deletes both at the end.

use std::time::Duration;

use anyhow::Context as _;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_kinesis::types::StreamStatus;
use kcl_aws::{DynamoDbLeaseStore, KinesisShardSource};
use kcl_core::{Lease, LeaseStore, ShardId, ShardSource};
use tokio::time::{Instant, sleep};

use crate::demo::Backend;

/// A stream and a lease table created for the demo.
#[derive(Debug)]
pub(crate) struct Endpoints {
    sdk: SdkConfig,
    kinesis: aws_sdk_kinesis::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    stream: String,
    table: String,
    observer: DynamoDbLeaseStore,
}

impl Endpoints {
    /// Creates a stream of `shards` shards and waits until it is active.
    pub(crate) async fn create(shards: u32) -> anyhow::Result<Self> {
        let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
        let kinesis = aws_sdk_kinesis::Client::new(&sdk);
        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let name = format!("kcl-demo-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"));
        kinesis
            .create_stream()
            .stream_name(&name)
            .shard_count(i32::try_from(shards).unwrap_or(i32::MAX))
            .send()
            .await
            .with_context(|| format!("creating stream {name}"))?;
        let this = Self {
            observer: DynamoDbLeaseStore::new(&sdk, name.clone()),
            sdk,
            kinesis,
            dynamodb,
            stream: name.clone(),
            table: name,
        };
        this.wait_active(Duration::from_secs(120)).await?;
        Ok(this)
    }

    async fn wait_active(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let out = self
                .kinesis
                .describe_stream_summary()
                .stream_name(&self.stream)
                .send()
                .await
                .with_context(|| format!("describing stream {}", self.stream))?;
            let active = out
                .stream_description_summary()
                .is_some_and(|s| s.stream_status() == &StreamStatus::Active);
            if active {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "stream {} not active after {within:?}",
                self.stream
            );
            sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the stream and the lease table; failures are reported, not fatal.
    pub(crate) async fn delete(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = self
            .kinesis
            .delete_stream()
            .stream_name(&self.stream)
            .enforce_consumer_deletion(true)
            .send()
            .await
        {
            problems.push(format!(
                "deleting stream {}: {}",
                self.stream,
                aws_sdk_kinesis::error::DisplayErrorContext(e)
            ));
        }
        if let Err(e) = self
            .dynamodb
            .delete_table()
            .table_name(&self.table)
            .send()
            .await
        {
            problems.push(format!(
                "deleting table {}: {}",
                self.table,
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            ));
        }
        problems
    }
}

impl Backend for Endpoints {
    type Source = KinesisShardSource;
    type Store = DynamoDbLeaseStore;

    fn describe(&self) -> String {
        format!(
            "Kinesis stream and DynamoDB lease table {} ({})",
            self.stream,
            self.sdk
                .region()
                .map_or_else(|| "no region".to_owned(), ToString::to_string)
        )
    }

    fn source(&self, _name: &str) -> KinesisShardSource {
        KinesisShardSource::new(&self.sdk, self.stream.clone())
    }

    fn store(&self, _name: &str) -> DynamoDbLeaseStore {
        DynamoDbLeaseStore::new(&self.sdk, self.table.clone())
    }

    async fn put(&self, records: Vec<(String, String)>) -> anyhow::Result<()> {
        Ok(kcl_aws::producer::put_records(&self.kinesis, &self.stream, &records).await?)
    }

    async fn split(&self) -> anyhow::Result<(ShardId, Vec<ShardId>)> {
        // kcl-aws lists shards (paginated, with parents and hash-key ranges) as the worker sees them.
        let source = self.source("demo");
        let shards = source.list_shards().await?;
        let open = shards.iter().find(|s| !s.closed).context("no open shard")?;
        let range = open.hash_key_range;
        let middle = range.start + (range.end - range.start) / 2 + 1;
        self.kinesis
            .split_shard()
            .stream_name(&self.stream)
            .shard_to_split(open.id.as_str())
            .new_starting_hash_key(middle.to_string())
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{}", aws_sdk_kinesis::error::DisplayErrorContext(e)))?;
        self.wait_active(Duration::from_secs(120)).await?;
        let children = source
            .list_shards()
            .await?
            .into_iter()
            .filter(|s| s.parent_shard_ids.contains(&open.id))
            .map(|s| s.id)
            .collect();
        Ok((open.id.clone(), children))
    }

    async fn leases(&self) -> anyhow::Result<Vec<Lease>> {
        Ok(self.observer.list().await?)
    }
}
