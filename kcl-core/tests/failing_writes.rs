//! A shard whose checkpoint writes keep failing is `failing` (and so fails readiness), even
//! when its processor goes on after each failure and every batch is processed without an
//! error; a processor that checkpoints only every few minutes is not. In-memory backends,
//! paused time, a producer writing all along.
//!
//! The bound (`shard_consumer::progress`): five failed writes in a row, none applied, the
//! first of them 10 s ago or more, seen at the coordinator's next look (`taker_interval`,
//! 0.5 s here). A processor committing every batch (about every 0.2 s) is reported 10 to
//! 11 s after its first failed commit.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Running, config, wait_until};
use kcl_core::memory::{Condition, MemoryLeaseStore, MemoryStream, MemoryWrite};
use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Outputs, Transact};
use kcl_core::{
    BackendError, BoxError, Checkpoint, Checkpointer, ErrorKind, LeaseStore, ProcessRecordsInput,
    RecordProcessor, ShardId, Worker, WorkerConfig,
};
use tokio::time::Instant;

/// How a [`Committer`] processor commits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    /// Every batch; each record's write is conditioned on an item that does not exist, so
    /// every commit is refused (`OutputRefused`); the processor logs it and goes on.
    Refused,
    /// Every batch; the store denies every commit (a fatal store error, as DynamoDB's
    /// `AccessDenied`); the processor goes on.
    Denied,
    /// As `Refused`, and every other batch also returns the error, so that the shard
    /// restarts between batches processed without an error.
    RefusedThenFails,
    /// Only once 3 minutes passed since its last commit; every commit applies.
    Rarely,
}

/// What every processor of a test saw.
#[derive(Default)]
struct Log {
    /// When the first commit failed.
    first_failure: Option<Instant>,
    failures: u32,
    applied: u32,
    /// Batches processed.
    batches: u32,
}

/// The in-memory store, denying every commit while `deny` is set.
#[derive(Clone)]
struct Gate {
    store: MemoryLeaseStore,
    deny: Arc<AtomicBool>,
}

impl Transact for Gate {
    type Write = MemoryWrite;

    fn limits(&self) -> Limits {
        self.store.limits()
    }

    fn measure(&self, write: &MemoryWrite) -> Measure {
        self.store.measure(write)
    }

    async fn commit(&self, commit: Commit<'_, MemoryWrite>) -> Result<(), CommitError> {
        if self.deny.load(Ordering::SeqCst) {
            let denied = "AccessDeniedException: not authorized to perform TransactWriteItems";
            return Err(CommitError::Store(BackendError::new(
                ErrorKind::Fatal,
                "transact",
                denied,
            )));
        }
        self.store.commit(commit).await
    }
}

struct Committer {
    style: Style,
    store: Gate,
    /// Once set, every commit is one that applies.
    healed: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    last_commit: Instant,
    batches: u32,
}

impl Committer {
    fn due(&self) -> bool {
        self.style != Style::Rarely || self.last_commit.elapsed() >= Duration::from_secs(180)
    }
}

impl RecordProcessor for Committer {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.batches += 1;
        self.log.lock().unwrap().batches += 1;
        if !self.due() {
            return Ok(());
        }
        let refused = !self.healed.load(Ordering::SeqCst)
            && matches!(self.style, Style::Refused | Style::RefusedThenFails);
        let mut outputs = Outputs::new();
        for record in input.records() {
            let write = MemoryWrite::add(format!("out/{}", record.position()), 1);
            let write = if refused {
                write.when(Condition::Present)
            } else {
                write
            };
            outputs.push(record, write);
        }
        let committed = cp.commit_outputs(&self.store, outputs).await;
        self.last_commit = Instant::now();
        let mut log = self.log.lock().unwrap();
        let Err(error) = committed else {
            log.applied += 1;
            return Ok(());
        };
        log.failures += 1;
        log.first_failure.get_or_insert_with(Instant::now);
        if self.style == Style::RefusedThenFails && self.batches.is_multiple_of(2) {
            return Err(error.into());
        }
        // Logged and ignored: the batch counts as processed.
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        Ok(cp.checkpoint().await?)
    }
}

