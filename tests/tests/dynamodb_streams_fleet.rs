//! Worker processes on a DynamoDB table's stream, taking over a lease row as the Java DynamoDB
//! Streams Kinesis Adapter leaves it (raw shard id, sequence-number checkpoint, departed
//! owner), through a SIGKILL failover and a SIGTERM handoff while items are inserted, updated
//! and deleted: every change arrives, in order per item, and nothing a checkpoint covered is
//! delivered again.
//!
//! moto serves one stream shard per table that never closes; rollovers and lineage are
//! covered in memory (`kcl-core/tests/rollover.rs`) and by the simulation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use kcl_aws::DynamoDbStreamsSource;
use kcl_core::{SequenceNumber, ShardSource, StartingPosition};
use kcl_integration_tests::items::{self, Writer, Written};
use kcl_integration_tests::journal::Event;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
/// Changes the adapter's fleet had processed and checkpointed before the move.
const CHECKPOINTED: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_survive_a_sigkill_and_a_sigterm_after_an_adapter_fleet_moves_over()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("ddb-fleet").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(run(ctx))).await
}

/// The delivered change of a `record` line.
fn change(e: &Event) -> Option<Written> {
    Written::of_record(e.data.as_deref()?)
}

/// A worker's record lines and its starting checkpoints, read from its journal.
fn records(w: &WorkerProcess) -> anyhow::Result<Vec<Event>> {
    Ok(w.events()?
        .into_iter()
        .filter(|e| e.event == "record" || e.event == "init")
        .collect())
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let table = format!("{}-items", ctx.table);
    items::create(&ctx, &table, true).await?;
    let mut writer = Writer::new(&ctx, &table, 5);
    writer.write_n(20).await?;

    // The adapter's row: the raw shard id, the 8th change's sequence number, sub 0.
    let source = DynamoDbStreamsSource::for_table(&items::sdk(&ctx).await, &table).await?;
    let shards = source.list_shards().await?;
    assert_eq!(shards.len(), 1, "moto has one shard a stream: {shards:?}");
    let shard = shards[0].id.clone();
    let iterator = source
        .shard_iterator(&shard, &StartingPosition::TrimHorizon)
        .await?;
    let batch = source.get_records(&iterator, 100).await?;
    let checkpoint = batch.records[CHECKPOINTED - 1].sequence_number.clone();
    adapter_lease_table(&ctx, shard.as_str(), checkpoint.as_str()).await?;

    let args = [
        "--dynamodb-streams-table",
        table.as_str(),
        "--idle-ms",
        "200",
    ];
    let a = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &args)?;
    let b = WorkerProcess::spawn(WORKER, &ctx, "worker-b", &args)?;
    let live = writer.start(Duration::from_millis(40));
    let mut fleet = vec![a, b];

    // SIGKILL whoever took the adapter's lease, once it has read live changes.
    let first = holder_delivering(&fleet, 25).await?;
    fleet[first].kill()?;
    eprintln!("killed {}", fleet[first].id);
    let second = 1 - first;
    let at = delivered(&fleet[second])?;
    wait_delivering(&ctx, &fleet[second], shard.as_str(), at + 10).await?;
    // A third worker, the one to take over at the SIGTERM (started after the failover, which
    // it would otherwise race the survivor for).
    let c = WorkerProcess::spawn(WORKER, &ctx, "worker-c", &args)?;
    fleet.push(c);
    wait_until(
        "worker-c to start",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || Ok(fleet[2].events()?.iter().any(|e| e.event == "started")),
    )
    .await?;

    // SIGTERM the survivor: its lease goes to worker-c at its shutdown checkpoint.
    fleet[second].terminate()?;
    let status = fleet[second].wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "{status:?}\n{}", fleet[second].log_tail());
    eprintln!("terminated {}", fleet[second].id);
    wait_delivering(&ctx, &fleet[2], shard.as_str(), 10).await?;

    let writer = live.stop().await?;
    let want: BTreeSet<Written> = writer.written[CHECKPOINTED..].iter().cloned().collect();
    wait_until(
        "every change after the adapter's checkpoint",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let mut got = BTreeSet::new();
            for w in &fleet {
                got.extend(records(w)?.iter().filter_map(change));
            }
            Ok(want.is_subset(&got))
        },
    )
    .await
    .map_err(|e| e.context(fleet[2].log_tail()))?;
    fleet[2].terminate()?;
    fleet[2].wait_exit(Duration::from_secs(20)).await?;

    check(&fleet, &writer.written, &checkpoint, first, second)
}

/// How many records `w` delivered.
fn delivered(w: &WorkerProcess) -> anyhow::Result<usize> {
    Ok(records(w)?.iter().filter(|e| e.event == "record").count())
}

