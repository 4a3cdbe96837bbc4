//! Integration test harness: emulators, unique names, SDK clients, worker processes, journals.
//!
//! Endpoints come from `AWS_ENDPOINT_URL_KINESIS` and `AWS_ENDPOINT_URL_DYNAMODB` when both are
//! set (e.g. by `localstack/emulator up`, by LocalStack, or by CI); SQS's and S3's (dead
//! letters) from `AWS_ENDPOINT_URL_SQS` and `AWS_ENDPOINT_URL_S3`, else DynamoDB's. Otherwise
//! the harness starts kinesis-mock and moto itself through `localstack/emulator up`, on free ports, in a
//! state folder of its own, and has them stopped when the test process exits. If that fails,
//! the test fails, unless `KCL_SKIP_INTEGRATION=1` asks to skip it (never under `CI=true`): a
//! test that cannot run does not quietly pass.
//!
//! Every test gets its own stream and table names ([`Context::new`]), so tests can share one
//! pair of emulators and run side by side.

#![allow(clippy::print_stderr)]

pub mod fixture;
pub mod http;
pub mod items;
pub mod journal;
pub mod leases;
pub mod letters;
pub mod meter;
pub mod process;
pub mod tracker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{ShardIteratorType, StreamStatus};
use kcl_aws::DynamoDbLeaseStore;

pub use journal::{Event, read_events};
pub use leases::Leases;
pub use process::WorkerProcess;

/// Where the emulators answer.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// Kinesis endpoint URL.
    pub kinesis: String,
    /// DynamoDB endpoint URL.
    pub dynamodb: String,
    /// SQS endpoint URL (dead-letter queues): `AWS_ENDPOINT_URL_SQS`, else DynamoDB's (moto
    /// and LocalStack serve both on one port).
    pub sqs: String,
    /// S3 endpoint URL (dead letters), as SQS's: `AWS_ENDPOINT_URL_S3`, else DynamoDB's.
    pub s3: String,
}

impl Endpoints {
    fn new(kinesis: String, dynamodb: String, sqs: Option<String>, s3: Option<String>) -> Self {
        Self {
            sqs: sqs.unwrap_or_else(|| dynamodb.clone()),
            s3: s3.unwrap_or_else(|| dynamodb.clone()),
            kinesis,
            dynamodb,
        }
    }
}

static ENDPOINTS: OnceLock<Result<Endpoints, String>> = OnceLock::new();

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn env_endpoints() -> Option<Endpoints> {
    let kinesis = std::env::var("AWS_ENDPOINT_URL_KINESIS").ok()?;
    let dynamodb = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").ok()?;
    let sqs = std::env::var("AWS_ENDPOINT_URL_SQS").ok();
    let s3 = std::env::var("AWS_ENDPOINT_URL_S3").ok();
    Some(Endpoints::new(kinesis, dynamodb, sqs, s3))
}

/// Starts both emulators with `localstack/emulator up`, tied to this process.
fn start_emulators() -> Result<Endpoints, String> {
    let script = repo_root().join("localstack").join("emulator");
    let state = std::env::temp_dir().join(format!("kcl-emu-{}", std::process::id()));
    eprintln!(
        "kcl tests: no AWS_ENDPOINT_URL_KINESIS/DYNAMODB set: starting emulators ({})",
        state.display()
    );
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("up")
        .env("KCL_EMU_STATE_DIR", &state)
        .env("KCL_EMU_KINESIS_PORT", "auto")
        .env("KCL_EMU_DYNAMODB_PORT", "auto")
        .env("KCL_EMU_WATCH_PID", std::process::id().to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} up failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let value = |name: &str| {
        stdout.lines().find_map(|line| {
            line.strip_prefix("export ")?
                .strip_prefix(name)?
                .strip_prefix('=')
                .map(str::to_owned)
        })
    };
    match (
        value("AWS_ENDPOINT_URL_KINESIS"),
        value("AWS_ENDPOINT_URL_DYNAMODB"),
    ) {
        (Some(kinesis), Some(dynamodb)) => Ok(Endpoints::new(
            kinesis,
            dynamodb,
            value("AWS_ENDPOINT_URL_SQS"),
            value("AWS_ENDPOINT_URL_S3"),
        )),
        _ => Err(format!("unexpected output of emulator up: {stdout}")),
    }
}

fn skip_allowed() -> bool {
    !is_ci() && std::env::var("KCL_SKIP_INTEGRATION").is_ok_and(|v| v == "1")
}

