//! `kcl_aws::cost` against fleets that run: idle fleets on the in-memory backends (paused
//! time), whose store counts every request with the units DynamoDB would charge, compared
//! with the model's figures for the same fleet. Tables here are over 12 KB, so observers follow
//! the feed (the in-memory store has no small-table rule; the emulator bill checks that part).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_aws::cost::{Fleet, Load, estimate};
use kcl_core::lease::usage::Operation;
use kcl_core::{Coordination, Liveness, WorkerConfig};

#[path = "support/idle_fleet.rs"]
mod idle_fleet;

const SETTLE: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(120);

/// The load of `workers` idle workers over `shards` in `config`, measured over the window,
/// and the average row size.
async fn measured(shards: u32, workers: usize, config: &WorkerConfig) -> (Load, u32) {
    let (store, stops) = idle_fleet::start(shards, workers, config);
    tokio::time::sleep(SETTLE).await;
    let row_bytes = idle_fleet::row_bytes(&store);
    let before = store.table_usage();
    let (total, feed) = (before.total(), before.of(Operation::ReadChanges));
    tokio::time::sleep(WINDOW).await;
    let after = store.table_usage();
    for stop in &stops {
        stop.force();
    }
    let secs = WINDOW.as_secs_f64();
    let mut load = Load::default();
    load.write_units = (after.total().write_units - total.write_units) / secs;
    load.read_units = (after.total().read_units - total.read_units) / secs;
    #[allow(clippy::cast_precision_loss)]
    let stream_reads = (after.of(Operation::ReadChanges).requests - feed.requests) as f64 / secs;
    load.stream_reads = stream_reads;
    (load, u32::try_from(row_bytes).unwrap())
}

fn close(what: &str, measured: f64, model: f64, within: f64) {
    let slack = within * model.max(0.5);
    assert!(
        (measured - model).abs() <= slack,
        "{what}: measured {measured:.3}/s, the model says {model:.3}/s"
    );
}

#[tokio::test(start_paused = true)]
async fn the_model_matches_fleets_that_run() {
    let config = WorkerConfig::default();
    let modes = [
        (
            "leader, per lease",
            Coordination::Leader,
            Liveness::PerLease,
        ),
        (
            "leader, heartbeats",
            Coordination::Leader,
            Liveness::Heartbeat,
        ),
        (
            "every worker",
            Coordination::EveryWorker,
            Liveness::PerLease,
        ),
    ];
    for (shards, workers) in [(120, 4), (120, 12)] {
        for (name, coordination, liveness) in modes {
            let config = config.clone().coordination(coordination).liveness(liveness);
            let (load, row_bytes) = measured(shards, workers, &config).await;
            let fleet = Fleet::new(shards, u32::try_from(workers).unwrap()).row_bytes(row_bytes);
            let model = estimate(&fleet, coordination, liveness);
            eprintln!(
                "{shards} shards, {workers} workers, {name}: measured {load:?}, model {model:?}"
            );
            let what = format!("{shards} shards, {workers} workers, {name}");
            close(
                &format!("{what}, writes"),
                load.write_units,
                model.write_units,
                0.05,
            );
            // Reads: the observers' full read every 5 minutes is spread over the model's
            // seconds, not in this window.
            close(
                &format!("{what}, reads"),
                load.read_units,
                model.read_units,
                0.15,
            );
            close(
                &format!("{what}, stream reads"),
                load.stream_reads,
                model.stream_reads,
                0.1,
            );
        }
    }
}
