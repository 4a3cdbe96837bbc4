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
//!
//! Under `Liveness::Heartbeat` the writes grow with workers, not leases: a settled fleet
//! writes one heartbeat per worker every renew interval (half the failover time, five taker
//! intervals) plus a few coordination rows, at most W / 5 + 3 write units an interval
//! (measured: W = 2: 1.0, 10: 2.6, 40: 8.6); per-lease renewals of the same 120 leases cost 36.6.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{Coordination, Liveness, ShardId, ShutdownHandle, Worker, WorkerConfig};

const SHARDS: u32 = 120;
const INTERVALS: u32 = 10;

/// What a settled fleet spends per taker interval.
struct PerInterval {
    rows_read: f64,
    write_units: f64,
    /// How many leases each worker held.
    held: Vec<usize>,
}

async fn rows_per_interval(workers: usize, coordination: Coordination) -> (f64, Vec<usize>) {
    let m = per_interval(workers, WorkerConfig::default().coordination(coordination)).await;
    (m.rows_read, m.held)
}

async fn per_interval(workers: usize, config: WorkerConfig) -> PerInterval {
    let stream = MemoryStream::new(SHARDS);
    let store = MemoryLeaseStore::new();
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
    let before = store.table_usage().total();
    tokio::time::sleep(interval * INTERVALS).await;
    let after = store.table_usage().total();
    let held = statuses.iter().map(|s| s.borrow().held.len()).collect();
    for handle in &handles {
        handle.force();
    }
    #[allow(clippy::cast_precision_loss)]
    PerInterval {
        rows_read: (after.rows - before.rows) as f64 / f64::from(INTERVALS),
        write_units: (after.write_units - before.write_units) / f64::from(INTERVALS),
        held,
    }
}

fn assert_all_held_and_balanced(workers: usize, held: &[usize]) {
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
}

#[allow(clippy::cast_precision_loss)]
fn write_bound(workers: usize) -> f64 {
    workers as f64 / 5.0 + 3.0
}

#[tokio::test(start_paused = true)]
async fn under_heartbeats_one_intervals_writes_grow_with_workers_not_leases() {
    for workers in [2, 10, 40] {
        let config = WorkerConfig::default().liveness(Liveness::Heartbeat);
        let m = per_interval(workers, config).await;
        eprintln!(
            "heartbeats, {workers} workers over {SHARDS} shards: {} write units, {} rows read an interval",
            m.write_units, m.rows_read
        );
        assert_all_held_and_balanced(workers, &m.held);
        assert!(
            m.write_units <= write_bound(workers),
            "{workers} workers wrote {} units an interval, above {}",
            m.write_units,
            write_bound(workers)
        );
        assert!(
            m.rows_read <= bound(),
            "{workers} workers read {} rows",
            m.rows_read
        );
    }
}

#[tokio::test(start_paused = true)]
async fn with_per_lease_renewals_the_write_bound_is_exceeded() {
    let m = per_interval(2, WorkerConfig::default()).await;
    eprintln!(
        "per lease, 2 workers over {SHARDS} shards: {} write units an interval",
        m.write_units
    );
    assert!(
        m.write_units > write_bound(2),
        "{} write units",
        m.write_units
    );
}

fn bound() -> f64 {
    f64::from(SHARDS) + 10.0
}

#[tokio::test(start_paused = true)]
async fn under_a_leader_one_intervals_reads_are_linear_in_shards_whatever_the_fleet_size() {
    for workers in [2, 10, 40] {
        let (rows, held) = rows_per_interval(workers, Coordination::Leader).await;
        eprintln!("leader, {workers} workers over {SHARDS} shards: {rows} rows an interval");
        assert_all_held_and_balanced(workers, &held);
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
