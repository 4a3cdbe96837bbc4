//! Poison records among good ones, one in ten, under `Parallel` with and without outputs
//! and the default failure policy but for its sink (`outage_after` 10): a lone poison record
//! among good ones is dead-lettered once, never an outage, and the checkpoint passes
//! everything. Under `with_outputs` a record that succeeded counted only once its outputs
//! committed (every 5 s), so ten give-ups piled up before the first commit, the shard took it
//! for an outage and never committed again (found by a review of issue 51).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{fill_numbered, numbered, outputs_config, wait_until};
use kcl_core::failure::{DeadLetters, FailurePolicy, Permanent};
use kcl_core::memory::{MemoryLeaseStore, MemorySink, MemoryStream, MemoryWrite};
use kcl_core::{BoxError, Checkpoint, Parallel, Record, Worker};

const SHARD: &str = "shardId-000000000000";
const RECORDS: usize = 200;

fn poison(i: usize) -> bool {
    i % 10 == 1
}

fn checkpoint(store: &MemoryLeaseStore) -> Checkpoint {
    let lease = store.leases().into_iter().find(|l| l.key.as_str() == SHARD);
    lease.map_or(Checkpoint::TrimHorizon, |l| l.checkpoint)
}

async fn run(outputs: bool) {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let positions = fill_numbered(&stream, RECORDS);
    // Defaults but for the sink: attempts 3, backoff 1 s, outage_after 10.
    let policy = FailurePolicy::dead_letter(3);
    let sink = MemorySink::new();
    let builder = Worker::builder(stream.client("a"), store.client("a"))
        .id("a")
        .config(outputs_config())
        .dead_letters(DeadLetters::new(sink.clone()));
    let (shutdown, task) = if outputs {
        let handler = |record: Record| async move {
            let i = numbered(&record);
            if poison(i) {
                return Err::<Vec<MemoryWrite>, BoxError>(Permanent::new("malformed").into());
            }
            Ok(vec![MemoryWrite::add(format!("out-{i}"), 1)])
        };
        let factory = Parallel::with_outputs(Arc::new(store.client("a")), handler)
            .max_in_flight(8)
            .on_failure(policy);
        let w = builder.build_with(factory).unwrap();
        (w.shutdown_handle(), tokio::spawn(w.run()))
    } else {
        let handler = |record: Record| async move {
            if poison(numbered(&record)) {
                return Err::<(), BoxError>(Permanent::new("malformed").into());
            }
            Ok(())
        };
        let factory = Parallel::new(handler).max_in_flight(8).on_failure(policy);
        let w = builder.build_with(factory).unwrap();
        (w.shutdown_handle(), tokio::spawn(w.run()))
    };
    let last = Checkpoint::Sequence(positions[RECORDS - 1].clone());
    let done = wait_until(Duration::from_secs(300), || checkpoint(&store) == last).await;
    let mut letters: BTreeMap<usize, usize> = BTreeMap::new();
    for l in sink.letters() {
        *letters.entry(numbered(&l.record)).or_default() += 1;
    }
    let outs: BTreeMap<String, i64> = (store.outputs().into_iter())
        .map(|(k, v)| (k, v.count))
        .collect();
    shutdown.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(60), task).await;
    assert!(
        done.is_some(),
        "outputs={outputs}: the checkpoint passes every record within 300 s"
    );
    assert!(
        letters.values().all(|n| *n == 1),
        "each poison record dead-lettered once: {letters:?}"
    );
    assert_eq!(letters.len(), RECORDS / 10, "{letters:?}");
    if outputs {
        assert_eq!(
            outs.len(),
            RECORDS - RECORDS / 10,
            "every good record's output"
        );
        assert!(outs.values().all(|n| *n == 1), "each once");
    }
}

#[tokio::test(start_paused = true)]
async fn interleaved_poison_without_outputs() {
    run(false).await;
}

#[tokio::test(start_paused = true)]
async fn interleaved_poison_with_outputs() {
    run(true).await;
}
