//! The KCL client libraries under the daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kcl_core::Checkpoint;
use kcl_integration_tests::{Context, repo_root, wait_until, with_timeout};

use super::{Daemon, Entry, checkpointed, journal, last_by_shard, properties, put, stream_order};

/// What `scripts/clients` installs: from the environment (`scripts/test` sets it), else
/// installed now.
pub(super) struct Clients {
    /// A Python with amazon_kclpy.
    pub(super) python: String,
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

pub(super) fn clients() -> anyhow::Result<Clients> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kclpy_sample_processes_resumes_after_a_kill_and_hands_back() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kclpy").await? else {
        return Ok(());
    };
    let clients = clients()?;
    let sample = format!("{} {}", clients.python, clients.kclpy_sample);
    let properties = |worker| properties(&ctx, &sample, "python/3", worker, "");
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
        assert_eq!(
            two.kclpy_delivered(),
            expected,
            "the second daemon's deliveries"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_kcl_readme_consumer_resumes_after_a_kill_and_follows_a_split() -> anyhow::Result<()>
{
    let Some(ctx) = Context::new("aws-kcl").await? else {
        return Ok(());
    };
    let clients = clients()?;
    let consumer = repo_root().join("kcl-multilang/tests/children/readme_consumer.js");
    let executable = format!("node {}", consumer.display());
    let journal_path = ctx.path("journal.jsonl");
    let journal_text = journal_path.to_string_lossy().into_owned();
    let env = [
        ("NODE_PATH", clients.node_path.as_str()),
        ("KCL_OUT", journal_text.as_str()),
    ];
    let start = |worker: &str, name: &str| {
        let properties = properties(&ctx, &executable, "nodejs", worker, "")?;
        Daemon::start(&ctx, &properties, name, &env)
    };
    let logs = |daemons: &[Daemon]| daemons.iter().map(Daemon::log).collect::<String>();
    with_timeout(Duration::from_secs(240), async {
        ctx.create_stream(4).await?;
        put(&ctx, 0, 100).await?;
        let first = last_by_shard(&ctx).await?;

        // One daemon: every record checkpointed, its probes and metrics served; then SIGKILL.
        let mut one = start("w-1", "w-1")?;
        wait_until(
            "checkpoints at the end of every shard",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &first).await,
        )
        .await
        .with_context(|| one.log())?;
        one.check_http().await?;
        one.signal("-KILL")?;
        one.wait(Duration::from_secs(10)).await?;
        let before_kill = journal(&journal_path)?.len();

        // Two daemons take over from the checkpoints.
        let mut daemons = vec![start("w-1", "w-1-again")?, start("w-2", "w-2")?];
        put(&ctx, 100, 100).await?;
        let resumed = last_by_shard(&ctx).await?;
        wait_until(
            "the new records checkpointed",
            Duration::from_secs(90),
            Duration::from_millis(500),
            async || checkpointed(&ctx, &resumed).await,
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
        put(&ctx, 200, 100).await?;
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

        // Each open shard with a child that can be asked: a lease the leader is moving between
        // the daemons has none while it is handed over, and neither has one to ask then.
        let open: BTreeSet<&str> = second
            .iter()
            .filter(|(_, c)| *c != Checkpoint::SHARD_END)
            .map(|(shard, _)| shard.as_str())
            .collect();
        let mut before_term = 0;
        wait_until(
            "a child serving each open shard",
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || {
                let entries = journal(&journal_path)?;
                before_term = entries.len();
                Ok(serving(&entries).is_superset(&open))
            },
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

        let entries = journal(&journal_path)?;
        // Each child alive at SIGTERM, one per open shard, was asked to checkpoint (as is one
        // handed over to the other daemon since).
        let asked: BTreeSet<&str> = entries[before_term..]
            .iter()
            .filter(|e| e.call == "shutdownRequested")
            .filter_map(|e| e.shard_id.as_deref())
            .collect();
        assert_eq!(asked, open, "shutdownRequested for each open shard");
        check_journal(&ctx, &entries, before_kill, &parent).await
    })
    .await
}

/// The shards with a child that initialized and was not told to stop since.
fn serving(entries: &[Entry]) -> BTreeSet<&str> {
    let mut by_child: BTreeMap<u32, (&str, bool)> = BTreeMap::new();
    for entry in entries {
        let Some(shard) = entry.shard_id.as_deref() else {
            continue;
        };
        match entry.call.as_str() {
            "initialize" => {
                by_child.insert(entry.pid, (shard, true));
            }
            "shutdownRequested" | "leaseLost" | "shardEnded" => {
                by_child.insert(entry.pid, (shard, false));
            }
            _ => {}
        }
    }
    by_child
        .into_values()
        .filter_map(|(shard, alive)| alive.then_some(shard))
        .collect()
}

/// Every record delivered, none checkpointed before the kill (`entries[..before_kill]`)
/// delivered again; in order within each child process; the split parent's records all
/// before any of its children's; `shardEnded` for the parent.
async fn check_journal(
    ctx: &Context,
    entries: &[Entry],
    before_kill: usize,
    parent: &str,
) -> anyhow::Result<()> {
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
    assert_eq!(written.len(), 300);
    assert_eq!(children.len(), 2, "a split makes two children");

    let records: Vec<(usize, &Entry, &str)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.call == "record")
        .filter_map(|(i, e)| Some((i, e, e.sequence_number.as_deref()?)))
        .collect();
    let delivered: BTreeSet<String> = records.iter().map(|(_, _, s)| (*s).to_owned()).collect();
    assert_eq!(delivered, written, "every record reached a child");
    let checkpointed_before: BTreeSet<&str> = records
        .iter()
        .filter(|(i, _, _)| *i < before_kill)
        .map(|(_, _, s)| *s)
        .collect();
    assert_eq!(checkpointed_before.len(), 100, "the first daemon's records");
    let again: Vec<&str> = records
        .iter()
        .filter(|(i, _, s)| *i >= before_kill && checkpointed_before.contains(s))
        .map(|(_, _, s)| *s)
        .collect();
    assert!(
        again.is_empty(),
        "checkpointed, then delivered again: {again:?}"
    );
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
