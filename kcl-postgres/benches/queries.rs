//! What a Postgres lease table costs a fleet in steady state: statements per shard-hour, by
//! operation and in total, and rows read per shard-hour. Postgres bills no request units, so
//! statements and rows are its bill-equivalent (see docs/postgres.md).
//!
//! `cargo bench -p kcl-postgres --bench queries` (add `-- --quick` for the 8-shard fleet only)
//!
//! The fleets are the DynamoDB cost bench's (`kcl-aws/benches/cost.rs`, the same
//! `idle_fleet` module): idle workers on the in-memory backends under paused tokio time,
//! starting on a table that already assigns every lease, 20 s to settle, then the store's
//! request accounting (`kcl_core::lease::usage`) read over 60 s. What makes them Postgres
//! fleets is the table's features: `PostgresLeaseStore::ensure_table` reports the owner index
//! and no change feed, so the in-memory store is told it has no feed
//! (`MemoryLeaseStore::set_feed(None)`) before any worker asks; its owner index is current,
//! as Postgres's is. Without a feed the leader and the standby read the whole table every
//! taker interval (`snapshot`) instead of following the feed.
//!
//! Each `LeaseStore` call of `PostgresLeaseStore` is one statement (`kcl-postgres/src/sql.rs`),
//! so the model's requests are statements, with one exception: the observers still ask the
//! in-memory store for its changes (`read_changes`, answered "no feed"), which the Postgres
//! store answers without a statement (the trait's default). Those are printed apart and left
//! out of the totals.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::collections::BTreeMap;
use std::time::Duration;

use kcl_core::lease::usage::{Operation, Tally};
use kcl_core::memory::MemoryLeaseStore;
use kcl_core::{Coordination, Liveness, WorkerConfig};

#[allow(dead_code)]
#[path = "../../kcl-aws/tests/support/idle_fleet.rs"]
mod idle_fleet;

const SETTLE: Duration = Duration::from_secs(20);
const WINDOW: Duration = Duration::from_secs(60);

/// The statement `PostgresLeaseStore` sends for `op` (`kcl-postgres/src/sql.rs`).
fn statement(op: Operation) -> &'static str {
    match op {
        Operation::List | Operation::Snapshot => "SELECT the application's rows",
        Operation::Get | Operation::Peek => "SELECT one row by key",
        Operation::OwnedBy => "SELECT lease_key by owner (owner index)",
        Operation::Renew | Operation::Take | Operation::Checkpoint | Operation::Reset => {
            "UPDATE … RETURNING, conditional"
        }
        Operation::Release | Operation::RequestHandoff => "UPDATE, conditional",
        Operation::Unpark | Operation::RequestRedrive => "UPDATE",
        Operation::Create => "INSERT … ON CONFLICT DO NOTHING",
        Operation::Delete => "DELETE, conditional",
        Operation::ReadChanges => "none (no change feed)",
        _ => "not one statement (startup, or not a Postgres operation)",
    }
}

/// The requests of each operation in the window: `after` less `before`.
fn window(
    before: &BTreeMap<Operation, Tally>,
    after: &BTreeMap<Operation, Tally>,
) -> BTreeMap<Operation, Tally> {
    after
        .iter()
        .map(|(op, tally)| {
            let earlier = before.get(op).copied().unwrap_or_default();
            let diff = Tally {
                requests: tally.requests - earlier.requests,
                rows: tally.rows - earlier.rows,
                ..Tally::default()
            };
            (*op, diff)
        })
        .filter(|(_, tally)| tally.requests > 0)
        .collect()
}

/// Runs `workers` idle workers over `shards` shards on a table without a change feed and
/// returns each operation's requests (and rows read) over the window.
fn measure(workers: usize, shards: u32, config: &WorkerConfig) -> BTreeMap<Operation, Tally> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let (store, stops) = idle_fleet::start(shards, workers, config);
        // The workers are spawned but not yet polled (one thread, no await since): each asks
        // for the table's features after this.
        store.set_feed(None);
        tokio::time::sleep(SETTLE).await;
        let before = store.table_usage().by_operation();
        tokio::time::sleep(WINDOW).await;
        let after = store.table_usage().by_operation();
        for stop in &stops {
            stop.force();
        }
        check_without_feed(&store, &window(&before, &after));
        window(&before, &after)
    })
}

/// Fails unless the fleet ran as on Postgres: the observers reading the table whole every
/// taker interval, no feed read returning a change.
fn check_without_feed(store: &MemoryLeaseStore, counts: &BTreeMap<Operation, Tally>) {
    let snapshots = counts.get(&Operation::Snapshot).map_or(0, |t| t.requests);
    let feed_rows = counts.get(&Operation::ReadChanges).map_or(0, |t| t.rows);
    let expected = 2 * WINDOW.as_secs() * 9 / 10;
    assert!(
        snapshots >= expected && feed_rows == 0,
        "not a fleet without a change feed: {snapshots} snapshots in the window (at least \
         {expected} expected: leader and standby every second), {feed_rows} changes read; \
         {} rows",
        store.leases().len()
    );
}

/// Prints one fleet's statements by operation and its totals, per shard-hour.
fn report(workers: usize, shards: u32, mode: &str, counts: &BTreeMap<Operation, Tally>) {
    let secs = WINDOW.as_secs_f64();
    let per_shard_hour = |n: u64| n as f64 / secs * 3600.0 / f64::from(shards);
    println!("\n{workers} workers × {shards} shards, {mode}:\n");
    println!(
        "| operation | statement | statements/s | statements per shard-hour | rows read per shard-hour |"
    );
    println!("|---|---|---:|---:|---:|");
    let (mut statements, mut writes, mut rows) = (0, 0, 0);
    for (op, tally) in counts {
        let (n, read) = (tally.requests, tally.rows);
        println!(
            "| {op} | {} | {:.2} | {:.1} | {:.1} |",
            statement(*op),
            n as f64 / secs,
            per_shard_hour(n),
            per_shard_hour(read),
        );
        if *op != Operation::ReadChanges {
            statements += n;
            rows += read;
            if !op.is_read() {
                writes += n;
            }
        }
    }
    println!(
        "| **all but read_changes** | | {:.2} | {:.1} (writes {:.1}) | {:.1} |",
        statements as f64 / secs,
        per_shard_hour(statements),
        per_shard_hour(writes),
        per_shard_hour(rows),
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let modes = [
        ("leader, per-lease renewals (default)", Liveness::PerLease),
        ("leader, heartbeats", Liveness::Heartbeat),
    ];
    for (workers, shards) in [(5, 8), (10, 1_000)] {
        if quick && shards > 8 {
            continue;
        }
        for (mode, liveness) in modes {
            let config = WorkerConfig::default()
                .coordination(Coordination::Leader)
                .liveness(liveness);
            let counts = measure(workers, shards, &config);
            report(workers, shards, mode, &counts);
        }
    }
    println!(
        "\nread_changes: the observers asking a table without a feed for its changes; no \
         statement on Postgres (left out of the totals)"
    );
}
