//! Consumers of the exactly-once tests, each of a given application (the shared helper gives
//! every consumer the test's), and what the tests read of the table and the lease table.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use kcl_core::{Checkpoint, LeaseStore, ShardId};
use kcl_example_consumer::table::dynamodb::{self, DynamoDbItems, PositionItem};
use kcl_integration_tests::Context;

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");

/// One consumer process; killed if still running when dropped.
pub(crate) struct Proc {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Proc {
    /// A consumer of the test's stream for `application`, with `args` on top of the test
    /// settings: 3 s failover, 1 s windows, JSON logs.
    pub(crate) fn spawn(
        ctx: &Context,
        id: &str,
        application: &str,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = ctx.path(&format!("{id}.log"));
        let child = Command::new(BIN)
            .args(["--stream", &ctx.stream, "--application-name", application])
            .args(args)
            .args(["--worker-id", id, "--listen", &addr.to_string()])
            .args(["--failover-time", "3s", "--window", "1s"])
            .args(["--idle-time-between-reads", "200ms", "--log-format", "json"])
            .envs(ctx.worker_env())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(
                ctx.path(&format!("{id}.windows.jsonl")),
            )?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Self { child, addr, log })
    }

    /// GET `path` on its HTTP server.
    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        kcl_integration_tests::http::http_get(self.addr, path)
    }

    /// SIGTERM, then a successful exit within 30 s.
    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        let id = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &id]).status()?;
        let status = self.wait_exit(Duration::from_secs(30)).await?;
        anyhow::ensure!(
            status.success(),
            "exited with {status}:\n{}",
            self.log_tail()
        );
        Ok(())
    }

    /// Its exit, within `limit`.
    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(
                start.elapsed() < limit,
                "no exit within {limit:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its log lines.
    pub(crate) fn log(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// Its log lines at ERROR that contain every one of `words`.
    pub(crate) fn errors_with(&self, words: &[&str]) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.contains("\"ERROR\"") && words.iter().all(|w| l.contains(w)))
            .collect()
    }

    /// The last 30 lines of its log.
    pub(crate) fn log_tail(&self) -> String {
        let lines = self.log();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The records the table's windows count, in all (0 if it cannot be read).
pub(crate) async fn counted(ctx: &Context, table: &str) -> u64 {
    by_shard(ctx, table).await.values().sum()
}

/// The records the table's windows count, by shard.
pub(crate) async fn by_shard(ctx: &Context, table: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((shard, _), n) in dynamodb::read_counts(&ctx.dynamodb, table)
        .await
        .unwrap_or_default()
    {
        *out.entry(shard).or_default() += n;
    }
    out
}

/// Every shard lease's checkpoint, by shard (coordination rows left out).
pub(crate) async fn checkpoints(
    ctx: &Context,
    application: &str,
) -> anyhow::Result<BTreeMap<ShardId, Checkpoint>> {
    let store = kcl_aws::DynamoDbLeaseStore::from_client(ctx.dynamodb.clone(), application);
    Ok(store
        .list()
        .await?
        .into_iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .map(|l| (l.key, l.checkpoint))
        .collect())
}

/// `shard`'s position item in `table`.
pub(crate) async fn position(
    ctx: &Context,
    table: &str,
    shard: &ShardId,
) -> anyhow::Result<Option<PositionItem>> {
    let items = DynamoDbItems::new(ctx.dynamodb.clone(), table, "test", "test");
    Ok(items.read_position(shard).await?)
}

/// Creates `table` keyed by `(hash, range)` attributes of `(name, type)`.
pub(crate) async fn create_table(
    ctx: &Context,
    table: &str,
    hash: (&str, ScalarAttributeType),
    range: (&str, ScalarAttributeType),
) -> anyhow::Result<()> {
    let attribute = |(name, kind): (&str, ScalarAttributeType)| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    ctx.dynamodb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(hash.clone())?)
        .attribute_definitions(attribute(range.clone())?)
        .key_schema(key(hash.0, KeyType::Hash)?)
        .key_schema(key(range.0, KeyType::Range)?)
        .send()
        .await?;
    Ok(())
}
