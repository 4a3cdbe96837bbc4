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
//!
//! A store wrapped as users wrap one (metrics, tracing) keeps the same bound and reads the
//! table whole not once in the window (measured: 95 rows an interval at W = 10); a wrapper
//! that answers the feed and the owner query by reading the whole table, as the trait's old
//! defaults did, exceeds it (442 rows, 36 whole-table reads in ten intervals).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl_core::lease::feed::{FeedPosition, FeedRead};
use kcl_core::lease::usage::{Operation, Tally, Usage};
use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BackendError, CheckpointUpdate, Coordination, Lease, LeaseStore, LeaseStoreExtras, Liveness,
    ShardId, ShutdownHandle, TableFeatures, Worker, WorkerConfig, WorkerId,
};

const SHARDS: u32 = 120;
const INTERVALS: u32 = 10;

/// What a settled fleet spends per taker interval.
struct PerInterval {
    rows_read: f64,
    write_units: f64,
    /// How many leases each worker held.
    held: Vec<usize>,
    /// Requests by operation over the whole window.
    window: Vec<(Operation, Tally)>,
}

async fn rows_per_interval(workers: usize, coordination: Coordination) -> (f64, Vec<usize>) {
    let m = per_interval(workers, WorkerConfig::default().coordination(coordination)).await;
    (m.rows_read, m.held)
}

async fn per_interval(workers: usize, config: WorkerConfig) -> PerInterval {
    per_interval_through(workers, config, |store| store).await
}

