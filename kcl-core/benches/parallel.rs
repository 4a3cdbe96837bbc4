//! Per-key parallelism against one record at a time: one shard, a handler that awaits 10 ms
//! per record (an I/O call), records per second at N = 1, 4, 10 and 32 records in flight,
//! against N × the sequential rate. Keys spread over 1,000 distinct values; then 3 hot keys
//! carry 90 % of the records, where one key's records still go one at a time. Real time on
//! the in-memory backends, a 2-thread runtime; medians of several runs, and the process's
//! peak RSS after each row (the records themselves included).
//!
//! `cargo bench -p kcl-core --bench parallel`
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{BoxError, Parallel, Record, Worker, WorkerConfig};

/// What a record costs its handler.
const LATENCY: Duration = Duration::from_millis(10);
/// Runs per row; the table shows the median.
const RUNS: usize = 3;

/// How records are keyed.
#[derive(Clone, Copy)]
enum Keys {
    /// 1,000 distinct keys, evenly.
    Spread,
    /// 3 keys carry 90 % of the records; the rest spread over 997 others.
    Hot,
}

fn key(keys: Keys, i: usize) -> String {
    match keys {
        Keys::Spread => format!("k{}", i % 1000),
        Keys::Hot if i % 10 < 9 => format!("hot{}", i % 3),
        Keys::Hot => format!("k{}", 3 + i % 997),
    }
}

/// Records per second for one worker on one shard of `records` records, N in flight.
fn run(n: usize, records: usize, keys: Keys) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let stream = MemoryStream::new(1);
        for i in 0..records {
            stream.put(&key(keys, i), format!("{i}"));
        }
        let done = Arc::new(AtomicUsize::new(0));
        let counter = done.clone();
        let handler = move |_: Record| {
            let counter = counter.clone();
            async move {
                tokio::time::sleep(LATENCY).await;
                counter.fetch_add(1, Ordering::Relaxed);
                Ok::<(), BoxError>(())
            }
        };
        let config = WorkerConfig::default().idle_time_between_reads(Duration::from_millis(5));
        let factory = Parallel::new(handler).max_in_flight(n);
        let worker =
            Worker::new("bench", config, stream, MemoryLeaseStore::new(), factory).unwrap();
        let stop = worker.shutdown_handle();
        let start = Instant::now();
        let task = tokio::spawn(worker.run());
        while done.load(Ordering::Relaxed) < records {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = start.elapsed().as_secs_f64();
        stop.shutdown();
        task.await.unwrap().unwrap();
        records as f64 / took
    })
}

/// The process's peak resident set so far, MiB (Linux; 0 elsewhere).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median rate of `RUNS` runs of about 3 s each.
fn measure(n: usize, keys: Keys) -> f64 {
    // About 3 s at the rate the keys allow: N × 100 a second, or 300 with the hot keys.
    let records = match keys {
        Keys::Spread => 300 * n,
        Keys::Hot => 300 * n.min(3),
    };
    median((0..RUNS).map(|_| run(n, records, keys)).collect())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("parallel: bench");
        return;
    }
    let sequential = measure(1, Keys::Spread);
    println!(
        "one shard, {} ms a record; N records in flight; median of {RUNS} runs",
        LATENCY.as_millis()
    );
    println!();
    println!("| keys | N | records/s | N × sequential | ratio | peak RSS so far |");
    println!("|---|---:|---:|---:|---:|---:|");
    for keys in [Keys::Spread, Keys::Hot] {
        let label = match keys {
            Keys::Spread => "1,000 even",
            Keys::Hot => "3 hot (90 %)",
        };
        for n in [1, 4, 10, 32] {
            // One key at a time is the sequential run whatever the keys.
            let rate = if n == 1 { sequential } else { measure(n, keys) };
            let ideal = sequential * n as f64;
            println!(
                "| {label} | {n} | {rate:.0} | {ideal:.0} | {:.2} | {:.1} MiB |",
                rate / ideal,
                peak_rss_mib()
            );
        }
    }
    println!();
    println!(
        "3 hot keys with 30 % of the records each: one key runs one record at a time, so no N \
         goes past 1 / 0.30 = 3.3 × the sequential rate"
    );
}
