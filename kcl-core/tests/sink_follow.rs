//! A sink that keeps each shard's position (issue 52): the lease row's checkpoint follows
//! each applied commit as a plain write, which may fail. The tenure knows where its own
//! commit left the sink, so its next commit must not be refused for it: found by the
//! simulation (seed 909 of 1,000), where the write after a commit lost its answer, landed,
//! and the processor's last commit, in `shutdown_requested`, failed as "behind the current
//! checkpoint" once the write was settled: a graceful stop left its last stretch for the next
//! owner to do again. Real workers on the in-memory backends under paused time; the lease
//! table and the sink fail apart (two `Faults`).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryPositionSink, MemoryStream, MemoryWrite};
use kcl_core::outputs::Outputs;
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker, WorkerConfig,
};
use tokio::time::sleep;

/// Commits its first batch's outputs at once, with the lease table cut off for the plain
/// write that follows; the rest when it is asked to stop.
struct Once {
    shard: ShardId,
    sink: MemoryPositionSink,
    table: Faults,
    pending: Outputs<MemoryWrite>,
    batches: u32,
    errors: Arc<Mutex<Vec<String>>>,
}

fn key(shard: &ShardId, r: &kcl_core::Record) -> String {
    format!("{shard}/{}", r.position())
}

impl RecordProcessor for Once {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for r in input.records() {
            self.pending
                .push(r, MemoryWrite::add(key(&self.shard, r), 1));
        }
        self.batches += 1;
        if self.batches > 1 {
            return Ok(());
        }
        let outputs = std::mem::take(&mut self.pending);
        self.table.partition("a");
        let committed = cp.commit_outputs(&self.sink, outputs).await;
        self.table.heal("a");
        Ok(committed?)
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        let outputs = std::mem::take(&mut self.pending);
        let committed = cp.commit_outputs(&self.sink, outputs).await;
        if let Err(e) = &committed {
            self.errors.lock().unwrap().push(kcl_core::error_chain(e));
        }
        Ok(committed?)
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_after_a_failed_follow_commits_its_last_stretch() {
    let table = Faults::seeded(909);
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::with_faults(table.clone());
    let sink = MemoryPositionSink::new(Faults::seeded(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (handle, shared) = (sink.client("a"), errors.clone());
    let config = WorkerConfig::default()
        .failover_time(Duration::from_secs(6))
        .idle_time_between_reads(Duration::from_millis(100))
        .initial_position(kcl_core::InitialPosition::TrimHorizon);
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(config)
        .positions(sink.client("a"))
        .build(move |shard: &ShardId| Once {
            shard: shard.clone(),
            sink: handle.clone(),
            table: table.clone(),
            pending: Outputs::new(),
            batches: 0,
            errors: shared.clone(),
        })
        .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    for i in 0..10 {
        stream.put(&format!("k{i}"), format!("first-{i}"));
    }
    sleep(Duration::from_secs(3)).await;
    assert_eq!(sink.applied_commits().len(), 1, "the first batch committed");
    for i in 0..10 {
        stream.put(&format!("k{i}"), format!("then-{i}"));
    }
    sleep(Duration::from_secs(3)).await;
    shutdown.shutdown();
    task.await.unwrap().unwrap();
    let shard = stream.shards()[0].id.clone();
    let outputs = sink.outputs();
    let missing: Vec<String> = stream
        .records(&shard)
        .iter()
        .map(|r| key(&shard, r))
        .filter(|k| !outputs.contains_key(k))
        .collect();
    assert_eq!(
        (missing, errors.lock().unwrap().clone()),
        (Vec::new(), Vec::new()),
        "every record delivered before a graceful stop has its output in the sink"
    );
}
