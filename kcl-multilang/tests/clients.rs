//! The KCL client libraries, installed unchanged from their registries by `scripts/clients`,
//! under the `kcl-multilang` binary against the emulators:
//! - amazon_kclpy's own sample record processor (PyPI `kclpy-ext`): every record of a 4-shard
//!   stream reaches a child and is checkpointed; after a SIGKILL of the daemon a new one
//!   resumes from those checkpoints, delivering exactly what came after them; SIGTERM gives
//!   each child `shutdownRequested` and leaves every lease unowned.
//! - npm `aws-kcl` with a consumer laid out as its README lays one out, under two daemons on a
//!   stream that splits a shard mid-run: every record delivered, in order per child, the
//!   parent before its children, `shardEnded` at the parent's end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::{Context, repo_root, wait_until, with_timeout};
use tokio::process::{Child, Command};

/// What `scripts/clients` installs: from the environment (`scripts/test` sets it), else
/// installed now.
struct Clients {
    /// A Python with amazon_kclpy.
    python: String,
    /// amazon_kclpy's sample app.
    kclpy_sample: String,
    /// A node_modules with aws-kcl.
    node_path: String,
}

const EXPORTS: [&str; 3] = [
    "KCL_TEST_KCLPY_PYTHON",
    "KCL_TEST_KCLPY_SAMPLE",
    "KCL_TEST_NODE_PATH",
];

