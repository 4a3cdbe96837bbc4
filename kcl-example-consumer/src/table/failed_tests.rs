//! The table on the in-memory store when calls fail and leases move back: a failure policy
//! handing a failed batch back to the same processor (retried, bisected) after its commit
//! failed, a commit whose answer was lost landing after its call failed, and a lease reset
//! backwards behind what the table counts. Each ends with every record counted once.

#![allow(clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kcl_core::admin::{ResetTo, reset};
use kcl_core::failure::FailurePolicy;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream, ProcessorHarness};
use kcl_core::{Checkpoint, Record, ShardId, Worker, WorkerConfig};

use super::memory::{MemoryItems, window_key};
use super::step::Step;
use super::tests::{at, counter, position, spread};
use super::{Transactional, WindowTable};
use crate::processor::WindowCounter;
use crate::processor::tests::Collect;
use crate::window::Windows;

/// The table's window items: key → records counted.
fn counted(store: &MemoryLeaseStore) -> BTreeMap<String, i64> {
    let items = store.outputs().into_iter();
    items
        .filter(|(k, _)| !k.ends_with("#position"))
        .map(|(k, item)| (k, item.count))
        .collect()
}

/// A table whose commits go through the store as the client `table` (so that a fault can
/// hit them alone), its items read directly.
fn faulty_table(store: &MemoryLeaseStore) -> Arc<dyn WindowTable> {
    let items = MemoryItems {
        store: store.clone(),
        application: "app".to_owned(),
    };
    Arc::new(Transactional::new(store.client("table"), items))
}

/// Each window's records in `records`, as the table should count them.
fn expected(shard: &ShardId, records: &[Record], length: Duration) -> BTreeMap<String, i64> {
    let windows = Windows::new(shard, length, 1);
    let mut out = BTreeMap::new();
    for r in records {
        let start = windows.window_of(r.approximate_arrival);
        *out.entry(format!("{shard}/{}", start.timestamp_millis()))
            .or_default() += 1;
    }
    out
}

/// Under `--on-failure skip` (a failure policy that retries and bisects a failed batch on the
/// same processor), the table's commits fail for 10 s, after the store's retries under its
/// errors: each failed call is undone (the window it closed open again, its records taken
/// out), and the batch delivered again, bisected (a batch of 5 failing, then its 2, then 1)
/// and retried, counts once. Every window item ends with exactly its records; the lines on
/// stdout show the retries (windows emitted more than once).
#[tokio::test(start_paused = true)]
async fn failed_commits_retried_by_the_failure_policy_count_each_record_once() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let sink = Arc::new(Collect::default());
    let table = faulty_table(&store);
    let mut config = WorkerConfig::default().idle_time_between_reads(Duration::from_millis(100));
    config.failure = FailurePolicy::skip(100);
    let length = Duration::from_secs(1);
    let factory = {
        let (sink, table) = (sink.clone(), table.clone());
        move |shard: &ShardId| {
            WindowCounter::new(shard, length, 10, sink.clone()).with_table(table.clone())
        }
    };
    let worker = Worker::new("w", config, stream.clone(), store.clone(), factory)
        .unwrap_or_else(|e| panic!("{e}"));
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());
    // 5 records every 100 ms: batches of several records, which a failure bisects.
    for i in 0..1_000 {
        match i {
            150 => store.faults().partition("table"),
            650 => store.faults().heal("table"),
            _ => {}
        }
        stream.put(&format!("key-{}", i % 7), format!("record-{i}"));
        if i % 5 == 4 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    shutdown.shutdown();
    assert!(matches!(running.await, Ok(Ok(()))));
    let shard = ShardId::from("shardId-000000000000");
    let want = expected(&shard, &stream.records(&shard), length);
    assert_eq!(want.values().sum::<i64>(), 1_000);
    assert_eq!(counted(&store), want, "each window's records counted once");
    let lines = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
    let mut emitted: BTreeMap<String, usize> = BTreeMap::new();
    for line in &lines {
        *emitted.entry(window_key(line)).or_default() += 1;
    }
    let again = emitted.values().filter(|n| **n > 1).count();
    assert!(again > 0, "no window was emitted again: no retry happened");
}

