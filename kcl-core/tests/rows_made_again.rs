//! A lease row deleted and made again starts its counter over (issue 52: an operator's
//! delete, a table rebuilt): a worker that did not read the table while it happened must not
//! take the new row for the old one standing still when its counter comes round to a value
//! the worker saw before. Found by the simulation (seed 219 of 1,000 with the sink seeds'
//! operator: a worker cut off from the table for 12 s took a lease 0.8 s after the leader
//! assigned it to a live worker, its counter that of the deleted row it last saw). Here
//! under per-lease renewals, where the same thing takes a lease its holder renewed a moment
//! ago: the taker's observer (`lease/observer.rs`) keeps a row's `since` when the counter is
//! the one it saw last, whoever the row names now, and the owner's heartbeat-absence clock
//! (`worker/liveness.rs`) does not help when the new owner was seen before, holding another
//! lease. Real workers on the in-memory backends under paused time.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryStream, StoreEvent};
use kcl_core::{
    BoxError, Checkpointer, Coordination, Lease, LeaseStore, Liveness, ProcessRecordsInput,
    RecordProcessor, ShardId, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const FAILOVER: Duration = Duration::from_secs(3);

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(FAILOVER)
        .taker_interval(Duration::from_millis(500))
        .shard_sync_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(100))
        .coordination(Coordination::EveryWorker)
        .liveness(Liveness::PerLease)
}

/// Reads and never checkpoints: the lease's counter moves by renewals alone.
struct Idle;

impl RecordProcessor for Idle {
    async fn process_records(
        &mut self,
        _: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

fn start(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    faults: &Faults,
    id: &str,
) -> JoinHandle<Result<(), kcl_core::Error>> {
    let worker = Worker::builder(stream.client(id), store.client(id))
        .id(id)
        .config(config())
        .build(|_: &ShardId| Idle)
        .unwrap();
    tokio::spawn(faults.run_as(id, worker.run()))
}

/// The lease row of `key`, once `done` holds for it (at most `limit` from now).
async fn until(
    store: &MemoryLeaseStore,
    key: &ShardId,
    limit: Duration,
    done: impl Fn(&Lease) -> bool,
) -> Lease {
    let end = Instant::now() + limit;
    loop {
        let row = store.leases().into_iter().find(|l| &l.key == key);
        match row {
            Some(row) if done(&row) => return row,
            _ if Instant::now() >= end => panic!("{key} not within {limit:?}: {row:?}"),
            _ => sleep(Duration::from_millis(10)).await,
        }
    }
}

fn owned_by(row: &Lease, id: &str) -> bool {
    row.owner.as_ref().is_some_and(|o| o.as_str() == id)
}

/// Takes of `key` by `taker` from another owner that were not handed over, after `from`.
fn taken_from_others(
    store: &MemoryLeaseStore,
    key: &ShardId,
    taker: &str,
    from: u64,
) -> Vec<String> {
    let events: Vec<StoreEvent> = store
        .journal()
        .into_iter()
        .filter(|e| &e.lease.key == key)
        .collect();
    events
        .windows(2)
        .filter(|w| w[1].seq > from && w[1].operation == "take" && w[1].client == taker)
        .filter(|w| w[0].lease.owner.is_some() && !owned_by(&w[0].lease, taker))
        .filter(|w| {
            w[0].lease
                .handoff_to
                .as_ref()
                .is_none_or(|h| h.as_str() != taker)
        })
        .map(|w| {
            format!(
                "{taker} took {key} from {:?} {:?} after its last write (counter {})",
                w[0].lease.owner,
                w[1].started - w[0].at,
                w[0].lease.counter
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_row_made_again_is_not_taken_for_the_old_one_standing_still() {
    let faults = Faults::seeded(219);
    let stream = MemoryStream::new(2);
    let store = MemoryLeaseStore::with_faults(faults.clone());
    // a and c hold a shard each, a's counter moving on with its renewals; b joins and reads
    // the table (two shards, three workers: balanced, it takes nothing).
    let a = start(&stream, &store, &faults, "a");
    let c = start(&stream, &store, &faults, "c");
    let end = Instant::now() + Duration::from_secs(30);
    let of_a = loop {
        let rows = store.leases();
        let holder = |id: &str| rows.iter().find(|l| owned_by(l, id)).map(|l| l.key.clone());
        let both = rows.iter().filter(|l| l.owner.is_some()).count() == 2;
        if let (true, Some(of_a), Some(_)) = (both, holder("a"), holder("c")) {
            break of_a;
        }
        assert!(
            Instant::now() < end,
            "a and c never held a shard each: {rows:?}"
        );
        sleep(Duration::from_millis(10)).await;
    };
    until(&store, &of_a, Duration::from_secs(10), |l| {
        owned_by(l, "a") && l.counter >= 4
    })
    .await;
    let b = start(&stream, &store, &faults, "b");
    sleep(Duration::from_millis(1_200)).await;
    // a dies: its row stands at `seen` while b watches it (less than the failover time), and
    // b is cut off from the table.
    a.abort();
    let _ = a.await;
    let seen = until(&store, &of_a, Duration::ZERO, |_| true).await.counter;
    sleep(Duration::from_millis(1_200)).await;
    faults.partition("b");
    // The operator deletes the row; c's shard sync makes it again and c takes it, renewing
    // until its counter is the one b saw.
    let operator = store.client("operator");
    let row = operator.get(&of_a).await.unwrap().unwrap();
    assert!(owned_by(&row, "a") && row.counter == seen, "{row:?}");
    operator.delete(&row).await.unwrap();
    until(&store, &of_a, Duration::from_secs(30), |l| {
        owned_by(l, "c") && l.counter == seen
    })
    .await;
    // b reads the table again: the row it sees moved a moment ago, to c, alive.
    let healed = kcl_core::memory::next_event_seq();
    faults.heal("b");
    sleep(FAILOVER / 2).await;
    assert_eq!(
        taken_from_others(&store, &of_a, "b", healed),
        Vec::<String>::new()
    );
    b.abort();
    c.abort();
}