/// As [`per_interval`], each worker's store wrapped by `wrap`.
async fn per_interval_through<L: LeaseStore>(
    workers: usize,
    config: WorkerConfig,
    wrap: impl Fn(MemoryLeaseStore) -> L,
) -> PerInterval {
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
            wrap(store.client(&id)),
            |_: &ShardId| IdleProcessor,
        )
        .unwrap();
        handles.push(worker.shutdown_handle());
        statuses.push(worker.status());
        tokio::spawn(worker.run());
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    let (before, by_operation) = (store.table_usage().total(), store.table_usage());
    let by_operation = by_operation.by_operation();
    tokio::time::sleep(interval * INTERVALS).await;
    let after = store.table_usage().total();
    let window = store
        .table_usage()
        .by_operation()
        .into_iter()
        .map(|(operation, mut tally)| {
            let earlier = by_operation.get(&operation).copied().unwrap_or_default();
            tally.requests -= earlier.requests;
            tally.rows -= earlier.rows;
            (operation, tally)
        })
        .collect();
    let held = statuses.iter().map(|s| s.borrow().held.len()).collect();
    for handle in &handles {
        handle.force();
    }
    #[allow(clippy::cast_precision_loss)]
    PerInterval {
        rows_read: (after.rows - before.rows) as f64 / f64::from(INTERVALS),
        write_units: (after.write_units - before.write_units) / f64::from(INTERVALS),
        held,
        window,
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

/// Requests of `operation` in the window.
fn requests(m: &PerInterval, operation: Operation) -> u64 {
    let found = m.window.iter().find(|(o, _)| *o == operation);
    found.map_or(0, |(_, tally)| tally.requests)
}

/// A store wrapper as an application writes one: counts calls (for its own metrics) and
/// delegates every method, the cheap reads included.
#[derive(Debug, Clone)]
struct Counted<L> {
    inner: L,
    calls: Arc<AtomicU64>,
}

impl<L> Counted<L> {
    fn new(inner: L) -> Self {
        Self {
            inner,
            calls: Arc::default(),
        }
    }

    /// The inner store, for one call, counted.
    fn to(&self) -> &L {
        self.calls.fetch_add(1, Ordering::Relaxed);
        &self.inner
    }
}

/// A wrapper that reads the whole table where it should follow the feed and query the
/// index: what a wrapper that left `changes` and `owned_by` to the trait's old defaults did.
#[derive(Debug, Clone)]
struct WholeTable<L>(Counted<L>);

impl<L> WholeTable<L> {
    fn to(&self) -> &Counted<L> {
        &self.0
    }
}

/// Every method but `changes` and `owned_by`, delegated to `self.$to()`.
macro_rules! delegate_writes {
    ($to:ident) => {
        fn ensure_table(
            &self,
            wanted: TableFeatures,
        ) -> impl Future<Output = Result<TableFeatures, BackendError>> + Send {
            self.$to().ensure_table(wanted)
        }

        fn list(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send {
            self.$to().list()
        }

        fn snapshot(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send {
            self.$to().snapshot()
        }

        fn get(
            &self,
            key: &ShardId,
        ) -> impl Future<Output = Result<Option<Lease>, BackendError>> + Send {
            self.$to().get(key)
        }

        fn create(&self, lease: &Lease) -> impl Future<Output = Result<bool, BackendError>> + Send {
            self.$to().create(lease)
        }

        fn renew(&self, held: &Lease) -> impl Future<Output = Result<Lease, BackendError>> + Send {
            self.$to().renew(held)
        }

        fn take(
            &self,
            observed: &Lease,
            new_owner: &WorkerId,
        ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
            self.$to().take(observed, new_owner)
        }

        fn release(&self, held: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send {
            self.$to().release(held)
        }

        fn request_handoff(
            &self,
            observed: &Lease,
            to: Option<&WorkerId>,
        ) -> impl Future<Output = Result<(), BackendError>> + Send {
            self.$to().request_handoff(observed, to)
        }

        fn checkpoint(
            &self,
            held: &Lease,
            update: &CheckpointUpdate,
        ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
            self.$to().checkpoint(held, update)
        }

        fn reset(
            &self,
            observed: &Lease,
            owner: &WorkerId,
            update: &CheckpointUpdate,
        ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
            self.$to().reset(observed, owner, update)
        }

        fn delete(&self, lease: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send {
            self.$to().delete(lease)
        }
    };
}

impl<L: LeaseStore> LeaseStore for Counted<L> {
    delegate_writes!(to);

    fn owned_by(
        &self,
        owner: &WorkerId,
    ) -> impl Future<Output = Result<Vec<ShardId>, BackendError>> + Send {
        self.to().owned_by(owner)
    }
}

impl<L: LeaseStore> LeaseStoreExtras for Counted<L> {
    fn changes(
        &self,
        from: Option<&FeedPosition>,
    ) -> impl Future<Output = Result<FeedRead, BackendError>> + Send {
        self.to().changes(from)
    }

    fn usage(&self) -> Option<Usage> {
        self.to().usage()
    }

    fn unreadable(&self) -> Vec<kcl_core::lease::UnreadableRow> {
        self.to().unreadable()
    }
}

/// A store without a feed or an owner index: the defaults of `changes` and `owned_by`.
impl<L: LeaseStore> LeaseStore for WholeTable<L> {
    delegate_writes!(to);
}

impl<L: LeaseStore> LeaseStoreExtras for WholeTable<L> {
    fn usage(&self) -> Option<Usage> {
        self.to().usage()
    }

    fn unreadable(&self) -> Vec<kcl_core::lease::UnreadableRow> {
        self.to().unreadable()
    }
}

#[tokio::test(start_paused = true)]
async fn a_wrapped_store_keeps_the_feed_and_the_owner_index() {
    let m = per_interval_through(10, WorkerConfig::default(), Counted::new).await;
    let whole = requests(&m, Operation::List) + requests(&m, Operation::Snapshot);
    eprintln!(
        "wrapped, 10 workers over {SHARDS} shards: {} rows an interval, {whole} whole-table reads in {INTERVALS} intervals",
        m.rows_read
    );
    assert_all_held_and_balanced(10, &m.held);
    assert_eq!(
        whole, 0,
        "no whole-table read in the window: {:?}",
        m.window
    );
    assert!(requests(&m, Operation::ReadChanges) > 0, "{:?}", m.window);
    assert!(requests(&m, Operation::OwnedBy) > 0, "{:?}", m.window);
    assert!(m.rows_read <= bound(), "{} rows an interval", m.rows_read);
}

#[tokio::test(start_paused = true)]
async fn a_wrapper_that_reads_the_whole_table_instead_exceeds_the_bound() {
    let wrap = |store| WholeTable(Counted::new(store));
    let m = per_interval_through(10, WorkerConfig::default(), wrap).await;
    let whole = requests(&m, Operation::List) + requests(&m, Operation::Snapshot);
    eprintln!(
        "whole-table wrapper, 10 workers over {SHARDS} shards: {} rows an interval, {whole} whole-table reads",
        m.rows_read
    );
    assert!(m.rows_read > bound(), "{} rows an interval", m.rows_read);
    assert!(whole >= u64::from(INTERVALS), "{:?}", m.window);
}