fn clients() -> anyhow::Result<Clients> {
    let from_env: Option<Vec<String>> = EXPORTS.iter().map(|n| std::env::var(n).ok()).collect();
    let values = match from_env {
        Some(values) => values,
        None => {
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
            EXPORTS
                .iter()
                .map(|n| value(n))
                .collect::<Option<Vec<_>>>()
                .with_context(|| format!("unexpected output of scripts/clients: {exports}"))?
        }
    };
    let [python, kclpy_sample, node_path] = <[String; 3]>::try_from(values)
        .map_err(|_| anyhow::anyhow!("three client settings expected"))?;
    Ok(Clients {
        python,
        kclpy_sample,
        node_path,
    })
}

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
        let log = ctx.path(&format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_kcl-multilang"))
            .arg("--properties-file")
            .arg(properties)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
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

/// A properties file for `worker` running `executable` (language: `language`).
fn properties(
    ctx: &Context,
    executable: &str,
    language: &str,
    worker: &str,
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
         idleTimeBetweenReadsInMillis = 250\n",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kclpy_sample_processes_resumes_after_a_kill_and_hands_back() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kclpy").await? else {
        return Ok(());
    };
    let clients = clients()?;
    let sample = format!("{} {}", clients.python, clients.kclpy_sample);
    let properties = |worker| properties(&ctx, &sample, "python/3", worker);
    with_timeout(Duration::from_secs(240), async {
        ctx.create_stream(4).await?;
        put(&ctx, 0, 200).await?;
        let first = last_by_shard(&ctx).await?;
        assert_eq!(first.len(), 4, "records on every shard");

        // Everything processed and checkpointed by the sample (it checkpoints its largest
        // sequence number after its first batch), then the daemon killed.
        let mut one = Daemon::start(&ctx, &properties("w-1")?, "w-1", &[])?;
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
        let mut two = Daemon::start(&ctx, &properties("w-2")?, "w-2", &[])?;
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

/// One line of the Node consumer's journal.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    call: String,
    shard_id: Option<String>,
    pid: u32,
    sequence_number: Option<String>,
}

/// Sequence numbers in stream order (decimal strings longer than a u128 holds).
fn stream_order(sequence: &str) -> (usize, &str) {
    (sequence.len(), sequence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_kcl_readme_consumer_follows_a_split_under_two_daemons() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("aws-kcl").await? else {
        return Ok(());
    };
    let clients = clients()?;
    let consumer = repo_root().join("kcl-multilang/tests/children/readme_consumer.js");
    let executable = format!("node {}", consumer.display());
    let journal = ctx.path("journal.jsonl");
    let journal_path = journal.to_string_lossy().into_owned();
    let env = [
        ("NODE_PATH", clients.node_path.as_str()),
        ("KCL_OUT", journal_path.as_str()),
    ];
    with_timeout(Duration::from_secs(240), async {
        ctx.create_stream(2).await?;
        put(&ctx, 0, 100).await?;
        let first = last_by_shard(&ctx).await?;
        let mut daemons = Vec::new();
        for worker in ["w-1", "w-2"] {
            let properties = properties(&ctx, &executable, "nodejs", worker)?;
            daemons.push(Daemon::start(&ctx, &properties, worker, &env)?);
        }
        let logs = |daemons: &[Daemon]| daemons.iter().map(Daemon::log).collect::<String>();
        wait_until(
            "checkpoints at the end of both shards",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &first).await,
        )
        .await
        .with_context(|| logs(&daemons))?;

        // The shard holding the low half of the key space split in two, then more records.
        let listed = ctx
            .kinesis
            .list_shards()
            .stream_name(&ctx.stream)
            .send()
            .await?;
        let low = listed
            .shards()
            .iter()
            .find(|s| {
                s.hash_key_range()
                    .is_some_and(|r| r.starting_hash_key() == "0")
            })
            .context("no shard starts at hash key 0")?;
        let end: u128 = low
            .hash_key_range()
            .map(|r| r.ending_hash_key().parse())
            .transpose()?
            .context("no hash key range")?;
        let parent = low.shard_id().to_owned();
        ctx.kinesis
            .split_shard()
            .stream_name(&ctx.stream)
            .shard_to_split(&parent)
            .new_starting_hash_key((end / 2 + 1).to_string())
            .send()
            .await?;
        ctx.wait_stream_active().await?;
        put(&ctx, 100, 100).await?;
        let second = last_by_shard(&ctx).await?;
        assert_eq!(
            second.get(&parent).map(String::as_str),
            Some(Checkpoint::SHARD_END),
            "the split parent is closed: {second:?}"
        );
        wait_until(
            "the parent ended and every open shard checkpointed",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &second).await,
        )
        .await
        .with_context(|| logs(&daemons))?;

        // SIGTERM: both daemons hand their leases back and exit 0.
        for daemon in &daemons {
            daemon.signal("-TERM")?;
        }
        for daemon in &mut daemons {
            let status = daemon.wait(Duration::from_secs(40)).await?;
            assert!(status.success(), "{status}: {}", daemon.log());
        }
        let owners = ctx.owners().await?;
        assert!(
            owners.values().all(Option::is_none),
            "leases left owned: {owners:?}"
        );
        let logs = logs(&daemons);
        assert!(
            !logs.contains("child failed"),
            "no child failed (the README's second status after shardEnded included): {logs}"
        );

        let entries: Vec<Entry> = std::fs::read_to_string(&journal)?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        check_journal(&ctx, &entries, &parent).await
    })
    .await
}

/// Every record delivered; in order within each child process; the split parent's records
/// all before any of its children's; `shardEnded` for the parent.
async fn check_journal(ctx: &Context, entries: &[Entry], parent: &str) -> anyhow::Result<()> {
    let listed = ctx
        .kinesis
        .list_shards()
        .stream_name(&ctx.stream)
        .send()
        .await?;
    let mut written = BTreeSet::new();
    let mut children = Vec::new();
    for shard in listed.shards() {
        if shard.parent_shard_id() == Some(parent) {
            children.push(shard.shard_id().to_owned());
        }
        for (sequence, _) in ctx.read_shard(shard.shard_id()).await? {
            written.insert(sequence);
        }
    }
    assert_eq!(written.len(), 200);
    assert_eq!(children.len(), 2, "a split makes two children");

    let records: Vec<(usize, &Entry, &str)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.call == "record")
        .filter_map(|(i, e)| Some((i, e, e.sequence_number.as_deref()?)))
        .collect();
    let delivered: BTreeSet<String> = records.iter().map(|(_, _, s)| (*s).to_owned()).collect();
    assert_eq!(delivered, written, "every record reached a child");
    eprintln!(
        "aws-kcl: {} deliveries of {} records",
        records.len(),
        written.len()
    );

    let mut last_by_process: BTreeMap<u32, &str> = BTreeMap::new();
    for (_, entry, sequence) in &records {
        if let Some(before) = last_by_process.insert(entry.pid, sequence) {
            assert!(
                stream_order(before) < stream_order(sequence),
                "child {} got {sequence} after {before}",
                entry.pid
            );
        }
    }
    let on = |shard: &str| -> Vec<usize> {
        records
            .iter()
            .filter(|(_, e, _)| e.shard_id.as_deref() == Some(shard))
            .map(|(i, _, _)| *i)
            .collect()
    };
    let parent_done = on(parent)
        .into_iter()
        .max()
        .context("the parent delivered nothing")?;
    for child in &children {
        let started = on(child).into_iter().min();
        assert!(
            started.is_none_or(|s| s > parent_done),
            "{child} delivered before its parent {parent} was done"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e.call == "shardEnded" && e.shard_id.as_deref() == Some(parent)),
        "the parent's child was told shardEnded"
    );
    Ok(())
}
