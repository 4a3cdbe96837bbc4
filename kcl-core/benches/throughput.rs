//! How many records per second one worker pushes through its pipeline (fetch, prefetch,
//! processor call, fenced checkpoint per batch) on the in-memory backends: the framework's own
//! overhead, with no network. Prints a table of medians over several runs.
//!
//! `cargo bench -p kcl-core --bench throughput`
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker, WorkerConfig,
};

struct Count(Arc<AtomicUsize>);

impl RecordProcessor for Count {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(input.records.len(), Ordering::Relaxed);
        cp.checkpoint().await?;
        Ok(())
    }
}

/// Seconds to deliver `records` records spread over `shards` shards.
fn run(shards: u32, records: usize, max_records: u32) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = MemoryStream::new(shards);
        let payload = bytes::Bytes::from(vec![b'x'; 100]);
        for i in 0..records {
            stream.put(&format!("k{i}"), payload.clone());
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let config = WorkerConfig::default()
            .max_records(max_records)
            .idle_time_between_reads(Duration::from_millis(5));
        let worker = Worker::new(
            "bench",
            config,
            stream,
            MemoryLeaseStore::new(),
            move |_: &ShardId| Count(counter.clone()),
        )
        .unwrap();
        let stop = worker.shutdown_handle();
        let start = Instant::now();
        let task = tokio::spawn(worker.run());
        while seen.load(Ordering::Relaxed) < records {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = start.elapsed().as_secs_f64();
        stop.shutdown();
        task.await.unwrap().unwrap();
        took
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    const RUNS: usize = 5;
    let records = 200_000;
    println!("| shards | batch size | records | median records/s | median ns/record |");
    println!("|-------:|-----------:|--------:|-----------------:|-----------------:|");
    for (shards, batch) in [(1, 10_000), (4, 10_000), (16, 10_000), (4, 100)] {
        let secs = median((0..RUNS).map(|_| run(shards, records, batch)).collect());
        #[allow(clippy::cast_precision_loss)]
        let n = records as f64;
        println!(
            "| {shards} | {batch} | {records} | {:.0} | {:.0} |",
            n / secs,
            secs * 1e9 / n
        );
    }
}
