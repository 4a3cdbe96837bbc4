//! The `kcl-multilang` binary on the emulators, as users run it:
//! - `clients`: the KCL client libraries, installed unchanged from their registries by
//!   `scripts/clients` — amazon_kclpy's own sample (PyPI `kclpy-ext`) through a SIGKILL and a
//!   SIGTERM, and npm `aws-kcl` with a consumer laid out as its README lays one out, through
//!   a SIGKILL, two daemons resuming, a shard split and a SIGTERM;
//! - `failures`: children that crash, hang or break the protocol cost their shard a restart,
//!   not the daemon (or exit it, with `--exit-on-child-failure`); a bad properties file is an
//!   exit status of 2 naming the key;
//! - `poison`: a processor on amazon_kclpy (unchanged) that raises on one record: kclpy reports
//!   it on stderr and answers anyway, and the daemon fails the batch all the same, so the
//!   failure policy bisects it and dead-letters the record (`childErrorsFailBatch`), in the
//!   same child (ten such records, no restart); with the key false, the batch counts as
//!   processed, as under the Java daemon; a SIGTERM while the record waits for its next try,
//!   the child having raised or crashed on it, is a clean stop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod clients;
mod failures;
mod fleet;
mod poison;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::http::{http_get, serving_addr};
use kcl_integration_tests::{Context, wait_until};
use tokio::process::{Child, Command};

/// A `kcl-multilang` process, its stderr (the JSON log) in a file.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(
        ctx: &Context,
        properties: &Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_with(ctx, properties, name, env, &[])
    }

    /// [`Daemon::start`] with more arguments.
    fn start_with(
        ctx: &Context,
        properties: &Path,
        name: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let log = ctx.path(&format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
            .arg("--properties-file")
            .arg(properties)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .envs(ctx.worker_env())
            .env("KCL_LOG_FILTER", "info,aws=warn")
            .envs(env.iter().copied())
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

    /// `/healthz`, `/readyz` (once started), `/status` and `/metrics` on the address the
    /// daemon logged.
    async fn check_http(&self) -> anyhow::Result<()> {
        let log = self.log();
        let mut lines = log.lines().map(str::to_owned);
        let addr = serving_addr(|| lines.next());
        wait_until(
            "ready",
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || Ok(http_get(addr, "/readyz").is_some_and(|(code, _)| code == 200)),
        )
        .await?;
        for path in ["/healthz", "/status", "/metrics"] {
            let (code, body) = http_get(addr, path).with_context(|| format!("GET {path}"))?;
            anyhow::ensure!(code == 200, "GET {path}: {code} {body}");
            if path == "/metrics" {
                anyhow::ensure!(body.contains("kcl_leases_held"), "{body}");
            }
        }
        Ok(())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sequence numbers the sample app logged (to stderr, which the daemon logs).
    fn kclpy_delivered(&self) -> BTreeSet<String> {
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

/// A properties file for `worker` running `executable` (language: `language`), with `extra`
/// lines at the end.
fn properties(
    ctx: &Context,
    executable: &str,
    language: &str,
    worker: &str,
    extra: &str,
) -> anyhow::Result<PathBuf> {
    let path = ctx.path(&format!("{worker}.properties"));
    let text = format!(
        "# The samples' own properties, pointed at the emulators.\n\
         executableName = {executable}\n\
         streamName = {stream}\n\
         applicationName = {app}\n\
         workerId = {worker}\n\
         AwsCredentialsProvider = DefaultCredentialsProvider\n\
         processingLanguage = {language}\n\
         initialPositionInStream = TRIM_HORIZON\n\
         regionName = us-east-1\n\
         kinesisEndpoint = {kinesis}\n\
         dynamoDBEndpoint = {dynamodb}\n\
         retrievalMode = POLLING\n\
         failoverTimeMillis = 5000\n\
         idleTimeBetweenReadsInMillis = 250\n\
         {extra}",
        stream = ctx.stream,
        app = ctx.table,
        kinesis = ctx.endpoints.kinesis,
        dynamodb = ctx.endpoints.dynamodb,
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Where each shard's checkpoint should end up: `SHARD_END` for a closed shard, else its last
/// record's sequence number (a shard without records is left out).
async fn last_by_shard(ctx: &Context) -> anyhow::Result<BTreeMap<String, String>> {
    let shards = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut last = BTreeMap::new();
    for shard in shards.shards() {
        let id = shard.shard_id().to_owned();
        let closed = shard
            .sequence_number_range()
            .is_some_and(|r| r.ending_sequence_number().is_some());
        if closed {
            last.insert(id, Checkpoint::SHARD_END.to_owned());
        } else if let Some((sequence, _)) = ctx.read_shard(&id).await?.pop() {
            last.insert(id, sequence);
        }
    }
    Ok(last)
}

/// Whether every shard's lease is checkpointed where [`last_by_shard`] says.
async fn checkpointed(ctx: &Context, last: &BTreeMap<String, String>) -> anyhow::Result<bool> {
    // The daemon creates the table: until then, nothing is checkpointed.
    let Ok(leases) = ctx.store().list().await else {
        return Ok(false);
    };
    Ok(last.iter().all(|(shard, want)| {
        leases.iter().any(|l| {
            l.key.as_str() == shard
                && match &l.checkpoint {
                    Checkpoint::Sequence(s) => s.sequence.as_str() == want,
                    Checkpoint::ShardEnd => want == Checkpoint::SHARD_END,
                    _ => false,
                }
        })
    }))
}

async fn put(ctx: &Context, from: usize, count: usize) -> anyhow::Result<()> {
    let records: Vec<(String, String)> = (from..from + count)
        .map(|i| (format!("pk-{i}"), format!("record-{i}")))
        .collect();
    ctx.put(&records).await
}

/// One line of a child's journal (`$KCL_OUT`): the Node consumer and `journaled.py` write
/// the same.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    call: String,
    shard_id: Option<String>,
    pid: u32,
    sequence_number: Option<String>,
    /// When, in epoch seconds.
    #[serde(default)]
    t: f64,
    /// The child's process group (`initialize`, `journaled.py` only).
    pgid: Option<u32>,
}

/// Sequence numbers in stream order (decimal strings longer than a u128 holds).
fn stream_order(sequence: &str) -> (usize, &str) {
    (sequence.len(), sequence)
}

/// The journal's lines.
fn journal(path: &Path) -> anyhow::Result<Vec<Entry>> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|line| serde_json::from_str(line).with_context(|| format!("journal line {line}")))
        .collect()
}
