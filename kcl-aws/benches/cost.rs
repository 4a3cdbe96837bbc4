//! What the lease table costs a fleet in steady state: reads, writes and request units per
//! shard-hour, and dollars per 1,000 shards per month on on-demand DynamoDB, for fleets of
//! 10 and 100 workers over 1,000 and 10,000 shards, next to KCL Java 3.x's rates: every worker
//! reading the table, the default (a leader; per-lease renewals), and a leader with
//! heartbeats (`Liveness::Heartbeat`).
//!
//! `cargo bench -p kcl-aws --bench cost` (add `-- --quick` for the 1,000-shard rows only)
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
//! KCL Java 3.x is not run here; its load comes from `kcl_aws::cost::kcl_java`, a model of
//! what a real KCL Java 3.1.3 fleet was measured sending (see that module), and every figure
//! is priced with `kcl_aws::cost::Prices::default()` (on demand, us-east-1).
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::time::Duration;

use kcl_aws::cost::{Fleet, Load, Prices, kcl_java};
use kcl_core::lease::usage::{Operation, Tally};
use kcl_core::{Coordination, Liveness, WorkerConfig};

#[path = "../tests/support/idle_fleet.rs"]
mod idle_fleet;

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
        let (store, stops) = idle_fleet::start(shards, workers, config);
        tokio::time::sleep(SETTLE).await;
        let row_bytes = idle_fleet::row_bytes(&store);
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

fn dollars_per_1000_shards_month(load: &Load, shards: u32) -> f64 {
    load.dollars_per_month(&Prices::default()) * 1000.0 / f64::from(shards)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    println!(
        "| workers | shards | mode | requests/s | of which feed reads/s | read units per shard-hour | write units per shard-hour | $ per 1,000 shards per month | the model's $ | vs KCL Java |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
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
                    Coordination::EveryWorker,
                    Liveness::PerLease,
                ),
                ("leader (default)", Coordination::Leader, Liveness::PerLease),
                (
                    "leader, heartbeats",
                    Coordination::Leader,
                    Liveness::Heartbeat,
                ),
            ];
            let fleet = Fleet::new(shards, u32::try_from(workers).unwrap());
            let hour = 3600.0 / f64::from(shards);
            let mut java = None;
            for (mode, coordination, liveness) in modes {
                let config = config.clone().coordination(coordination).liveness(liveness);
                let m = measure(workers, shards, &config);
                row_bytes = m.row_bytes;
                let fleet = fleet.row_bytes(u32::try_from(row_bytes).unwrap());
                let java_load = *java.get_or_insert_with(|| kcl_java(&fleet));
                let mut load = Load::default();
                load.read_units = m.reads_per_s;
                load.write_units = m.writes_per_s;
                load.stream_reads = m.feed_reads_per_s;
                let ours = dollars_per_1000_shards_month(&load, shards);
                let model = kcl_aws::cost::estimate(&fleet, coordination, liveness);
                let modelled = dollars_per_1000_shards_month(&model, shards);
                let theirs = dollars_per_1000_shards_month(&java_load, shards);
                println!(
                    "| {workers} | {shards} | {mode} | {:.0} | {:.1} | {:.1} | {:.1} | {ours:.1} | {modelled:.1} | {:.3}× |",
                    m.requests_per_s,
                    m.feed_reads_per_s,
                    m.reads_per_s * hour,
                    m.writes_per_s * hour,
                    ours / theirs
                );
                if m.takes > 0 {
                    println!("(not settled: {} takes in the window)", m.takes);
                }
            }
            if let Some(load) = java {
                println!(
                    "| {workers} | {shards} | KCL Java 3.x (model of a measured fleet) | | | {:.1} | {:.1} | {:.1} | | 1.000× |",
                    load.read_units * hour,
                    load.write_units * hour,
                    dollars_per_1000_shards_month(&load, shards),
                );
            }
        }
    }
    let prices = Prices::default();
    println!(
        "rows of {row_bytes} bytes on average; on-demand prices ${}/${} per million read/write units, ${} per million stream reads",
        prices.read_unit, prices.write_unit, prices.stream_read
    );
}