/// The emulator endpoints; `Ok(None)` means "skip this test", only when
/// `KCL_SKIP_INTEGRATION=1` and not under `CI=true`.
pub fn endpoints() -> anyhow::Result<Option<Endpoints>> {
    let result = ENDPOINTS.get_or_init(|| env_endpoints().map_or_else(start_emulators, Ok));
    match result {
        Ok(e) => Ok(Some(e.clone())),
        Err(reason) if !skip_allowed() => bail!(
            "the emulators are unavailable: {reason}
(run `localstack/emulator up`; KCL_SKIP_INTEGRATION=1 skips these tests outside CI)"
        ),
        Err(reason) => {
            eprintln!("\n*** SKIPPED (KCL_SKIP_INTEGRATION=1): emulators unavailable: {reason}\n");
            Ok(None)
        }
    }
}

/// A unique suffix per call, across processes and runs.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// One test's world: its stream, its table, clients, and a folder for its files.
#[derive(Debug, Clone)]
pub struct Context {
    /// The endpoints.
    pub endpoints: Endpoints,
    /// This test's stream name.
    pub stream: String,
    /// This test's lease table (application) name.
    pub table: String,
    /// Kinesis client.
    pub kinesis: aws_sdk_kinesis::Client,
    /// DynamoDB client.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// A fresh folder for journals and logs.
    pub dir: PathBuf,
    /// Where the leases are: this test's DynamoDB table, unless made by
    /// [`new_postgres`](Self::new_postgres).
    pub leases: Leases,
}

