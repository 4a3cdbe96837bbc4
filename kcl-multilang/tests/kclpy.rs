//! amazon_kclpy's own sample record processor (PyPI `kclpy-ext`, unchanged, installed by
//! `scripts/clients`) under the `kcl-multilang` binary, against the emulators: every record of
//! a 4-shard stream reaches a child and is checkpointed in the lease table; after a SIGKILL
//! of the daemon a new one resumes from those checkpoints, delivering exactly what came after
//! them; SIGTERM gives each child `shutdownRequested` and leaves every lease unowned.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::{Context, repo_root, wait_until, with_timeout};
use tokio::process::{Child, Command};

/// The Python with amazon_kclpy, and the sample app: from the environment (`scripts/test`
/// sets them), else installed now by `scripts/clients`.
fn kclpy() -> anyhow::Result<(String, String)> {
    if let (Ok(python), Ok(sample)) = (
        std::env::var("KCL_TEST_KCLPY_PYTHON"),
        std::env::var("KCL_TEST_KCLPY_SAMPLE"),
    ) {
        return Ok((python, sample));
    }
    let out = std::process::Command::new(repo_root().join("scripts/clients"))
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/clients")?;
    if !out.status.success() {
        bail!("scripts/clients failed: the KCL client libraries could not be installed");
    }
    let exports = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = |name: &str| {
        exports
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(str::to_owned)
    };
    match (
        value("KCL_TEST_KCLPY_PYTHON"),
        value("KCL_TEST_KCLPY_SAMPLE"),
    ) {
        (Some(python), Some(sample)) => Ok((python, sample)),
        _ => bail!("unexpected output of scripts/clients: {exports}"),
    }
}

struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(ctx: &Context, properties: &Path, name: &str) -> anyhow::Result<Self> {
        let log = ctx.path(&format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
            .arg("--properties-file")
            .arg(properties)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .envs(ctx.worker_env())
            .env("KCL_LOG_FILTER", "info,aws=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { child, log })
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("already exited")?;
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    async fn wait(&mut self, limit: Duration) -> anyhow::Result<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .context("the daemon did not exit")?
            .map_err(Into::into)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sequence numbers the sample app logged (to stderr, which the daemon logs).
    fn delivered(&self) -> BTreeSet<String> {
        let log = self.log();
        log.split("Sequence Number: ")
            .skip(1)
            .filter_map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                (!digits.is_empty()).then_some(digits)
            })
            .collect()
    }
}

fn properties(ctx: &Context, python: &str, sample: &str, worker: &str) -> anyhow::Result<PathBuf> {
    let path = ctx.path(&format!("{worker}.properties"));
    let text = format!(
        "# The sample's own properties, pointed at the emulators.\n\
         executableName = {python} {sample}\n\
         streamName = {stream}\n\
         applicationName = {app}\n\
         workerId = {worker}\n\
         AwsCredentialsProvider = DefaultCredentialsProvider\n\
         processingLanguage = python/3\n\
         initialPositionInStream = TRIM_HORIZON\n\
         regionName = us-east-1\n\
         kinesisEndpoint = {kinesis}\n\
         dynamoDBEndpoint = {dynamodb}\n\
         retrievalMode = POLLING\n\
         failoverTimeMillis = 5000\n\
         idleTimeBetweenReadsInMillis = 250\n",
        stream = ctx.stream,
        app = ctx.table,
        kinesis = ctx.endpoints.kinesis,
        dynamodb = ctx.endpoints.dynamodb,
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The last sequence number of each shard.
async fn last_by_shard(ctx: &Context) -> anyhow::Result<BTreeMap<String, String>> {
    let shards = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut last = BTreeMap::new();
    for shard in shards.shards() {
        let records = ctx.read_shard(shard.shard_id()).await?;
        if let Some((sequence, _)) = records.last() {
            last.insert(shard.shard_id().to_owned(), sequence.clone());
        }
    }
    Ok(last)
}

/// Whether every shard's lease is checkpointed at its last record.
async fn checkpointed(ctx: &Context, last: &BTreeMap<String, String>) -> anyhow::Result<bool> {
    // The daemon creates the table: until then, nothing is checkpointed.
    let Ok(leases) = ctx.store().list().await else {
        return Ok(false);
    };
    Ok(last.iter().all(|(shard, sequence)| {
        leases.iter().any(|l| {
            l.key.as_str() == shard
                && matches!(&l.checkpoint, Checkpoint::Sequence(s) if s.sequence.as_str() == sequence)
        })
    }))
}

async fn put(ctx: &Context, from: usize, count: usize) -> anyhow::Result<()> {
    let records: Vec<(String, String)> = (from..from + count)
        .map(|i| (format!("pk-{i}"), format!("record-{i}")))
        .collect();
    ctx.put(&records).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kclpy_sample_processes_resumes_after_a_kill_and_hands_back() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kclpy").await? else {
        return Ok(());
    };
    let (python, sample) = kclpy()?;
    with_timeout(Duration::from_secs(240), async {
        ctx.create_stream(4).await?;
        put(&ctx, 0, 200).await?;
        let first = last_by_shard(&ctx).await?;
        assert_eq!(first.len(), 4, "records on every shard");

        // Everything processed and checkpointed by the sample (it checkpoints its largest
        // sequence number after its first batch), then the daemon killed.
        let mut one = Daemon::start(&ctx, &properties(&ctx, &python, &sample, "w-1")?, "w-1")?;
        let took = wait_until(
            "checkpoints at the end of every shard",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &first).await,
        )
        .await
        .with_context(|| one.log())?;
        eprintln!("first daemon: every shard checkpointed after {took:?}");
        one.signal("-KILL")?;
        one.wait(Duration::from_secs(10)).await?;

        // A new daemon takes over after the failover time and gets exactly what came after.
        put(&ctx, 200, 100).await?;
        let second = last_by_shard(&ctx).await?;
        let mut two = Daemon::start(&ctx, &properties(&ctx, &python, &sample, "w-2")?, "w-2")?;
        wait_until(
            "the new records checkpointed",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &second).await,
        )
        .await
        .with_context(|| two.log())?;

        // SIGTERM: every child is asked to checkpoint, the leases go back, exit 0.
        two.signal("-TERM")?;
        let status = two.wait(Duration::from_secs(40)).await?;
        let log = two.log();
        assert!(status.success(), "{status}: {log}");
        let asked = log
            .matches("Shutdown has been requested, checkpointing.")
            .count();
        assert_eq!(
            asked, 4,
            "each of the 4 children got shutdownRequested: {log}"
        );
        let owners = ctx.owners().await?;
        assert!(
            owners.values().all(Option::is_none),
            "leases left owned: {owners:?}"
        );

        // Delivered in the second run: the 100 new records, nothing checkpointed before.
        let mut expected = BTreeSet::new();
        for shard in second.keys() {
            for (sequence, data) in ctx.read_shard(shard).await? {
                let i: usize = data.trim_start_matches("record-").parse()?;
                if i >= 200 {
                    expected.insert(sequence);
                }
            }
        }
        assert_eq!(expected.len(), 100);
        assert_eq!(two.delivered(), expected, "the second daemon's deliveries");
        Ok(())
    })
    .await
}
