//! What a shard's progress is, as the problem reports judge it: a checkpoint that keeps moving
//! is never `stalled` (even if it never covers everything delivered), a shard whose every
//! attempt fails is `failing` (in `process_records` or in `initialize`) until it makes
//! progress again, a processor that fails now and then is neither, and `stalled_after` can be
//! turned off. In-memory backends, paused time, a producer writing all along.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Running, config, wait_until};
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ExtendedSequenceNumber, InitializationInput, ProcessRecordsInput,
    RecordProcessor, ShardId, Worker, WorkerConfig,
};

/// How a [`Scripted`] processor behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Checkpoints at the previous batch's last record: the checkpoint moves with every batch
    /// and never covers everything delivered (a window left open).
    Trailing,
    /// Checkpoints only when asked to stop.
    AtShutdown,
    /// Every `process_records` fails.
    FailBatches,
    /// Every `initialize` fails.
    FailInitialize,
    /// Every third batch fails; the others are checkpointed.
    FailSometimes,
    /// Each instance's first batch succeeds and its next fails; never checkpoints.
    FailAfterFirst,
}

struct Scripted {
    style: Style,
    /// Once set, nothing fails any more and every batch is checkpointed.
    healed: Arc<AtomicBool>,
    previous: Option<ExtendedSequenceNumber>,
    batches: u32,
}

impl Scripted {
    fn failing(&self, style: Style) -> bool {
        self.style == style && !self.healed.load(Ordering::SeqCst)
    }
}