struct Run {
    worker: Running,
    store: MemoryLeaseStore,
    shard: ShardId,
    healed: Arc<AtomicBool>,
    deny: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
}

/// A one-shard stream written to every 100 ms, and a worker whose processors commit
/// `style`'s way.
fn run(style: Style, config: WorkerConfig) -> Run {
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
    let deny = Arc::new(AtomicBool::new(style == Style::Denied));
    let log = Arc::new(Mutex::new(Log::default()));
    let gate = Gate {
        store: store.client("w"),
        deny: deny.clone(),
    };
    let (flag, shared) = (healed.clone(), log.clone());
    let factory = move |_: &ShardId| Committer {
        style,
        store: gate.clone(),
        healed: flag.clone(),
        log: shared.clone(),
        last_commit: Instant::now(),
        batches: 0,
    };
    let worker = Worker::new("w", config, stream.client("w"), store.client("w"), factory)
        .expect("a valid config");
    let worker = Running {
        shutdown: worker.shutdown_handle(),
        status: worker.status(),
        task: tokio::spawn(worker.run()),
    };
    Run {
        worker,
        store,
        shard,
        healed,
        deny,
        log,
    }
}

/// The problems of kind `kind` (as `/status` names it) in `w`'s status: key and detail.
fn reported(w: &Running, kind: &str) -> Vec<(String, String)> {
    let status = w.status.borrow();
    let found = status.problems.iter().filter(|p| p.kind.as_str() == kind);
    found.map(|p| (p.key.clone(), p.detail.clone())).collect()
}

/// `failing` is what fails `/readyz` (kcl-serve's `not_ready`): the shard named failing.
fn failing(w: &Running) -> bool {
    !reported(w, "failing").is_empty()
}

async fn stop(w: Running) {
    w.shutdown.shutdown();
    w.task.await.unwrap().unwrap();
}

