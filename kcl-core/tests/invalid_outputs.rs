//! Outputs the store refuses as invalid (DynamoDB: an item over 400 KB, a malformed number, a
//! `ValidationException`), on the in-memory backends under paused time: the record at fault is
//! found, whether the store names its write or not (a part of several records is then
//! committed again one record at a time), and only that record fails. Under
//! `Parallel::with_outputs` the failure policy gives it up (dead-letter) while every other
//! record's output commits exactly once; a processor whose every output is invalid is an
//! outage, not a stream dead-lettered. Under `commit_outputs` the error names the record, and
//! the records before it committed.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fill_numbered, numbered, outputs_config, wait_until};
use kcl_core::failure::{DeadLetters, FailurePolicy, Reason};
use kcl_core::memory::{
    Condition, MemoryLeaseStore, MemorySink, MemoryStream, MemoryWrite, Refusal,
};
use kcl_core::outputs::Outputs;
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, ExtendedSequenceNumber, Parallel,
    ProcessRecordsInput, Record, RecordProcessor, ShardId, Worker,
};

const SHARD: &str = "shardId-000000000000";
const RECORDS: usize = 30;

fn out(i: usize) -> String {
    format!("out-{i}")
}

fn checkpoint(store: &MemoryLeaseStore) -> Checkpoint {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    lease.map_or(Checkpoint::TrimHorizon, |l| l.checkpoint)
}

/// The count of each output committed, by record.
fn committed(store: &MemoryLeaseStore) -> BTreeMap<usize, i64> {
    let outputs = store.outputs().into_iter();
    outputs
        .map(|(k, item)| (k.trim_start_matches("out-").parse().unwrap(), item.count))
        .collect()
}

/// Every applied commit wrote only outputs of records at or before its checkpoint, each once.
fn assert_in_step(store: &MemoryLeaseStore, positions: &[ExtendedSequenceNumber]) {
    let mut seen = BTreeMap::new();
    for commit in store.applied_commits() {
        let Checkpoint::Sequence(through) = &commit.checkpoint else {
            panic!("a commit checkpointed {}", commit.checkpoint);
        };
        for write in &commit.writes {
            let i: usize = write.key.trim_start_matches("out-").parse().unwrap();
            assert!(
                positions[i] <= *through,
                "record {i} committed before its record"
            );
            assert!(seen.insert(i, ()).is_none(), "record {i} committed twice");
        }
    }
}

/// Why record 7's write cannot commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Refused as invalid, the store naming the write (a cancellation reason).
    Named,
    /// Refused as invalid, the request as a whole (a `ValidationException`).
    Unnamed,
    /// Refused by its own condition.
    Condition,
}