impl Context {
    /// A context named after the test; `None` if the test is to be skipped.
    pub async fn new(test: &str) -> anyhow::Result<Option<Self>> {
        let Some(endpoints) = endpoints()? else {
            return Ok(None);
        };
        let name = unique(test);
        let dir = std::env::temp_dir().join("kcl-it").join(&name);
        std::fs::create_dir_all(&dir)?;
        let sdk = sdk_config().await;
        let kinesis = aws_sdk_kinesis::Client::from_conf(
            aws_sdk_kinesis::config::Builder::from(&sdk)
                .endpoint_url(&endpoints.kinesis)
                .build(),
        );
        let dynamodb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .endpoint_url(&endpoints.dynamodb)
                .build(),
        );
        eprintln!(
            "kcl tests: {test}: stream/table {name}, files in {}",
            dir.display()
        );
        Ok(Some(Self {
            endpoints,
            stream: format!("{name}-stream"),
            table: format!("{name}-app"),
            kinesis,
            dynamodb,
            dir,
            leases: Leases::DynamoDb,
        }))
    }

    /// A lease store on this test's DynamoDB table (whatever [`leases`](Self::leases) says:
    /// see [`list`](Self::list) for the rows the workers use).
    pub fn store(&self) -> DynamoDbLeaseStore {
        DynamoDbLeaseStore::from_client(self.dynamodb.clone(), self.table.clone())
    }

    /// A lease store on this test's table that reads the table's stream as its change feed
    /// (served on the DynamoDB endpoint by moto and LocalStack).
    pub async fn store_with_feed(&self) -> DynamoDbLeaseStore {
        self.store()
            .with_change_feed_client(self.streams_client().await)
    }

    /// A DynamoDB Streams client on the emulator (moto serves it on the DynamoDB endpoint).
    pub async fn streams_client(&self) -> aws_sdk_dynamodbstreams::Client {
        let sdk = sdk_config().await;
        aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
                .endpoint_url(&self.endpoints.dynamodb)
                .build(),
        )
    }

    /// The tests' SDK settings with every service at `endpoint`, for constructors that take
    /// an `SdkConfig` (kcl-aws's dead-letter sinks and readers).
    pub async fn sdk_at(&self, endpoint: &str) -> SdkConfig {
        sdk_config()
            .await
            .into_builder()
            .endpoint_url(endpoint)
            .build()
    }

    /// An SQS client on the emulator (dead-letter queues).
    pub async fn sqs_client(&self) -> aws_sdk_sqs::Client {
        let sdk = sdk_config().await;
        aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::config::Builder::from(&sdk)
                .endpoint_url(&self.endpoints.sqs)
                .build(),
        )
    }

    /// An S3 client on the emulator, path-style (`http://host/bucket/key`), as emulators need.
    pub async fn s3_client(&self) -> aws_sdk_s3::Client {
        let sdk = sdk_config().await;
        aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk)
                .endpoint_url(&self.endpoints.s3)
                .force_path_style(true)
                .build(),
        )
    }

    /// Environment for worker processes: endpoints, region, credentials, capped SDK retries.
    pub fn worker_env(&self) -> Vec<(String, String)> {
        let or = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        vec![
            (
                "AWS_ENDPOINT_URL_KINESIS".into(),
                self.endpoints.kinesis.clone(),
            ),
            (
                "AWS_ENDPOINT_URL_DYNAMODB".into(),
                self.endpoints.dynamodb.clone(),
            ),
            // The lease table's stream (Coordination::Leader): served on the same port by
            // moto and LocalStack (and through a request meter standing in front of it).
            (
                "AWS_ENDPOINT_URL_DYNAMODB_STREAMS".into(),
                self.endpoints.dynamodb.clone(),
            ),
            ("AWS_ENDPOINT_URL_SQS".into(), self.endpoints.sqs.clone()),
            ("AWS_ENDPOINT_URL_S3".into(), self.endpoints.s3.clone()),
            ("AWS_REGION".into(), or("AWS_REGION", "us-east-1")),
            ("AWS_ACCESS_KEY_ID".into(), or("AWS_ACCESS_KEY_ID", "test")),
            (
                "AWS_SECRET_ACCESS_KEY".into(),
                or("AWS_SECRET_ACCESS_KEY", "test"),
            ),
            ("AWS_MAX_ATTEMPTS".into(), "2".into()),
            (
                "RUST_LOG".into(),
                or("KCL_TEST_WORKER_LOG", "info,aws=warn"),
            ),
        ]
    }

    /// Creates this test's stream with `shards` shards and waits until it is ACTIVE.
    pub async fn create_stream(&self, shards: i32) -> anyhow::Result<()> {
        self.kinesis
            .create_stream()
            .stream_name(&self.stream)
            .shard_count(shards)
            .send()
            .await
            .context("CreateStream")?;
        self.wait_stream_active().await
    }

    /// Waits until the stream is ACTIVE (after creation or resharding).
    pub async fn wait_stream_active(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self
                .kinesis
                .describe_stream_summary()
                .stream_name(&self.stream)
                .send()
                .await;
            let active = out.is_ok_and(|out| {
                out.stream_description_summary()
                    .is_some_and(|s| s.stream_status() == &StreamStatus::Active)
            });
            if active {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "stream {} never became ACTIVE",
                self.stream
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes records with PutRecords (batches of up to 500), retrying failed entries.
    pub async fn put(&self, records: &[(String, String)]) -> anyhow::Result<()> {
        Ok(kcl_aws::producer::put_records(&self.kinesis, &self.stream, records).await?)
    }

    /// Writes one record of arbitrary bytes (e.g. a KPL aggregate) with PutRecord; returns
    /// its shard and sequence number.
    pub async fn put_bytes(&self, pk: &str, data: &[u8]) -> anyhow::Result<(String, String)> {
        let out = self
            .kinesis
            .put_record()
            .stream_name(&self.stream)
            .partition_key(pk)
            .data(Blob::new(data))
            .send()
            .await
            .context("PutRecord")?;
        Ok((out.shard_id().to_owned(), out.sequence_number().to_owned()))
    }

    /// Writes one record with PutRecord; returns its shard and sequence number.
    pub async fn put_one(&self, pk: &str, data: &str) -> anyhow::Result<(String, String)> {
        let out = self
            .kinesis
            .put_record()
            .stream_name(&self.stream)
            .partition_key(pk)
            .data(Blob::new(data.as_bytes()))
            .send()
            .await
            .context("PutRecord")?;
        Ok((out.shard_id().to_owned(), out.sequence_number().to_owned()))
    }

    /// [`put_one`](Self::put_one), tried again every 100 ms while it fails (a stream being
    /// resharded refuses puts for a moment), 50 times at most.
    pub async fn put_retried(&self, pk: &str, data: &str) -> anyhow::Result<()> {
        let mut tries = 0;
        while let Err(e) = self.put_one(pk, data).await {
            tries += 1;
            anyhow::ensure!(tries < 50, "PutRecord keeps failing: {e:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Every record of one shard, read from TRIM_HORIZON: `(sequence number, data)`.
    pub async fn read_shard(&self, shard: &str) -> anyhow::Result<Vec<(String, String)>> {
        let mut iterator = self
            .kinesis
            .get_shard_iterator()
            .stream_name(&self.stream)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await?
            .shard_iterator
            .context("no iterator")?;
        let mut records = Vec::new();
        loop {
            let out = self
                .kinesis
                .get_records()
                .shard_iterator(&iterator)
                .limit(1000)
                .send()
                .await?;
            let empty = out.records.is_empty();
            for r in out.records {
                records.push((
                    r.sequence_number,
                    String::from_utf8_lossy(r.data.as_ref()).into_owned(),
                ));
            }
            match out.next_shard_iterator {
                Some(next) if !empty || out.millis_behind_latest.unwrap_or(0) > 0 => {
                    iterator = next;
                }
                _ => break,
            }
        }
        Ok(records)
    }

    /// The owner of every shard lease, by lease key (singleton rows left out), from the
    /// store the workers use ([`leases`](Self::leases)).
    pub async fn owners(&self) -> anyhow::Result<BTreeMap<String, Option<String>>> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
            .map(|l| {
                (
                    l.key.as_str().to_owned(),
                    l.owner.map(|o| o.as_str().to_owned()),
                )
            })
            .collect())
    }

    /// The same test world (table, clients, folder) on another stream, named after this
    /// one's with `suffix`.
    #[must_use]
    pub fn on(&self, suffix: &str) -> Self {
        Self {
            stream: format!("{}-{suffix}", self.stream),
            ..self.clone()
        }
    }

    /// A path in this test's folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

async fn sdk_config() -> SdkConfig {
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region))
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3));
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        loader =
            loader.credentials_provider(Credentials::new("test", "test", None, None, "kcl-tests"));
    }
    loader.load().await
}