/// Waits until one of `fleet` has delivered `n` records, the last of them not checkpointed
/// yet; its index.
async fn holder_delivering(fleet: &[WorkerProcess], n: usize) -> anyhow::Result<usize> {
    let mut holder = 0;
    wait_until(
        "a worker to hold the adapter's lease and read, between a batch and its checkpoint",
        Duration::from_secs(30),
        Duration::from_millis(10),
        async || {
            for (i, w) in fleet.iter().enumerate() {
                let events = w.events()?;
                let unsaved = events.last().is_some_and(|e| e.event == "record");
                let read = events.iter().filter(|e| e.event == "record").count();
                if unsaved && read >= n {
                    holder = i;
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .await
    .map_err(|e| e.context(fleet[0].log_tail()))?;
    Ok(holder)
}

/// Waits until `w` owns `shard` and has delivered `n` records.
async fn wait_delivering(
    ctx: &Context,
    w: &WorkerProcess,
    shard: &str,
    n: usize,
) -> anyhow::Result<()> {
    let took = wait_until(
        &format!("{} to hold {shard} and deliver {n} records", w.id),
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let owner = ctx.owners().await?.get(shard).cloned().flatten();
            Ok(owner.as_deref() == Some(w.id.as_str()) && delivered(w)? >= n)
        },
    )
    .await
    .map_err(|e| e.context(w.log_tail()))?;
    eprintln!(
        "{} holds {shard} and delivered {n} records after {took:?}",
        w.id
    );
    Ok(())
}

/// Nothing lost, order per item, nothing checkpointed delivered again.
fn check(
    fleet: &[WorkerProcess],
    written: &[Written],
    adapter_checkpoint: &SequenceNumber,
    killed: usize,
    terminated: usize,
) -> anyhow::Result<()> {
    let journals: Vec<Vec<Event>> = fleet.iter().map(records).collect::<Result<_, _>>()?;
    let mut first_seen: BTreeMap<Written, SequenceNumber> = BTreeMap::new();
    for journal in &journals {
        // Within a process, each tenure delivers in sequence order; and it delivers nothing
        // at or below the checkpoint it started from.
        let mut from: Option<SequenceNumber> = None;
        let mut last: Option<SequenceNumber> = None;
        for e in journal {
            if e.event == "init" {
                from = e.checkpoint.as_deref().and_then(SequenceNumber::parse);
                last = None;
                continue;
            }
            let (Some(seq), Some(c)) = (e.sequence(), change(e)) else {
                anyhow::bail!("{}: a record that is not a change: {e:?}", e.worker);
            };
            assert!(
                from.as_ref().is_none_or(|f| &seq > f),
                "{} delivered {c:?} ({seq}) at or below the checkpoint it started from ({from:?})",
                e.worker
            );
            assert!(
                last.as_ref().is_none_or(|l| &seq > l),
                "{} delivered {c:?} ({seq}) out of order",
                e.worker
            );
            assert!(
                &seq > adapter_checkpoint,
                "{c:?} ({seq}) was covered by the adapter's checkpoint"
            );
            last = Some(seq.clone());
            first_seen.entry(c).or_insert(seq);
        }
    }
    // Nothing lost: every change after the adapter's checkpoint, each item's in write order.
    let after = &written[CHECKPOINTED..];
    let lost: Vec<&Written> = after
        .iter()
        .filter(|w| !first_seen.contains_key(w))
        .collect();
    assert!(lost.is_empty(), "lost {} changes: {lost:?}", lost.len());
    let mut by_item: BTreeMap<&str, Vec<&SequenceNumber>> = BTreeMap::new();
    for w in after {
        by_item.entry(&w.id).or_default().push(&first_seen[w]);
    }
    for (id, seqs) in &by_item {
        assert!(seqs.is_sorted(), "{id}: changes out of write order");
    }
    // The SIGTERM handoff delivers nothing twice; the SIGKILL one only what followed the
    // killed worker's last checkpoint (the per-tenure check above).
    let terminated_set: BTreeSet<Written> =
        journals[terminated].iter().filter_map(change).collect();
    let again: BTreeSet<Written> = journals[2]
        .iter()
        .filter_map(change)
        .filter(|c| terminated_set.contains(c))
        .collect();
    assert!(
        again.is_empty(),
        "delivered again after the SIGTERM handoff: {again:?}"
    );
    let killed_set: BTreeSet<Written> = journals[killed].iter().filter_map(change).collect();
    let redelivered = terminated_set.intersection(&killed_set).count();
    eprintln!(
        "{} changes after the adapter's checkpoint, all delivered across {} items; {} by the \
         killed worker, {} by the terminated one ({redelivered} of them again, after the \
         killed one's last checkpoint), {} by the last",
        after.len(),
        by_item.len(),
        killed_set.len(),
        terminated_set.len(),
        journals[2].iter().filter_map(change).count()
    );
    Ok(())
}

/// The lease table as the adapter's fleet (KCL Java) leaves it: KCL's schema, one row keyed
/// by the raw shard id, checkpointed at `checkpoint` (sub-sequence 0), held by a worker that
/// is gone.
async fn adapter_lease_table(ctx: &Context, shard: &str, checkpoint: &str) -> anyhow::Result<()> {
    ctx.dynamodb
        .create_table()
        .table_name(&ctx.table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("leaseKey")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("leaseKey")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await?;
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let n = |v: u64| AttributeValue::N(v.to_string());
    ctx.dynamodb
        .put_item()
        .table_name(&ctx.table)
        .item("leaseKey", s(shard))
        .item("leaseOwner", s("adapter-host-1"))
        .item("leaseCounter", n(4242))
        .item("checkpoint", s(checkpoint))
        .item("checkpointSubSequenceNumber", n(0))
        .item("ownerSwitchesSinceCheckpoint", n(0))
        .item("startingHashKey", s("0"))
        .item("endingHashKey", s("1"))
        .send()
        .await?;
    Ok(())
}