/// Waits for the first failed commit; then the shard is not failing for 10 s, and is
/// within 1 s more, with `kind` and the shard in the detail, while the checkpoint never
/// moved and every batch but (under `RefusedThenFails`) every other was processed without
/// an error. Once healed, the problem is gone.
async fn failing_within_the_bound(style: Style, kind: &str) {
    let r = run(style, config());
    let first = wait_until(Duration::from_secs(30), || {
        r.log.lock().unwrap().first_failure.is_some()
    })
    .await;
    assert!(first.is_some(), "no commit failed");
    let since = r.log.lock().unwrap().first_failure.unwrap();
    let quiet = wait_until(Duration::from_millis(9_900) - since.elapsed(), || {
        failing(&r.worker)
    })
    .await;
    assert!(
        quiet.is_none(),
        "failing {:?} after the first failed commit: {:?}",
        since.elapsed(),
        r.worker.status.borrow()
    );
    let found = wait_until(Duration::from_secs(2), || failing(&r.worker)).await;
    let after = since.elapsed();
    assert!(found.is_some(), "{:?}", r.worker.status.borrow());
    assert!(after <= Duration::from_secs(11), "reported {after:?} after");
    let problems = reported(&r.worker, "failing");
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (key, detail) = &problems[0];
    assert_eq!(key, &r.shard.to_string());
    assert!(
        detail.contains("checkpoint writes keep failing"),
        "{detail}"
    );
    assert!(detail.contains(kind), "{detail}");
    assert!(detail.contains(r.shard.as_str()), "{detail}");
    assert_eq!(
        r.worker.status.borrow().held.len(),
        1,
        "the shard stays held"
    );
    let row = r.store.get(&r.shard).await.unwrap().unwrap();
    assert!(
        matches!(row.checkpoint, Checkpoint::TrimHorizon),
        "the checkpoint never moved: {:?}",
        row.checkpoint
    );
    {
        let log = r.log.lock().unwrap();
        assert!(log.failures >= 5 && log.applied == 0, "{:?}", log.failures);
        assert!(log.batches >= log.failures);
    }
    r.healed.store(true, Ordering::SeqCst);
    r.deny.store(false, Ordering::SeqCst);
    let gone = wait_until(Duration::from_secs(20), || !failing(&r.worker)).await;
    assert!(gone.is_some(), "{:?}", r.worker.status.borrow());
    assert!(r.log.lock().unwrap().applied > 0);
    stop(r.worker).await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_whose_every_commit_is_refused_and_goes_on_is_failing_within_the_bound() {
    failing_within_the_bound(Style::Refused, "output_refused").await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_whose_every_commit_the_store_denies_is_failing_within_the_bound() {
    failing_within_the_bound(Style::Denied, "store_error (fatal)").await;
}

/// Every other batch fails, and the batches between are processed without an error: the
/// attempts' own count starts again at each, but the writes' does not.
#[tokio::test(start_paused = true)]
async fn a_processor_refused_every_commit_that_fails_every_other_batch_is_failing_too() {
    failing_within_the_bound(Style::RefusedThenFails, "output_refused").await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_that_commits_only_every_few_minutes_is_not_failing() {
    let r = run(Style::Rarely, config());
    let problem = wait_until(Duration::from_secs(12 * 60), || {
        !r.worker.status.borrow().problems.is_empty()
    })
    .await;
    assert!(
        problem.is_none(),
        "after {problem:?}: {:?}",
        r.worker.status.borrow()
    );
    {
        let log = r.log.lock().unwrap();
        // At 3, 6, 9 and 12 minutes (the last may come just after the wait).
        assert!((3..=4).contains(&log.applied), "{}", log.applied);
        assert_eq!(log.failures, 0);
    }
    stop(r.worker).await;
}

/// Under `Parallel::with_outputs` the committer commits for the handler, which never sees
/// an error: a store that denies every commit makes the shard failing all the same, within
/// the bound, and the problem goes once commits apply again.
#[tokio::test(start_paused = true)]
async fn parallel_outputs_whose_every_commit_the_store_denies_are_failing() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let producer = stream.clone();
    tokio::spawn(async move {
        for i in 0_u64.. {
            producer.put(&format!("key-{}", i % 7), format!("record-{i}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let deny = Arc::new(AtomicBool::new(true));
    let gate = Arc::new(Gate {
        store: store.client("w"),
        deny: deny.clone(),
    });
    let factory = kcl_core::Parallel::with_outputs(gate, |record: kcl_core::Record| async move {
        let key = format!("out-{}", record.sequence_number);
        Ok::<_, BoxError>(vec![MemoryWrite::add(key, 1)])
    })
    .commit_every(5)
    .commit_interval(Duration::from_millis(500));
    let worker = Worker::new(
        "w",
        config(),
        stream.client("w"),
        store.client("w"),
        factory,
    )
    .expect("a valid config");
    let w = Running {
        shutdown: worker.shutdown_handle(),
        status: worker.status(),
        task: tokio::spawn(worker.run()),
    };
    let started = Instant::now();
    let found = wait_until(Duration::from_secs(60), || failing(&w)).await;
    assert!(found.is_some(), "{:?}", w.status.borrow());
    let problems = reported(&w, "failing");
    assert!(
        problems[0].1.contains("checkpoint writes keep failing"),
        "{problems:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    deny.store(false, Ordering::SeqCst);
    let gone = wait_until(Duration::from_secs(20), || !failing(&w)).await;
    assert!(gone.is_some(), "{:?}", w.status.borrow());
    assert!(
        !store.outputs().is_empty(),
        "outputs committed once allowed"
    );
    stop(w).await;
}
