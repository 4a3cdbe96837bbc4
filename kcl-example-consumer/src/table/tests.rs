//! The table on the in-memory store: counts exactly once across a handoff, the position in
//! step with the lease, windows in parts each with its position, a worker without the table
//! found by the next worker with it.

#![allow(clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::DateTime;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream, ProcessorHarness};
use kcl_core::outputs::Limits;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    Checkpoint, Lease, LeaseStore, Record, SequenceNumber, ShardId, Worker, WorkerConfig, WorkerId,
};

use super::memory::{MemoryItems, parse, position_key, window_key};
use super::step::{Found, Step};
use super::{Transactional, WindowTable};
use crate::processor::WindowCounter;
use crate::processor::tests::Collect;

pub(super) fn table(store: &MemoryLeaseStore) -> Arc<dyn WindowTable> {
    let items = MemoryItems {
        store: store.clone(),
        application: "app".to_owned(),
    };
    Arc::new(Transactional::new(store.clone(), items))
}

/// The position item of `shard`'s checkpoint, if any.
pub(super) fn position(store: &MemoryLeaseStore, shard: &ShardId) -> Option<Checkpoint> {
    let item = store.output(&position_key(shard))?;
    Some(parse(&item.value?)?.checkpoint)
}

/// Each window's count commits with its checkpoint. A graceful stop in the middle of a window
/// emits it early and commits what it counted; the next worker adds the rest to the same
/// item. The table ends with every record counted once, each window's item holding what its
/// lines say, and each shard's position where its lease is.
#[tokio::test(start_paused = true)]
async fn a_table_counts_each_record_once_across_a_handoff() {
    let stream = MemoryStream::new(2);
    let store = MemoryLeaseStore::new();
    let sink = Arc::new(Collect::default());
    let table = table(&store);
    let config = WorkerConfig::default()
        .failover_time(Duration::from_secs(3))
        .idle_time_between_reads(Duration::from_millis(100));
    let mut produced = 0u64;
    for worker in ["a", "b"] {
        let factory = {
            let (sink, table) = (sink.clone(), table.clone());
            move |shard: &ShardId| {
                WindowCounter::new(shard, Duration::from_secs(2), 10, sink.clone())
                    .with_table(table.clone())
            }
        };
        let worker = Worker::new(
            worker,
            config.clone(),
            stream.clone(),
            store.clone(),
            factory,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let shutdown = worker.shutdown_handle();
        let running = tokio::spawn(worker.run());
        for i in 0..30 {
            stream.put(&format!("{}-key", i % 7), format!("record-{produced}"));
            produced += 1;
            tokio::time::sleep(Duration::from_millis(130)).await;
        }
        shutdown.shutdown();
        assert!(matches!(running.await, Ok(Ok(()))));
    }
    let lines = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
    let items = store.outputs();
    let windows: HashMap<String, i64> = items
        .into_iter()
        .filter(|(k, _)| !k.ends_with("#position"))
        .map(|(k, item)| (k, item.count))
        .collect();
    let counted: i64 = windows.values().sum();
    assert_eq!(counted, i64::try_from(produced).unwrap_or(0), "{windows:?}");
    let mut by_window: HashMap<String, i64> = HashMap::new();
    for line in &lines {
        *by_window.entry(window_key(line)).or_default() += i64::try_from(line.records).unwrap_or(0);
    }
    assert_eq!(by_window, windows);
    assert!(
        lines.iter().any(|w| !w.complete),
        "a window was emitted early at the stop: {lines:?}"
    );
    for lease in store
        .leases()
        .iter()
        .filter(|l| !is_coordination_key(&l.key))
    {
        let at = position(&store, &lease.key);
        let step = super::step::compare(&lease.checkpoint, at.as_ref());
        assert_eq!(
            step,
            Step::InStep,
            "{}: {} {at:?}",
            lease.key,
            lease.checkpoint
        );
    }
    assert!(table.mismatches().recent().is_empty());
}

pub(super) fn record(seq: u64, at_ms: i64) -> Record {
    let sequence = SequenceNumber::parse(seq.to_string()).unwrap_or_else(|| panic!("digits"));
    let at = DateTime::from_timestamp_millis(at_ms).unwrap_or_else(|| panic!("time"));
    Record::new(sequence, "key", format!("record {seq}")).with_approximate_arrival(at)
}

/// `n` records from sequence number `from`, 10 ms apart from `from × 10` ms: one window each.
pub(super) fn spread(from: u64, n: u64) -> Vec<Record> {
    (from..from + n)
        .map(|i| record(i, i64::try_from(i * 10).unwrap_or(0)))
        .collect()
}

pub(super) fn counter(
    shard: &ShardId,
    table: Option<&Arc<dyn WindowTable>>,
) -> WindowCounter<Arc<Collect>> {
    let counter = WindowCounter::new(
        shard,
        Duration::from_millis(10),
        1,
        Arc::new(Collect::default()),
    );
    match table {
        Some(table) => counter.with_table(table.clone()),
        None => counter,
    }
}

/// More windows than a transaction holds: they commit in parts of a transaction's writes
/// less one, each with the position of its checkpoint, so that a crash between two parts
/// leaves the position where the lease is. `SHARD_END` carries its position too.
#[tokio::test(start_paused = true)]
async fn windows_commit_in_parts_each_with_the_position_of_its_checkpoint() {
    let store = MemoryLeaseStore::new();
    store.set_output_limits(Limits {
        writes: 3,
        bytes: 1 << 20,
    });
    let table = table(&store);
    let shard = ShardId::new("shardId-000000000000");
    let mut harness = ProcessorHarness::new(&store, shard.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut processor = counter(&shard, Some(&table));
    harness
        .initialize(&mut processor)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Records 1..=7 in 7 windows: the 8th record closes the 7th.
    harness
        .process(&mut processor, spread(1, 8))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let commits = store.applied_commits();
    assert_eq!(commits.len(), 4, "7 windows, 2 a transaction: {commits:?}");
    let lease = harness.checkpoint().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lease.to_string(), "7");
    assert_eq!(position(&store, &shard), Some(lease));
    harness
        .shard_ended(&mut processor, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(position(&store, &shard), Some(Checkpoint::ShardEnd));
    let windows = store
        .outputs()
        .into_iter()
        .filter(|(k, _)| !k.ends_with("#position"));
    assert_eq!(windows.map(|(_, item)| item.count).sum::<i64>(), 8);
}

/// A mixed fleet: a worker without the table checkpoints records whose windows never reach
/// it. The next worker with the table finds the lease ahead of the table's position when it
/// opens the shard (naming both), records it in the position item, and goes on from there; a
/// check of the lease table finds it too.
#[tokio::test(start_paused = true)]
async fn a_worker_without_the_table_is_found_by_the_next_one_with_it() {
    let store = MemoryLeaseStore::new();
    let shard = ShardId::new("shardId-000000000000");
    let run = async |table: Option<&Arc<dyn WindowTable>>, from: u64| {
        let mut harness = ProcessorHarness::new(&store, shard.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut processor = counter(&shard, table);
        harness
            .initialize(&mut processor)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        harness
            .process(&mut processor, spread(from, 5))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        harness.checkpoint().await.unwrap_or_else(|e| panic!("{e}"))
    };
    let with = table(&store);
    let first = run(Some(&with), 1).await;
    assert_eq!(position(&store, &shard), Some(first.clone()));
    let without = run(None, 10).await;
    assert_eq!(
        position(&store, &shard),
        Some(first.clone()),
        "nothing in the table"
    );
    let leases = store.list().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(with.check(&leases, None).await.ok(), Some(1));
    assert_eq!(with.mismatches().ahead(), vec![shard.clone()]);
    // Sampled, the check reads only leases other workers hold: the harness's is its own.
    assert_eq!(with.check(&leases, Some(5)).await.ok(), Some(0));
    let next = table(&store);
    let last = run(Some(&next), 20).await;
    let found = next.mismatches().recent();
    assert_eq!(found.len(), 1, "{found:?}");
    let (m, want) = (&found[0], Some(first.clone()));
    assert_eq!(
        (&m.shard, &m.lease, &m.table, m.step, m.found),
        (&shard, &without, &want, Step::Missing, Found::Open)
    );
    assert!(m.to_string().contains("ahead"), "{m}");
    assert_eq!(position(&store, &shard), Some(last), "in step again");
    let leases = store.list().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next.check(&leases, None).await.ok(), Some(0));
    assert!(next.mismatches().ahead().is_empty());
}

/// A periodic check reads a few leases of other workers at a time, the next ones each time,
/// round the table: every shard is looked at, at a bounded cost per check.
#[tokio::test(start_paused = true)]
async fn sampled_checks_go_round_the_lease_table() {
    let store = MemoryLeaseStore::new();
    let table = table(&store);
    let leases: Vec<Lease> = (0..5)
        .map(|i| {
            let mut lease = Lease::new(ShardId::new(format!("shardId-{i}")), at(10 + i));
            lease.owner = Some(WorkerId::new(if i == 2 { "test-worker" } else { "other" }));
            lease
        })
        .collect();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let found = table.check(&leases, Some(2)).await.ok();
        assert_eq!(
            found,
            Some(2),
            "no position anywhere: every lease read is ahead"
        );
        let ahead = table.mismatches().ahead();
        seen.push(ahead.len());
    }
    // 0 and 1, 3 and 4, then 0 again and 1 (2 is this worker's own).
    assert_eq!(seen, vec![2, 4, 4]);
    assert!(
        !table
            .mismatches()
            .ahead()
            .contains(&ShardId::new("shardId-2"))
    );
}

pub(super) fn at(n: u64) -> Checkpoint {
    let sequence = SequenceNumber::parse(n.to_string()).unwrap_or_else(|| panic!("digits"));
    Checkpoint::Sequence(kcl_core::ExtendedSequenceNumber::new(sequence))
}