/// `Parallel::with_outputs` under a dead-letter policy, record 7's write refused (`fault`):
/// record 7 is dead-lettered, every other output commits once, and the checkpoint passes
/// everything.
async fn a_record_that_cannot_commit_is_dead_lettered(fault: Fault) {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let positions = fill_numbered(&stream, RECORDS);
    if fault != Fault::Condition {
        store.refuse_as_invalid(out(7), fault == Fault::Named);
    }
    let handler = move |record: Record| async move {
        let write = MemoryWrite::add(out(numbered(&record)), 1);
        match (numbered(&record), fault) {
            (7, Fault::Condition) => Ok::<_, BoxError>(vec![write.when(Condition::Present)]),
            _ => Ok(vec![write]),
        }
    };
    let policy =
        FailurePolicy::dead_letter(3).backoff(Duration::from_millis(200), Duration::from_secs(1));
    let factory = Parallel::with_outputs(Arc::new(store.client("a")), handler)
        .max_in_flight(8)
        .commit_every(5)
        .commit_interval(Duration::from_millis(500))
        .on_failure(policy);
    let sink = MemorySink::new();
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(outputs_config())
        .dead_letters(DeadLetters::new(sink.clone()))
        .build_with(factory)
        .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let last = Checkpoint::Sequence(positions[RECORDS - 1].clone());
    let done = wait_until(Duration::from_secs(60), || checkpoint(&store) == last).await;
    assert!(
        done.is_some(),
        "the checkpoint passes everything ({fault:?}): at {}, committed {:?}, letters {}",
        checkpoint(&store),
        committed(&store).keys().collect::<Vec<_>>(),
        sink.letters().len()
    );
    let letters = sink.letters();
    let dead: Vec<usize> = letters.iter().map(|l| numbered(&l.record)).collect();
    assert_eq!(dead, vec![7], "only the record at fault");
    assert_eq!(letters[0].reason, Reason::Permanent);
    let why = match fault {
        Fault::Condition => "refused by its condition",
        Fault::Named | Fault::Unnamed => "refused by the store as invalid",
    };
    assert!(
        letters[0].last_error.contains(why),
        "{}",
        letters[0].last_error
    );
    let outputs = committed(&store);
    let expected: BTreeMap<usize, i64> = (0..RECORDS).filter(|i| *i != 7).map(|i| (i, 1)).collect();
    assert_eq!(outputs, expected, "every other output once, none of 7");
    assert_in_step(&store, &positions);
    let refusals: Vec<Refusal> = (store.refused_commits().into_iter())
        .map(|r| r.reason)
        .collect();
    // One refusal naming the write (where in its part depends on what was computed then);
    // unnamed, the part refused whole, then record 7 alone.
    let found = match fault {
        Fault::Named => matches!(refusals[..], [Refusal::Invalid { index: Some(_) }]),
        Fault::Unnamed => refusals == vec![Refusal::Invalid { index: None }; 2],
        Fault::Condition => matches!(refusals[..], [Refusal::Write { .. }]),
    };
    assert!(found, "{refusals:?}");
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn parallel_dead_letters_a_record_whose_write_the_store_names_invalid() {
    a_record_that_cannot_commit_is_dead_lettered(Fault::Named).await;
}

#[tokio::test(start_paused = true)]
async fn parallel_finds_and_dead_letters_a_record_in_a_part_refused_whole_as_invalid() {
    a_record_that_cannot_commit_is_dead_lettered(Fault::Unnamed).await;
}

#[tokio::test(start_paused = true)]
async fn parallel_dead_letters_a_record_whose_write_its_condition_refuses() {
    a_record_that_cannot_commit_is_dead_lettered(Fault::Condition).await;
}

/// Every record's output invalid (a bad deploy): a record counts as succeeded only once its
/// outputs committed, so the failure policy gives up `outage_after` records in a row and then
/// takes it as an outage, instead of dead-lettering the stream.
#[tokio::test(start_paused = true)]
async fn parallel_outputs_all_invalid_are_an_outage_not_a_stream_dead_lettered() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let positions = fill_numbered(&stream, RECORDS);
    for i in 0..RECORDS {
        store.refuse_as_invalid(out(i), true);
    }
    let handler = |record: Record| async move {
        Ok::<_, BoxError>(vec![MemoryWrite::add(out(numbered(&record)), 1)])
    };
    let policy = FailurePolicy::dead_letter(1).outage_after(Some(3));
    let factory = Parallel::with_outputs(Arc::new(store.client("a")), handler)
        .commit_every(1)
        .commit_interval(Duration::from_millis(100))
        .on_failure(policy);
    let sink = MemorySink::new();
    let worker = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(outputs_config())
        .dead_letters(DeadLetters::new(sink.clone()))
        .build_with(factory)
        .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    // Within the outage's probe interval (60 s): no record given up past the three.
    tokio::time::sleep(Duration::from_secs(50)).await;
    let letters: Vec<usize> = sink.letters().iter().map(|l| numbered(&l.record)).collect();
    assert_eq!(letters, [0, 1, 2], "three given up, then an outage");
    assert!(store.outputs().is_empty());
    let at = checkpoint(&store);
    assert!(
        match &at {
            Checkpoint::Sequence(at) => *at <= positions[2],
            other => *other == Checkpoint::TrimHorizon,
        },
        "{at}"
    );
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

/// What the batch processor saw: each `commit_outputs`'s error.
type Errors = Arc<Mutex<Vec<CheckpointError>>>;

/// Pushes one write per record and commits once `at` records were delivered.
struct Batch {
    store: MemoryLeaseStore,
    at: usize,
    outputs: Outputs<MemoryWrite>,
    delivered: usize,
    errors: Errors,
}

impl RecordProcessor for Batch {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
            self.outputs
                .push(record, MemoryWrite::add(out(numbered(record)), 1));
            self.delivered += 1;
        }
        if self.delivered == self.at {
            let outputs = std::mem::take(&mut self.outputs);
            if let Err(error) = checkpointer.commit_outputs(&self.store, outputs).await {
                self.errors.lock().unwrap().push(error);
            }
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &mut Checkpointer) -> Result<(), BoxError> {
        Ok(())
    }
}

/// `commit_outputs` of records 0-5 in one part, record 3's write refused as invalid.
async fn batch_commit_with_record_3_invalid(
    named: bool,
) -> (
    MemoryLeaseStore,
    Vec<ExtendedSequenceNumber>,
    CheckpointError,
) {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let positions = fill_numbered(&stream, 6);
    store.refuse_as_invalid(out(3), named);
    let errors = Errors::default();
    let factory = {
        let (store, errors) = (store.client("a"), errors.clone());
        move |_: &ShardId| Batch {
            store: store.clone(),
            at: 6,
            outputs: Outputs::new(),
            delivered: 0,
            errors: errors.clone(),
        }
    };
    let worker = Worker::new(
        "a",
        outputs_config(),
        stream.client("a"),
        store.client("a"),
        factory,
    )
    .unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let failed = wait_until(Duration::from_secs(30), || {
        !errors.lock().unwrap().is_empty()
    })
    .await;
    assert!(failed.is_some(), "the commit failed");
    shutdown.shutdown();
    task.await.unwrap().unwrap();
    let error = errors.lock().unwrap().remove(0);
    (store, positions, error)
}

#[tokio::test(start_paused = true)]
async fn commit_outputs_names_the_invalid_record_and_commits_those_before_it() {
    let (store, positions, error) = batch_commit_with_record_3_invalid(false).await;
    let CheckpointError::OutputInvalid { record, reason, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*record, positions[3], "{error}");
    assert!(reason.contains("ValidationException"), "{reason}");
    let expected: BTreeMap<usize, i64> = (0..3).map(|i| (i, 1)).collect();
    assert_eq!(
        committed(&store),
        expected,
        "the records before it, each alone"
    );
    assert_eq!(store.applied_commits().len(), 3);
    assert_eq!(
        checkpoint(&store),
        Checkpoint::Sequence(positions[2].clone())
    );
    assert_in_step(&store, &positions);
}

#[tokio::test(start_paused = true)]
async fn commit_outputs_names_the_write_the_store_names_and_applies_nothing_of_its_part() {
    let (store, positions, error) = batch_commit_with_record_3_invalid(true).await;
    let CheckpointError::OutputInvalid { record, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*record, positions[3], "{error}");
    assert!(store.outputs().is_empty());
    assert_eq!(checkpoint(&store), Checkpoint::TrimHorizon);
}
