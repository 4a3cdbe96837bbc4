//! How many records per second one worker pushes through its pipeline (fetch, prefetch,
//! processor call, fenced checkpoint per batch) on the in-memory backends, against a bare
//! loop that reads the same source with the same batch size and does nothing else: the
//! framework's own overhead, with no network. Both run on one core (a current-thread
//! runtime), alternately, and the table shows medians over several runs and their ratio.
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
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, ShardSource,
    StartingPosition, Worker, WorkerConfig,
};

struct Count(Arc<AtomicUsize>);

impl RecordProcessor for Count {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(input.records().len(), Ordering::Relaxed);
        cp.checkpoint().await?;
        Ok(())
    }
}

/// A stream of `shards` shards holding `records` records of `size` bytes.
fn filled(shards: u32, records: usize, size: usize) -> MemoryStream {
    let stream = MemoryStream::new(shards);
    let payload = bytes::Bytes::from(vec![b'x'; size]);
    for i in 0..records {
        stream.put(&format!("k{i}"), payload.clone());
    }
    stream
}

fn one_core() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Seconds for one worker to deliver every record of `stream`.
fn worker(stream: MemoryStream, records: usize, batch: u32) -> f64 {
    one_core().block_on(async {
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let config = WorkerConfig::default()
            .max_records(batch)
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

/// Seconds for a bare loop per shard (iterator, then `get_records` until the shard is read)
/// to read every record of `stream`.
fn bare(stream: &MemoryStream, records: usize, batch: u32) -> f64 {
    one_core().block_on(async {
        let shards = stream.list_shards().await.unwrap();
        let start = Instant::now();
        let mut tasks = Vec::new();
        let seen = Arc::new(AtomicUsize::new(0));
        for shard in shards {
            let (stream, seen) = (stream.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                let mut it = stream
                    .shard_iterator(&shard.id, &StartingPosition::TrimHorizon)
                    .await
                    .unwrap();
                // Until a read finds nothing more: the shard is read.
                loop {
                    let batch = stream.get_records(&it, batch).await.unwrap();
                    if batch.records.is_empty() {
                        break;
                    }
                    seen.fetch_add(batch.records.len(), Ordering::Relaxed);
                    it = batch.next_iterator.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(seen.load(Ordering::Relaxed), records);
        start.elapsed().as_secs_f64()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    const RUNS: usize = 5;
    const BATCH: u32 = 10_000;
    let records = 1_000_000;
    println!(
        "| shards | record bytes | records | worker records/s | bare loop records/s | worker / bare |"
    );
    println!("|-------:|------:|--------:|------:|------:|------:|");
    for (shards, size) in [(1, 100), (32, 100), (1, 1024), (32, 1024)] {
        let stream = filled(shards, records, size);
        let (mut with_worker, mut with_loop) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            with_worker.push(worker(stream.clone(), records, BATCH));
            with_loop.push(bare(&stream, records, BATCH));
        }
        #[allow(clippy::cast_precision_loss)]
        let n = records as f64;
        let (w, b) = (median(with_worker), median(with_loop));
        println!(
            "| {shards} | {size} | {records} | {:.0} | {:.0} | {:.2} |",
            n / w,
            n / b,
            b / w
        );
    }
}
