//! `--only migration`: a lease table moves from KCL Java 3.1.3's MultiLangDaemon to
//! `kcl-multilang` and back, with the same child (`journaled.py`, which checkpoints every
//! batch) over a 4-shard stream. Each of the three daemons (Java, kcl, Java) is started on the
//! table the last one left after its SIGTERM, gets 100 new records, and is stopped once the
//! table holds a checkpoint at every shard's last record. Fails (exit status 1) if a record
//! is lost, one checkpointed under an earlier daemon is delivered again, or KCL Java
//! initializes a record processor for a row that is not a shard: between kcl and the second
//! KCL Java, `kcl-admin remove-kcl-rows` takes kcl's own rows out, as docs/operations.md
//! says to (build it with `cargo build --release -p kcl-admin`).
//!
//! Not a CI test: KCL Java takes 1–2 minutes to its first record, twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::{Checkpoint, LeaseStore};
use kcl_integration_tests::{Context, unique, wait_until};

use crate::multilang::{Journal, KCL, Running, sides};

/// What one daemon delivered.
struct Phase {
    daemon: &'static str,
    delivered: Vec<String>,
    took: Duration,
}

/// Each shard's last sequence number.
async fn last_records(ctx: &Context) -> anyhow::Result<BTreeMap<String, String>> {
    let mut last = BTreeMap::new();
    for shard in 0..4 {
        let id = format!("shardId-{shard:012}");
        if let Some((sequence, _)) = ctx.read_shard(&id).await?.pop() {
            last.insert(id, sequence);
        }
    }
    Ok(last)
}

/// Whether table `app` has every shard checkpointed at its last record.
async fn checkpointed(ctx: &Context, app: &str, last: &BTreeMap<String, String>) -> bool {
    let store = DynamoDbLeaseStore::from_client(ctx.dynamodb.clone(), app.to_owned());
    let Ok(leases) = store.list().await else {
        return false;
    };
    last.iter().all(|(shard, sequence)| {
        leases.iter().any(|l| {
            l.key.as_str() == shard
                && matches!(&l.checkpoint, Checkpoint::Sequence(s) if s.sequence.as_str() == sequence)
        })
    })
}

pub(crate) async fn check() -> anyhow::Result<()> {
    let sides = sides()?;
    let (Some(kcl), Some(java)) = (
        sides.iter().find(|s| s.name == KCL),
        sides.iter().find(|s| s.name != KCL),
    ) else {
        anyhow::bail!("the migration needs KCL Java (java on PATH, kclpy-ext's jars)");
    };
    let ctx = Context::new("bench-migration")
        .await?
        .context("the emulators are needed")?;
    ctx.create_stream(4).await?;
    let app = unique("ml-migrate");
    let mut journal = Journal::new(ctx.path(&format!("{app}.jsonl")));
    let mut phases = Vec::new();
    for (i, side) in [java, kcl, java].into_iter().enumerate() {
        let records: Vec<(String, String)> = (0..100)
            .map(|n| (format!("pk-{n}"), format!("phase-{i}-{n}")))
            .collect();
        ctx.put(&records).await?;
        let last = last_records(&ctx).await?;
        let seen = journal.read().len();
        let started = Instant::now();
        eprintln!("migration: {} on the table", side.name);
        let mut daemon = Running::start(side, &ctx, &app, &format!("w-{i}"), "TRIM_HORIZON")?;
        wait_until(
            "every shard checkpointed at its last record",
            Duration::from_secs(600),
            Duration::from_millis(500),
            async || Ok(checkpointed(&ctx, &app, &last).await),
        )
        .await
        .with_context(|| daemon.logs())?;
        let took = started.elapsed();
        daemon.terminate().await?;
        if side.name == KCL {
            // The way back (docs/operations.md): kcl's own rows out before KCL Java starts.
            remove_kcl_rows(&ctx, &app)?;
        }
        let delivered = journal.read()[seen..]
            .iter()
            .filter(|e| e.call == "record")
            .filter_map(|e| e.sequence_number.clone())
            .collect();
        phases.push(Phase {
            daemon: side.name,
            delivered,
            took,
        });
    }
    report(&ctx, &phases, journal.read()).await
}

async fn report(
    ctx: &Context,
    phases: &[Phase],
    entries: &[crate::multilang::Entry],
) -> anyhow::Result<()> {
    let mut written = BTreeSet::new();
    for shard in 0..4 {
        for (sequence, _) in ctx.read_shard(&format!("shardId-{shard:012}")).await? {
            written.insert(sequence);
        }
    }
    println!(
        "\n| daemon on the table | records delivered | of which checkpointed before | to every checkpoint |"
    );
    println!("|---|---:|---:|---:|");
    let mut before: BTreeSet<&str> = BTreeSet::new();
    let mut again = 0;
    for phase in phases {
        let repeated = phase
            .delivered
            .iter()
            .filter(|s| before.contains(s.as_str()))
            .count();
        again += repeated;
        println!(
            "| {} | {} | {repeated} | {:.1} s |",
            phase.daemon,
            phase.delivered.len(),
            phase.took.as_secs_f64()
        );
        before.extend(phase.delivered.iter().map(String::as_str));
    }
    let lost = written
        .iter()
        .filter(|s| !before.contains(s.as_str()))
        .count();
    let phantom: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.call == "initialize")
        .filter_map(|e| e.shard_id.as_deref())
        .filter(|s| !s.starts_with("shardId-"))
        .collect();
    println!(
        "\n{} records written, {lost} lost, {again} checkpointed and delivered again; rows \
         taken for shards that are not: {phantom:?}",
        written.len()
    );
    anyhow::ensure!(
        lost == 0 && again == 0,
        "the migration lost {lost} records and delivered {again} checkpointed ones again"
    );
    anyhow::ensure!(
        phantom.is_empty(),
        "KCL Java processed rows that are not shards: {phantom:?}"
    );
    Ok(())
}

/// `kcl-admin remove-kcl-rows` on `app`, the binary built next to this one.
fn remove_kcl_rows(ctx: &Context, app: &str) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let admin = exe.with_file_name("kcl-admin");
    anyhow::ensure!(
        admin.exists(),
        "no {}: build it with `cargo build --release -p kcl-admin`",
        admin.display()
    );
    let out = std::process::Command::new(&admin)
        .args(["remove-kcl-rows", "--application-name", app])
        .envs(ctx.worker_env())
        .output()?;
    eprintln!("migration: {}", String::from_utf8_lossy(&out.stdout).trim());
    anyhow::ensure!(
        out.status.success(),
        "kcl-admin remove-kcl-rows failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
