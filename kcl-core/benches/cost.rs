//! What the lease table costs a fleet in steady state: reads, writes and request units per
//! shard-hour, and dollars per 1,000 shards per month on on-demand DynamoDB, for fleets of
//! 10 and 100 workers over 1,000 and 10,000 shards, next to KCL Java 3.x's rates: every worker
//! reading the table, the default (a leader; per-lease renewals), and a leader with
//! heartbeats (`Liveness::Heartbeat`).
//!
//! `cargo bench -p kcl-core --bench cost` (add `-- --quick` for the 1,000-shard rows only)
//!
//! Each fleet runs on the in-memory backends under paused tokio time, so a simulated minute
//! takes seconds: the workers start on a table that already assigns every lease (as after a
//! restart), run 20 s to settle, then the store's request accounting is read over 60 s. The
//! stream is idle, so only coordination is counted (renewals, scans, takes): checkpoints cost
//! the same in every mode and are the application's choice. Units are those DynamoDB would
//! charge for the rows actually stored (`kcl_core::lease::usage`). Reads of the change feed
//! (DynamoDB Streams) are billed per request, at $0.02 per 100,000, counted here without the
//! 2.5 million free a month.
//!
//! KCL Java 3.x is not run here; its rates are computed from how it works (v3.1):
//! a renewal per lease every failover/3 − ε (`CommonCalculations.getRenewerTakerIntervalMillis`,
//! ε = 25 ms by default: every 3,308 ms at a 10 s failover time; ours renew every
//! failover/3, 3,333 ms), the leader's eventually consistent scan every 20 s,
//! one eventually consistent query of the `leaseOwner` index per worker every 10 s, and one
//! worker-metrics write per worker every 30 s, on rows of the same size as ours.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::time::Duration;

use kcl_core::lease::usage::{self, Operation, Tally};
use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{
    Checkpoint, Coordination, Lease, Liveness, ShardId, Worker, WorkerConfig, WorkerId,
};

/// On-demand prices, us-east-1: dollars per million request units.
const READ_PRICE: f64 = 0.25;
const WRITE_PRICE: f64 = 1.25;
/// DynamoDB Streams: dollars per million `GetRecords` requests.
const STREAM_PRICE: f64 = 0.20;
const HOURS_PER_MONTH: f64 = 730.0;
/// KCL Java's `epsilonMillis` default, in seconds.
const KCL_JAVA_EPSILON: f64 = 0.025;
const SETTLE: Duration = Duration::from_secs(20);
const WINDOW: Duration = Duration::from_secs(60);

/// Request units per second over the window, and what else happened.
struct Measured {
    reads_per_s: f64,
    writes_per_s: f64,
    requests_per_s: f64,
    feed_reads_per_s: f64,
    takes: u64,
    row_bytes: usize,
}

fn measure(workers: usize, shards: u32, config: &WorkerConfig) -> Measured {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = MemoryStream::new(shards);
        let store = MemoryLeaseStore::new();
        let ids: Vec<WorkerId> = (0..workers)
            .map(|i| WorkerId::from(format!("worker-{i:03}").as_str()))
            .collect();
        for (i, shard) in stream.shards().into_iter().enumerate() {
            let mut lease = Lease::new(shard.id, Checkpoint::TrimHorizon);
            lease.hash_key_range = Some(shard.hash_key_range);
            lease.owner = Some(ids[i % workers].clone());
            store.insert(lease);
        }
        let row_bytes =
            store.leases().iter().map(usage::item_size).sum::<usize>() / shards as usize;
        let mut stops = Vec::new();
        for id in &ids {
            let worker = Worker::new(
                id.as_str(),
                config.clone(),
                stream.client(id.as_str()),
                store.client(id.as_str()),
                |_: &ShardId| IdleProcessor,
            )
            .unwrap();
            stops.push(worker.shutdown_handle());
            tokio::spawn(worker.run());
        }
        tokio::time::sleep(SETTLE).await;
        let before = store.table_usage().by_operation();
        tokio::time::sleep(WINDOW).await;
        let after = store.table_usage().by_operation();
        for stop in &stops {
            stop.force();
        }
        let mut window = Tally::default();
        for (op, tally) in &after {
            let earlier = before.get(op).copied().unwrap_or_default();
            window += Tally {
                requests: tally.requests - earlier.requests,
                rows: tally.rows - earlier.rows,
                read_units: tally.read_units - earlier.read_units,
                write_units: tally.write_units - earlier.write_units,
            };
        }
        let count = |m: &std::collections::BTreeMap<Operation, Tally>, op| {
            m.get(&op).map_or(0, |t| t.requests)
        };
        let take = |m| count(m, Operation::Take);
        let feed = count(&after, Operation::ReadChanges) - count(&before, Operation::ReadChanges);
        let secs = WINDOW.as_secs_f64();
        Measured {
            reads_per_s: window.read_units / secs,
            writes_per_s: window.write_units / secs,
            requests_per_s: window.requests as f64 / secs,
            feed_reads_per_s: feed as f64 / secs,
            takes: take(&after) - take(&before),
            row_bytes,
        }
    })
}