/// Polls `check` every `every` until it returns true; fails after `limit`. Returns the time
/// it took.
pub async fn wait_until<F>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: AsyncFnMut() -> anyhow::Result<bool>,
{
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs a test body with an overall timeout.
pub async fn with_timeout<F>(limit: Duration, body: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    match tokio::time::timeout(limit, body).await {
        Ok(result) => result,
        Err(_) => bail!("test timed out after {limit:?}"),
    }
}

/// How many leases each owner holds (`None` = unowned).
pub fn count_by_owner(
    owners: &BTreeMap<String, Option<String>>,
) -> BTreeMap<Option<String>, usize> {
    let mut by = BTreeMap::new();
    for owner in owners.values() {
        *by.entry(owner.clone()).or_default() += 1;
    }
    by
}

/// Writes records in the background until stopped: `batch` records every `every`, with
/// payloads `{prefix}{i}` and partition keys cycling over 32 keys.
#[derive(Debug)]
pub struct Producer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Vec<String>>>,
}

impl Producer {
    /// Starts writing to the context's stream.
    pub fn start(ctx: &Context, prefix: &str, batch: usize, every: Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let ctx = ctx.clone();
            let stop = stop.clone();
            let prefix = prefix.to_owned();
            tokio::spawn(async move {
                let mut written = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let records: Vec<(String, String)> = (i..i + batch)
                        .map(|n| (format!("pk-{}", n % 32), format!("{prefix}{n}")))
                        .collect();
                    i += batch;
                    ctx.put(&records).await?;
                    written.extend(records.into_iter().map(|(_, d)| d));
                    tokio::time::sleep(every).await;
                }
                Ok(written)
            })
        };
        Self { stop, task }
    }

    /// Stops writing; returns every payload written.
    pub async fn stop(self) -> anyhow::Result<Vec<String>> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

/// Starts worker `a`, waits until it owns all `shards` leases and delivered at least
/// `delivered_first` records, then starts worker `b` and waits until each owns half. Returns
/// both and the time from `b`'s start (its `started` journal line) until the table showed
/// the even split.
pub async fn balanced_pair(
    bin: &str,
    ctx: &Context,
    shards: usize,
    delivered_first: usize,
    extra: &[&str],
) -> anyhow::Result<(WorkerProcess, WorkerProcess, Duration)> {
    let a = WorkerProcess::spawn(bin, ctx, "worker-a", extra)?;
    wait_until(
        "worker-a to own every lease",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            // The table may not exist yet.
            let by = count_by_owner(&ctx.owners().await.unwrap_or_default());
            Ok(by.get(&Some("worker-a".to_owned())) == Some(&shards))
        },
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    wait_until(
        "worker-a to deliver the first records",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(journal::delivered(&a.events()?).len() >= delivered_first),
    )
    .await?;
    let b = WorkerProcess::spawn(bin, ctx, "worker-b", extra)?;
    let half = shards / 2;
    wait_until(
        "an even split",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let by = count_by_owner(&ctx.owners().await?);
            Ok(by.get(&Some("worker-a".to_owned())) == Some(&half)
                && by.get(&Some("worker-b".to_owned())) == Some(&half))
        },
    )
    .await
    .map_err(|e| e.context(format!("{}\n---\n{}", a.log_tail(), b.log_tail())))?;
    let now = chrono::Utc::now().timestamp_millis();
    let started = b
        .events()?
        .iter()
        .find(|e| e.event == "started")
        .map(|e| e.ms)
        .context("worker-b wrote no started line")?;
    let took = Duration::from_millis(u64::try_from(now - started).unwrap_or(0));
    Ok((a, b, took))
}