/// A commit whose every attempt goes unanswered fails its call (the row read back holds the
/// old checkpoint) and lands later all the same. The batch delivered again in halves, as a
/// bisect does: the first half's commit finds the row moved, and its failure reads the
/// table's position back: what the lost commit counted is not counted again, and the records
/// at or before it, delivered again, are skipped.
#[tokio::test(start_paused = true)]
async fn a_commit_that_lands_after_its_call_failed_is_read_back() {
    let store = MemoryLeaseStore::new();
    let table = faulty_table(&store);
    let shard = ShardId::new("shardId-000000000000");
    let mut harness = ProcessorHarness::new(&store, shard.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut processor = counter(&shard, Some(&table));
    let ok = |r: Result<(), kcl_core::BoxError>| r.unwrap_or_else(|e| panic!("{e}"));
    ok(harness.initialize(&mut processor).await);
    // Records 1..=3, one window each (10 ms windows, 10 ms apart): 1 and 2 commit.
    ok(harness.process(&mut processor, spread(1, 3)).await);
    store.faults().set_stragglers(1.0, Duration::from_secs(30));
    let failed = harness.process(&mut processor, spread(4, 3)).await;
    assert!(
        failed.is_err(),
        "the commit of windows 3 to 5 went unanswered"
    );
    store.faults().clear();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(position(&store, &shard), Some(at(5)), "it landed after all");
    // The bisect's halves: [4], then [5, 6] ([5] is checkpointed by then: delivered anyway).
    let half = harness.process(&mut processor, spread(4, 1)).await;
    assert!(half.is_err(), "the first half's commit finds the row moved");
    ok(harness.process(&mut processor, spread(5, 2)).await);
    ok(harness.shutdown_requested(&mut processor).await);
    let want: BTreeMap<String, i64> = (1..=6)
        .map(|i| (format!("{shard}/{}", i * 10), 1))
        .collect();
    assert_eq!(counted(&store), want);
    assert_eq!(position(&store, &shard), Some(at(6)));
}

/// A lease reset backwards (`kcl-admin reset`) behind what the table counts: the next
/// processor resumes after the table's position, skipping the records up to it, and a stop
/// in the middle of the skip moves the lease but never the position back. The table counts
/// every record once.
#[tokio::test(start_paused = true)]
async fn a_lease_reset_backwards_skips_what_the_table_counts() {
    let store = MemoryLeaseStore::new();
    let table = super::tests::table(&store);
    let shard = ShardId::new("shardId-000000000000");
    let ok = |r: Result<(), kcl_core::BoxError>| r.unwrap_or_else(|e| panic!("{e}"));
    let open = async || {
        let mut harness = ProcessorHarness::new(&store, shard.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut processor = counter(&shard, Some(&table));
        ok(harness.initialize(&mut processor).await);
        (harness, processor)
    };
    let (mut harness, mut processor) = open().await;
    ok(harness.process(&mut processor, spread(1, 5)).await);
    ok(harness.shutdown_requested(&mut processor).await);
    assert_eq!(position(&store, &shard), Some(at(5)));
    let back = ResetTo {
        checkpoint: Checkpoint::TrimHorizon,
        pin: None,
    };
    reset(&store, &shard, &back)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Stopped within the skip: the lease moves to 3, the position stays at 5.
    let (mut harness, mut processor) = open().await;
    ok(harness.process(&mut processor, spread(1, 3)).await);
    ok(harness.shutdown_requested(&mut processor).await);
    let lease = harness.checkpoint().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((lease, position(&store, &shard)), (at(3), Some(at(5))));
    // The next one skips 4 and 5, and counts from 6.
    let (mut harness, mut processor) = open().await;
    ok(harness.process(&mut processor, spread(4, 5)).await);
    ok(harness.shutdown_requested(&mut processor).await);
    let want: BTreeMap<String, i64> = (1..=8)
        .map(|i| (format!("{shard}/{}", i * 10), 1))
        .collect();
    assert_eq!(counted(&store), want, "nothing counted twice");
    let lease = harness.checkpoint().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((lease, position(&store, &shard)), (at(8), Some(at(8))));
    let found: Vec<Step> = table.mismatches().recent().iter().map(|m| m.step).collect();
    assert_eq!(found, [Step::Behind, Step::Behind], "each opening behind");
}