impl RecordProcessor for Scripted {
    async fn initialize(&mut self, _: &InitializationInput) -> Result<(), BoxError> {
        if self.failing(Style::FailInitialize) {
            return Err("cannot reach the database".into());
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        _: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.batches += 1;
        let last = cp.last_delivered().cloned();
        if self.healed.load(Ordering::SeqCst) {
            return Ok(cp.checkpoint().await?);
        }
        match self.style {
            Style::Trailing => {
                if let Some(previous) = self.previous.take() {
                    cp.checkpoint_at(previous).await?;
                }
                self.previous = last;
            }
            Style::FailBatches => return Err("downstream unavailable".into()),
            Style::FailSometimes if self.batches.is_multiple_of(3) => {
                return Err("downstream hiccup".into());
            }
            Style::FailSometimes => cp.checkpoint().await?,
            Style::FailAfterFirst if self.batches > 1 => return Err("poison record".into()),
            Style::AtShutdown | Style::FailInitialize | Style::FailAfterFirst => {}
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        Ok(cp.checkpoint().await?)
    }
}

/// A one-shard stream written to every 100 ms, and a worker processing it `style`'s way;
/// the flag heals the processor.
fn run(style: Style, config: WorkerConfig) -> (Running, Arc<AtomicBool>, ShardId) {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let shard = stream.open_shards().remove(0);
    let producer = stream.clone();
    tokio::spawn(async move {
        for i in 0_u64.. {
            producer.put(&format!("key-{}", i % 7), format!("record-{i}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let healed = Arc::new(AtomicBool::new(false));
    let flag = healed.clone();
    let factory = move |_: &ShardId| Scripted {
        style,
        healed: flag.clone(),
        previous: None,
        batches: 0,
    };
    let worker = Worker::new("w", config, stream.client("w"), store.client("w"), factory)
        .expect("a valid config");
    let running = Running {
        shutdown: worker.shutdown_handle(),
        status: worker.status(),
        task: tokio::spawn(worker.run()),
    };
    (running, healed, shard)
}

/// The keys of the problems of kind `kind` (as `/status` names it) in `w`'s status.
fn reported(w: &Running, kind: &str) -> Vec<String> {
    let status = w.status.borrow();
    let found = status.problems.iter().filter(|p| p.kind.as_str() == kind);
    found.map(|p| p.key.clone()).collect()
}

/// Fails if `w` reports any problem within `within`.
async fn never_reported(w: &Running, within: Duration) {
    let problem = wait_until(within, || !w.status.borrow().problems.is_empty()).await;
    assert!(
        problem.is_none(),
        "after {problem:?}: {:?}",
        w.status.borrow()
    );
}

async fn stop(w: Running) {
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_that_keeps_moving_is_never_reported_stalled() {
    let stalled_after = Duration::from_secs(20);
    let (w, _, _) = run(Style::Trailing, config().stalled_after(stalled_after));
    never_reported(&w, stalled_after * 6).await;
    stop(w).await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_whose_every_batch_fails_is_reported_failing_until_it_recovers() {
    every_attempt_fails(Style::FailBatches, "downstream unavailable").await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_whose_initialize_always_fails_is_reported_failing_until_it_recovers() {
    every_attempt_fails(Style::FailInitialize, "cannot reach the database").await;
}

/// `failing` within 30 s (5 attempts in a row, with the default backoff), with the last error;
/// gone once an attempt makes progress.
async fn every_attempt_fails(style: Style, error: &str) {
    let (w, healed, shard) = run(style, config());
    let found = wait_until(Duration::from_secs(30), || {
        reported(&w, "failing") == [shard.to_string()]
    })
    .await;
    let status = w.status.borrow().clone();
    assert!(found.is_some(), "{status:?}");
    let problem = status
        .problems
        .iter()
        .find(|p| p.kind.as_str() == "failing");
    assert!(
        problem.is_some_and(|p| p.detail.contains(error)),
        "{status:?}"
    );
    assert_eq!(status.held.len(), 1, "the shard stays held");
    healed.store(true, Ordering::SeqCst);
    let gone = wait_until(Duration::from_secs(40), || {
        reported(&w, "failing").is_empty()
    })
    .await;
    assert!(gone.is_some(), "{:?}", w.status.borrow());
    stop(w).await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_that_fails_now_and_then_is_neither_failing_nor_stalled() {
    let stalled_after = Duration::from_secs(30);
    let (w, _, _) = run(Style::FailSometimes, config().stalled_after(stalled_after));
    never_reported(&w, Duration::from_secs(180)).await;
    stop(w).await;
}

/// Every attempt processes one batch and fails on the next, never checkpointing: no attempt
/// fails outright, but the checkpoint never moves while records wait. The stall's age runs
/// on across the restarts.
#[tokio::test(start_paused = true)]
async fn a_shard_that_restarts_without_checkpointing_is_reported_stalled() {
    let stalled_after = Duration::from_secs(30);
    let (w, _, shard) = run(Style::FailAfterFirst, config().stalled_after(stalled_after));
    let found = wait_until(stalled_after * 2, || {
        reported(&w, "stalled") == [shard.to_string()]
    })
    .await;
    assert!(found.is_some(), "{:?}", w.status.borrow());
    stop(w).await;
}

#[tokio::test(start_paused = true)]
async fn stalled_after_off_reports_no_processor_that_checkpoints_only_at_shutdown() {
    let off: WorkerConfig = serde_json::from_str(r#"{"stalled_after": "off"}"#).unwrap();
    let written = serde_json::to_value(&off).unwrap();
    assert_eq!(written["stalled_after"], "off", "written as read");
    let test = config();
    let off = off
        .failover_time(test.failover_time)
        .taker_interval(test.taker_interval)
        .idle_time_between_reads(test.idle_time_between_reads);
    let (w, _, _) = run(Style::AtShutdown, off);
    // Four times the default stalled_after.
    never_reported(&w, Duration::from_secs(2400)).await;
    stop(w).await;
}

#[tokio::test(start_paused = true)]
async fn stalled_after_still_reports_a_processor_that_checkpoints_only_at_shutdown() {
    let stalled_after = Duration::from_secs(30);
    let (w, _, shard) = run(Style::AtShutdown, config().stalled_after(stalled_after));
    let found = wait_until(stalled_after * 2, || {
        reported(&w, "stalled") == [shard.to_string()]
    })
    .await;
    assert!(found.is_some(), "{:?}", w.status.borrow());
    stop(w).await;
}