/// KCL Java 3.x's units per second for the same fleet (see the module docs).
fn kcl_java(workers: usize, shards: u32, row_bytes: usize) -> (f64, f64) {
    let failover = WorkerConfig::default().failover_time.as_secs_f64();
    let renewals = f64::from(shards) / (failover / 3.0 - KCL_JAVA_EPSILON);
    let stats_writes = workers as f64 / 30.0;
    let scan = usage::read_units(shards as usize * row_bytes, false) / 20.0;
    // The index holds keys and owner only (about 60 bytes a lease).
    let per_worker = shards as usize / workers * 60;
    let queries = workers as f64 * usage::read_units(per_worker, false) / 10.0;
    (scan + queries, renewals + stats_writes)
}

fn dollars_per_1000_shards_month(reads: f64, writes: f64, feed: f64, shards: u32) -> f64 {
    let per_second = (reads * READ_PRICE + writes * WRITE_PRICE + feed * STREAM_PRICE) / 1e6;
    per_second * 3600.0 * HOURS_PER_MONTH * 1000.0 / f64::from(shards)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    println!(
        "| workers | shards | mode | requests/s | of which feed reads/s | read units per shard-hour | write units per shard-hour | $ per 1,000 shards per month | vs KCL Java |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut row_bytes = 0;
    for shards in [1_000, 10_000] {
        if quick && shards > 1_000 {
            continue;
        }
        for workers in [10, 100] {
            let config = WorkerConfig::default();
            let modes = [
                (
                    "every worker reads the table",
                    config.clone().coordination(Coordination::EveryWorker),
                ),
                ("leader (default)", config.clone()),
                (
                    "leader, heartbeats",
                    config.clone().liveness(Liveness::Heartbeat),
                ),
            ]
            .map(|(mode, config)| (mode, measure(workers, shards, &config)));
            row_bytes = modes[0].1.row_bytes;
            let (java_reads, java_writes) = kcl_java(workers, shards, row_bytes);
            let java = dollars_per_1000_shards_month(java_reads, java_writes, 0.0, shards);
            let hour = 3600.0 / f64::from(shards);
            for (mode, m) in &modes {
                let ours = dollars_per_1000_shards_month(
                    m.reads_per_s,
                    m.writes_per_s,
                    m.feed_reads_per_s,
                    shards,
                );
                println!(
                    "| {workers} | {shards} | {mode} | {:.0} | {:.1} | {:.1} | {:.1} | {ours:.1} | {:.3}× |",
                    m.requests_per_s,
                    m.feed_reads_per_s,
                    m.reads_per_s * hour,
                    m.writes_per_s * hour,
                    ours / java
                );
                if m.takes > 0 {
                    println!("(not settled: {} takes in the window)", m.takes);
                }
            }
            println!(
                "| {workers} | {shards} | KCL Java 3.x (computed) | | | {:.1} | {:.1} | {java:.1} | 1.000× |",
                java_reads * hour,
                java_writes * hour,
            );
        }
    }
    println!(
        "rows of {row_bytes} bytes on average; on-demand prices ${READ_PRICE}/${WRITE_PRICE} per million read/write units"
    );
}
