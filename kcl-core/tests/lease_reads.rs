//! The lease table's reads grow with shards, not workers × shards, under a leader.
//!
//! Fleets of W workers over S shards run on the in-memory backends (paused time) until
//! settled; then the store's request accounting counts the rows read over ten taker
//! intervals. Under `Coordination::Leader` that is the rows the leader and the standby read
//! from the change feed (each renewal once per observer: 2 × S every renewal interval, a
//! third of the failover time), each worker's own keys every half failover time (S in all),
//! and a few singleton rows: at most S + 10 an interval for every W up to S (measured: 74,
//! 95 and 105 rows at W = 2, 10, 40 over 120 shards). The same fleet with every worker
//! reading the table exceeds that bound from two workers on (1,200 rows at W = 10), which
//! shows the check can fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{Coordination, ShardId, ShutdownHandle, Worker, WorkerConfig};

const SHARDS: u32 = 120;
const INTERVALS: u32 = 10;

/// Rows read per taker interval by a settled fleet of `workers`, and how many leases each
/// worker held.
async fn rows_per_interval(workers: usize, coordination: Coordination) -> (f64, Vec<usize>) {
    let stream = MemoryStream::new(SHARDS);
    let store = MemoryLeaseStore::new();
    let config = WorkerConfig::default().coordination(coordination);
    let interval = config.taker_interval;
    let mut handles: Vec<ShutdownHandle> = Vec::new();
    let mut statuses = Vec::new();
    for i in 0..workers {
        let id = format!("w{i}");
        let worker = Worker::new(
            id.as_str(),
            config.clone(),
            stream.client(&id),
            store.client(&id),
            |_: &ShardId| IdleProcessor,
        )
        .unwrap();
        handles.push(worker.shutdown_handle());
        statuses.push(worker.status());
        tokio::spawn(worker.run());
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    let before = store.table_usage().total().rows;
    tokio::time::sleep(interval * INTERVALS).await;
    let after = store.table_usage().total().rows;
    let held = statuses.iter().map(|s| s.borrow().held.len()).collect();
    for handle in &handles {
        handle.force();
    }
    #[allow(clippy::cast_precision_loss)]
    let rows = (after - before) as f64 / f64::from(INTERVALS);
    (rows, held)
}

fn bound() -> f64 {
    f64::from(SHARDS) + 10.0
}

#[tokio::test(start_paused = true)]
async fn under_a_leader_one_intervals_reads_are_linear_in_shards_whatever_the_fleet_size() {
    for workers in [2, 10, 40] {
        let (rows, held) = rows_per_interval(workers, Coordination::Leader).await;
        eprintln!("leader, {workers} workers over {SHARDS} shards: {rows} rows an interval");
        assert_eq!(
            held.iter().sum::<usize>(),
            SHARDS as usize,
            "{workers} workers: every shard is held ({held:?})"
        );
        let (least, most) = (held.iter().min(), held.iter().max());
        assert!(
            most.zip(least).is_some_and(|(m, l)| m - l <= 1),
            "{workers} workers: balanced ({held:?})"
        );
        assert!(
            rows <= bound(),
            "{workers} workers read {rows} rows an interval, above {}",
            bound()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn with_every_worker_reading_the_table_the_bound_is_exceeded() {
    let (rows, _) = rows_per_interval(10, Coordination::EveryWorker).await;
    eprintln!("every worker, 10 workers over {SHARDS} shards: {rows} rows an interval");
    assert!(
        rows > bound(),
        "10 workers each reading the table: {rows} rows an interval"
    );
}
