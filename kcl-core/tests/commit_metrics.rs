//! Transactional checkpoints are counted by outcome (`kcl_output_commits_total{outcome}`,
//! attempts retried under `retried`) and timed (`kcl_output_commit_duration_seconds`), and
//! every metric kcl-core declares is documented in docs/metrics.md. In-memory backends,
//! paused time; the recorder is this test binary's global one.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config, wait_until};
use kcl_core::memory::{Condition, MemoryLeaseStore, MemoryStream, MemoryWrite};
use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Outputs, Transact};
use kcl_core::{
    BackendError, BoxError, Checkpointer, ErrorKind, LeaseStore, ProcessRecordsInput,
    RecordProcessor, ShardId, Worker,
};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::time::sleep;

/// Counter totals and histogram sample counts, by series (`name{label=value,…}`).
type Values = Arc<Mutex<BTreeMap<String, u64>>>;

struct Series(String, Values);

impl Series {
    fn add(&self, n: u64) {
        *self.1.lock().unwrap().entry(self.0.clone()).or_default() += n;
    }
}

impl CounterFn for Series {
    fn increment(&self, n: u64) {
        self.add(n);
    }
    fn absolute(&self, _: u64) {}
}

impl HistogramFn for Series {
    fn record(&self, _: f64) {
        self.add(1);
    }
}

struct Totals(Values);

impl Totals {
    fn series(&self, key: &Key) -> Arc<Series> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::new(Series(name, self.0.clone()))
    }
}

impl Recorder for Totals {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.series(key))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.series(key))
    }
}

/// What a processor does with a batch's outputs.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Commits them.
    Commit,
    /// Commits them with a write whose own condition fails.
    Refused,
    /// Commits them while the store denies every commit (a fatal error).
    Denied,
    /// Commits them just after another worker took the lease.
    Stolen,
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
            let denied = BackendError::new(ErrorKind::Fatal, "transact", "AccessDenied");
            return Err(CommitError::Store(denied));
        }
        self.store.commit(commit).await
    }
}

/// Takes its steps from a shared script, one per batch; commits after the script too.
struct Scripted {
    store: Gate,
    script: Arc<Mutex<VecDeque<Step>>>,
}

impl RecordProcessor for Scripted {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Commit);
        if let Step::Stolen = step {
            let shard = cp.shard_id().clone();
            let row = self.store.store.get(&shard).await?.expect("the lease row");
            let intruder = self.store.store.client("intruder");
            intruder.take(&row, &"intruder".into()).await?;
        }
        self.store
            .deny
            .store(matches!(step, Step::Denied), Ordering::SeqCst);
        let mut outputs = Outputs::new();
        for record in input.records() {
            let write = MemoryWrite::add(format!("out/{}", record.position()), 1);
            let write = match step {
                Step::Refused => write.when(Condition::Present),
                Step::Commit | Step::Denied | Step::Stolen => write,
            };
            outputs.push(record, write);
        }
        // Errors are counted by the metrics under test; the processor goes on.
        let _ = cp.commit_outputs(&self.store, outputs).await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn commits_are_counted_by_outcome_and_timed() {
    let values = Values::default();
    metrics::set_global_recorder(Totals(values.clone())).unwrap();
    let total = |series: &str| values.lock().unwrap().get(series).copied().unwrap_or(0);
    let outcome = |o: &str| total(&format!("kcl_output_commits_total{{outcome={o}}}"));

    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    // Two conflicts: the first commit is retried twice, then applies.
    store.inject_conflicts(2);
    let script = Arc::new(Mutex::new(VecDeque::from([
        Step::Commit,
        Step::Refused,
        Step::Denied,
        Step::Commit,
        Step::Stolen,
    ])));
    let gate = Gate {
        store: store.client("w"),
        deny: Arc::default(),
    };
    let shared = script.clone();
    let factory = move |_: &ShardId| Scripted {
        store: gate.clone(),
        script: shared.clone(),
    };
    let worker = Worker::new(
        "w",
        config(),
        stream.client("w"),
        store.client("w"),
        factory,
    )
    .expect("a valid config");
    let status = worker.status();
    let task = tokio::spawn(worker.run());
    let producer = stream.clone();
    tokio::spawn(async move {
        for i in 0_u64.. {
            producer.put(&format!("key-{i}"), format!("record-{i}"));
            sleep(Duration::from_millis(100)).await;
        }
    });
    let scripted = wait_until(Duration::from_secs(30), || {
        script.lock().unwrap().is_empty() && outcome("lease_lost") >= 1
    })
    .await;
    assert!(scripted.is_some(), "{:?}", values.lock().unwrap());
    assert_eq!(outcome("committed"), 2, "{:?}", values.lock().unwrap());
    assert_eq!(outcome("retried"), 2);
    assert_eq!(outcome("refused"), 1);
    assert_eq!(outcome("failed"), 1);
    assert_eq!(outcome("lease_lost"), 1);
    // The tenure ends: nothing commits any more.
    assert!(
        wait_until(Duration::from_secs(10), || status.borrow().held.is_empty())
            .await
            .is_some()
    );

    // Every outcome but `retried` counts one commit, and each commit is timed once.
    let commits: u64 = ["committed", "refused", "lease_lost", "behind", "failed"]
        .iter()
        .map(|o| outcome(o))
        .sum();
    assert_eq!(
        total("kcl_output_commit_duration_seconds{}"),
        commits,
        "{:?}",
        values.lock().unwrap()
    );
    // Registered at zero for every outcome, so that rate() has a series from the start.
    assert!(
        values
            .lock()
            .unwrap()
            .contains_key("kcl_output_commits_total{outcome=behind}")
    );
    task.abort();
}

/// docs/metrics.md names every metric kcl-core declares.
#[test]
fn every_metric_is_documented() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let missing: Vec<&str> = kcl_core::metrics::ALL
        .iter()
        .map(|(name, ..)| *name)
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
}
