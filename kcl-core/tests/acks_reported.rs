//! Found by trying the acknowledgement API from its docs alone: records failing through
//! their `Ack`s (or a `Parallel` handler) are reported `failing` as a failing hook is, the
//! `ProcessorHarness` keeps the watermark as a worker does, and a processor that keeps its
//! `Ack`s for a later hook does not hold a graceful stop for half the shutdown timeout.
//! Paused time, in-memory backends.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::ack::Ack;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream, ProcessorHarness};
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, Parallel, ProblemKind,
    ProcessRecordsInput, ProcessorFactory, Record, RecordProcessor, SequenceNumber, ShardId,
    Worker,
};
use tokio::time::{Instant, sleep};

/// Runs `factory` on one shard of 10 records for 60 s; whether it was reported failing.
async fn reported_failing<F: ProcessorFactory>(factory: F) -> bool {
    let stream = MemoryStream::new(1);
    for i in 0..10 {
        stream.put(&format!("k{i}"), "x");
    }
    let worker = Worker::builder(stream, MemoryLeaseStore::new())
        .id("w1")
        .build_with(factory)
        .unwrap();
    let status = worker.status();
    let stop = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    sleep(Duration::from_secs(60)).await; // documented: 8 to 15 s
    let failing = status
        .borrow()
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::Failing);
    stop.shutdown();
    run.await.unwrap().unwrap();
    failing
}

#[tokio::test(start_paused = true)]
async fn a_parallel_handler_failing_every_record_is_reported_failing() {
    let factory =
        Parallel::new(|_: Record| async move { Err::<(), BoxError>("downstream is down".into()) });
    assert!(reported_failing(factory).await);
}

/// Fails the first record of every batch through its `Ack`, finishes the others.
struct FailsFirst;

impl RecordProcessor for FailsFirst {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for (i, (_, ack)) in input.acknowledge_later().into_iter().enumerate() {
            if i == 0 {
                ack.fail("bad record");
            } else {
                ack.done();
            }
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_failing_through_its_ack_every_attempt_is_reported_failing() {
    assert!(reported_failing(|_: &ShardId| FailsFirst).await);
}

/// Keeps its `Ack`s and asks for a checkpoint past them.
struct Holds(Vec<Ack>);

impl RecordProcessor for Holds {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let last = input.records().last().unwrap().position();
        self.0
            .extend(input.acknowledge_later().into_iter().map(|(_, a)| a));
        cp.checkpoint_at(last).await?;
        Ok(())
    }
}

#[tokio::test]
async fn the_harness_refuses_a_checkpoint_past_records_acknowledged_later() {
    let store = MemoryLeaseStore::new();
    let mut h = ProcessorHarness::new(&store, "shardId-000000000000")
        .await
        .unwrap();
    let mut p = Holds(Vec::new());
    h.initialize(&mut p).await.unwrap();
    let record = Record::new(SequenceNumber::from(1u128), "k", "x");
    let refused = h.process(&mut p, vec![record]).await.unwrap_err();
    assert!(
        matches!(
            refused.downcast_ref::<CheckpointError>(),
            Some(CheckpointError::Unfinished { .. })
        ),
        "{refused}"
    );
    assert_eq!(h.checkpoint().await.unwrap(), Checkpoint::TrimHorizon);
}

/// Keeps each batch's `Ack`s until the next hook, `shutdown_requested` included, where it
/// finishes them and checkpoints.
struct NextHook(Vec<Ack>, Arc<Mutex<Vec<Instant>>>);

impl NextHook {
    fn finish_kept(&mut self) {
        for ack in self.0.drain(..) {
            ack.done();
        }
    }
}

impl RecordProcessor for NextHook {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.finish_kept();
        self.0
            .extend(input.acknowledge_later().into_iter().map(|(_, a)| a));
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        self.1.lock().unwrap().push(Instant::now());
        self.finish_kept();
        cp.checkpoint().await?;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn acks_kept_for_the_next_hook_do_not_hold_a_graceful_stop() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    for i in 0..30 {
        stream.put(&format!("k{i}"), format!("{i}"));
    }
    let asked = Arc::new(Mutex::new(Vec::new()));
    let a = asked.clone();
    let worker = Worker::builder(stream.clone(), store.clone())
        .id("w1")
        .build(move |_: &ShardId| NextHook(Vec::new(), a.clone()))
        .unwrap();
    let stop = worker.shutdown_handle();
    let run = tokio::spawn(worker.run());
    sleep(Duration::from_secs(2)).await;
    let began = Instant::now();
    stop.shutdown();
    run.await.unwrap().unwrap();
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the stop took {took:?} (half the shutdown timeout is 15 s)"
    );
    assert_eq!(asked.lock().unwrap().len(), 1, "shutdown_requested once");
    let last = stream
        .records(&ShardId::new("shardId-000000000000"))
        .last()
        .unwrap()
        .position();
    let shard = ShardId::new("shardId-000000000000");
    let lease = store.leases().into_iter().find(|l| l.key == shard).unwrap();
    assert_eq!(lease.checkpoint, Checkpoint::Sequence(last), "every record");
}
