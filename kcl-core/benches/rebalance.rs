//! How fast a fleet rebalances when workers join, in each coordination mode, on the in-memory
//! backends under paused time (so the figures are simulated seconds, independent of this
//! machine's speed, and the same on every run).
//!
//! `cargo bench -p kcl-core --bench rebalance`
//!
//! 1. A third worker joins two that hold 32 shards: seconds (and taker cycles) until every
//!    worker holds 10 or 11.
//! 2. A 10% fleet change at scale: 10 workers join 90 that hold 1,000 shards: seconds until
//!    every worker holds 10.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::time::Duration;

use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
use kcl_core::{Coordination, Liveness, ShardId, ShutdownHandle, Status, Worker, WorkerConfig};
use tokio::sync::watch;
use tokio::time::Instant;

struct Fleet {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    config: WorkerConfig,
    statuses: Vec<watch::Receiver<Status>>,
    stops: Vec<ShutdownHandle>,
}

impl Fleet {
    fn start(&mut self, workers: usize) {
        for _ in 0..workers {
            let id = format!("w{:03}", self.statuses.len());
            let worker = Worker::new(
                id.as_str(),
                self.config.clone(),
                self.stream.client(&id),
                self.store.client(&id),
                |_: &ShardId| IdleProcessor,
            )
            .unwrap();
            self.statuses.push(worker.status());
            self.stops.push(worker.shutdown_handle());
            tokio::spawn(worker.run());
        }
    }

    fn held(&self) -> Vec<usize> {
        self.statuses
            .iter()
            .map(|s| s.borrow().held.len())
            .collect()
    }

    /// Waits until `done(held)`, at most `limit`; returns how long that took.
    async fn until(&self, limit: Duration, done: impl Fn(&[usize]) -> bool) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done(&self.held()) {
                return Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

/// Seconds from the join of `joining` workers to `existing` ones holding `shards`, until
/// every worker holds ⌊shards / workers⌋ or ⌈shards / workers⌉.
fn rebalance(config: WorkerConfig, shards: u32, existing: usize, joining: usize) -> Option<f64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut fleet = Fleet {
            stream: MemoryStream::new(shards),
            store: MemoryLeaseStore::new(),
            config: config.max_leases_to_steal(4),
            statuses: Vec::new(),
            stops: Vec::new(),
        };
        let all = shards as usize;
        fleet.start(existing);
        let even = |n: usize| {
            move |held: &[usize]| {
                held.iter().sum::<usize>() == all
                    && held.iter().all(|h| (all / n..=all.div_ceil(n)).contains(h))
            }
        };
        fleet
            .until(Duration::from_secs(600), even(existing))
            .await?;
        fleet.start(joining);
        let took = fleet
            .until(Duration::from_secs(600), even(existing + joining))
            .await;
        for stop in &fleet.stops {
            stop.force();
        }
        took.map(|d| d.as_secs_f64())
    })
}

fn main() {
    let taker = WorkerConfig::default().taker_interval.as_secs_f64();
    println!("| change | mode | seconds to balance | taker cycles |");
    println!("|---|---|---:|---:|");
    for (change, shards, existing, joining) in [
        ("a 3rd worker joins 2 holding 32 shards", 32, 2, 1),
        ("10 workers join 90 holding 1,000 shards", 1000, 90, 10),
    ] {
        let config = WorkerConfig::default();
        for (mode, config) in [
            (
                "every worker reads the table",
                config.clone().coordination(Coordination::EveryWorker),
            ),
            ("leader (default)", config.clone()),
            (
                "leader, heartbeats",
                config.clone().liveness(Liveness::Heartbeat),
            ),
        ] {
            match rebalance(config, shards, existing, joining) {
                Some(s) => println!("| {change} | {mode} | {s:.1} | {:.0} |", s / taker),
                None => println!("| {change} | {mode} | not within 600 s | |"),
            }
        }
    }
    println!(
        "(failover 10 s, renewals every 3.3 s (heartbeats every 5 s), taker 1 s, max_leases_to_steal 4; simulated time)"
    );
}
