//! Exactly-once outputs into a sink that keeps each shard's position itself
//! (`kcl_core::outputs::Positions`, here the in-memory model of a Postgres database while the
//! leases live elsewhere), through real `Worker`s on the in-memory backends under paused
//! time: every record's output is committed once across a kill, a frozen zombie, a lease
//! moved back behind the sink by an operator, a lease row made again with its counters
//! started over, and lost answers; misuse is refused before anything is written.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{
    Faults, MemoryLeaseStore, MemoryPositionSink, MemoryStream, MemoryWrite, PositionRow,
};
use kcl_core::outputs::Outputs;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, ExtendedSequenceNumber, FencingToken,
    LeaseStore, Parallel, ProcessRecordsInput, Record, RecordProcessor, ShardId, ShutdownHandle,
    Worker, WorkerConfig, WorkerId,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const FAILOVER: Duration = Duration::from_secs(6);

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(FAILOVER)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(100))
        .max_records(10)
}

fn key(shard: &ShardId, position: &ExtendedSequenceNumber) -> String {
    format!("{shard}/{position}")
}

/// Every record handed to a processor, by (shard, position): how many times.
type Handed = Arc<Mutex<BTreeMap<String, usize>>>;

/// Commits each batch's outputs (`ADD 1` to the record's own item) into the sink.
struct Exact {
    shard: ShardId,
    sink: MemoryPositionSink,
    handed: Handed,
    errors: Arc<Mutex<Vec<String>>>,
}

impl RecordProcessor for Exact {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let mut outputs = Outputs::new();
        for r in input.records() {
            let k = key(&self.shard, &r.position());
            *self.handed.lock().unwrap().entry(k.clone()).or_default() += 1;
            outputs.push(r, MemoryWrite::add(k, 1));
        }
        cp.commit_outputs(&self.sink, outputs).await.map_err(|e| {
            self.errors.lock().unwrap().push(format!("{e:?}"));
            e.into()
        })
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        Ok(cp.commit_outputs(&self.sink, Outputs::new()).await?)
    }
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

struct World {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    sink: MemoryPositionSink,
    faults: Faults,
    handed: Handed,
    errors: Arc<Mutex<Vec<String>>>,
}

impl World {
    fn new(shards: u32) -> Self {
        #[cfg(feature = "mutation-testing")]
        if let Ok(name) = std::env::var("KCL_MUTATION") {
            let all = kcl_core::mutation::Mutation::ALL.iter();
            kcl_core::mutation::set(all.copied().find(|m| format!("{m:?}") == name));
        }
        let faults = Faults::seeded(52);
        Self {
            stream: MemoryStream::new(shards),
            store: MemoryLeaseStore::with_faults(faults.clone()),
            sink: MemoryPositionSink::new(faults.clone()),
            faults,
            handed: Handed::default(),
            errors: Arc::default(),
        }
    }

    /// Worker `id` as a process of its own, given the sink (`positions`) or not.
    fn start(&self, id: &str, positions: bool) -> Running {
        let sink = self.sink.client(id);
        let (handed, errors) = (self.handed.clone(), self.errors.clone());
        let mut builder = Worker::builder(self.stream.client(id), self.store.client(id))
            .id(id)
            .config(config());
        if positions {
            builder = builder.positions(sink.clone());
        }
        let w = builder
            .build(move |shard: &ShardId| Exact {
                shard: shard.clone(),
                sink: sink.clone(),
                handed: handed.clone(),
                errors: errors.clone(),
            })
            .unwrap();
        Running {
            shutdown: w.shutdown_handle(),
            task: tokio::spawn(self.faults.run_as(id, w.run())),
        }
    }

    fn fill(&self, n: usize) {
        for i in 0..n {
            self.stream
                .put(&format!("key-{}", i % 29), format!("record-{i}"));
        }
    }

    fn records(&self) -> Vec<(ShardId, Record)> {
        let shards = self.stream.shards();
        shards
            .iter()
            .flat_map(|s| {
                self.stream
                    .records(&s.id)
                    .into_iter()
                    .map(|r| (s.id.clone(), r))
            })
            .collect()
    }

    /// Records whose output is missing, and those counted other than once.
    fn off(&self) -> (usize, Vec<(String, i64)>) {
        let outputs = self.sink.outputs();
        let mut missing = 0;
        let mut twice = Vec::new();
        for (shard, r) in self.records() {
            let k = key(&shard, &r.position());
            match outputs.get(&k).map(|i| i.count) {
                None => missing += 1,
                Some(1) => {}
                Some(n) => twice.push((k, n)),
            }
        }
        (missing, twice)
    }

    async fn exactly_once(&self) {
        let limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < limit && self.off().0 > 0 {
            sleep(Duration::from_millis(50)).await;
        }
        let (missing, twice) = self.off();
        assert!(!self.records().is_empty());
        assert_eq!((missing, twice), (0, Vec::new()), "every output once");
    }

    /// Shards whose lease checkpoint is not the sink's position.
    fn lease_off_sink(&self) -> Vec<String> {
        let rows = self.sink.rows();
        let leases = self.store.leases().into_iter();
        leases
            .filter(|l| !is_coordination_key(&l.key))
            .filter(|l| rows.get(&l.key).and_then(|r| r.position.as_ref()) != Some(&l.checkpoint))
            .map(|l| {
                format!(
                    "{}: lease {}, sink {:?}",
                    l.key,
                    l.checkpoint,
                    rows.get(&l.key)
                )
            })
            .collect()
    }
}

async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        sleep(Duration::from_millis(10)).await;
    }
    done()
}

async fn stop(r: Running) {
    r.shutdown.shutdown();
    r.task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fleet_commits_into_the_sink_once_across_a_kill_and_the_lease_follows_the_sink() {
    let w = World::new(4);
    let a = w.start("a", true);
    for _ in 0..10 {
        w.fill(20);
        sleep(Duration::from_millis(150)).await;
    }
    assert!(w.sink.applied_commits().len() > 4, "a committed as it went");
    a.task.abort();
    let _ = a.task.await;
    let b = w.start("b", true);
    w.fill(100);
    w.exactly_once().await;
    stop(b).await;
    assert_eq!(w.lease_off_sink(), Vec::<String>::new());
    let opens_by_b = w
        .sink
        .rows()
        .values()
        .filter(|r| r.owner.as_str() == "b")
        .count();
    assert_eq!(opens_by_b, 4, "b's tenures fenced every shard's row");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_workers_commit_into_the_sink_is_refused_once_another_opened_the_shard() {
    let w = World::new(1);
    let a = w.start("a", true);
    w.fill(20);
    assert!(until(Duration::from_secs(5), || w.off().0 == 0).await);
    // a's next commit gets no answer and lands two failover times later; a freezes.
    let applied = w.sink.applied_commits().len();
    w.faults.set_stragglers(1.0, FAILOVER * 2);
    w.fill(10);
    let handed = |w: &World| w.handed.lock().unwrap().len();
    assert!(until(Duration::from_secs(2), || handed(&w) == 30).await);
    w.faults.pause("a");
    w.faults.set_stragglers(0.0, Duration::ZERO);
    let b = w.start("b", true);
    sleep(FAILOVER * 3).await;
    w.faults.resume("a");
    w.fill(20);
    w.exactly_once().await;
    stop(b).await;
    stop(a).await;
    assert!(
        w.sink.fenced_off() > 0,
        "the zombie's straggling commit was refused"
    );
    let by_a_after = w.sink.applied_commits()[applied..]
        .iter()
        .filter(|c| c.owner.as_str() == "a")
        .count();
    assert_eq!(
        by_a_after, 0,
        "nothing of the zombie's applied once it froze"
    );
    println!("zombie commits refused: {}", w.sink.fenced_off());
}

#[tokio::test(start_paused = true)]
async fn a_lease_moved_back_behind_the_sink_resumes_after_the_sinks_position() {
    let w = World::new(2);
    let a = w.start("a", true);
    w.fill(60);
    w.exactly_once().await;
    stop(a).await;
    let handed_before = w.handed.lock().unwrap().clone();
    // An operator moves every lease back to the start (a reset, or a lease table restored
    // from an old backup): the sink knows better.
    for mut lease in w.store.leases() {
        if !is_coordination_key(&lease.key) {
            lease.checkpoint = Checkpoint::TrimHorizon;
            w.store.insert(lease);
        }
    }
    let b = w.start("b", true);
    w.fill(20);
    w.exactly_once().await;
    stop(b).await;
    let handed = w.handed.lock().unwrap().clone();
    let again: Vec<_> = handed_before
        .iter()
        .filter(|(k, n)| handed.get(*k) != Some(n))
        .collect();
    assert_eq!(
        again,
        Vec::<(&String, &usize)>::new(),
        "nothing before the sink's position handed again"
    );
    assert_eq!(
        w.lease_off_sink(),
        Vec::<String>::new(),
        "the leases moved up to the sink"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_row_made_again_with_its_counters_started_over_is_let_in_by_the_sink() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    // The sink remembers a tenure of a lease table since rebuilt: a fence far above any the
    // new table's counters reach.
    let row = PositionRow {
        owner: WorkerId::new("gone"),
        fence: FencingToken(1_000_000),
        position: None,
    };
    w.sink.insert_row(shard.clone(), row);
    let a = w.start("a", true);
    w.fill(30);
    w.exactly_once().await;
    stop(a).await;
    let lease = w.store.get(&shard).await.unwrap().unwrap();
    assert!(lease.fence.unwrap().0 < 1_000_000);
    assert_eq!(w.sink.rows()[&shard].fence, lease.fence.unwrap());
}

#[tokio::test(start_paused = true)]
async fn lost_answers_of_the_sink_commit_nothing_twice() {
    let w = World::new(2);
    w.faults.set_ambiguous_rate(0.3);
    let a = w.start("a", true);
    for _ in 0..5 {
        w.fill(20);
        sleep(Duration::from_millis(300)).await;
    }
    w.exactly_once().await;
    w.faults.set_ambiguous_rate(0.0);
    stop(a).await;
}

#[tokio::test(start_paused = true)]
async fn committing_into_a_sink_the_worker_was_not_given_is_refused_before_anything_is_written() {
    let w = World::new(1);
    let a = w.start("a", false);
    w.fill(10);
    assert!(
        until(Duration::from_secs(5), || !w
            .errors
            .lock()
            .unwrap()
            .is_empty())
        .await
    );
    a.task.abort();
    let errors = w.errors.lock().unwrap().clone();
    assert!(errors[0].contains("PositionsNotOpened"), "{errors:?}");
    assert!(w.sink.outputs().is_empty() && w.sink.applied_commits().is_empty());
    assert!(matches!(
        CheckpointError::PositionsNotOpened { shard: ShardId::new("s") }.to_string(),
        s if s.contains("WorkerBuilder::positions")
    ));
}

#[tokio::test(start_paused = true)]
async fn parallel_outputs_into_a_sink_need_the_worker_to_be_given_it() {
    let w = World::new(1);
    let sink = w.sink.clone();
    let handler = |r: Record| async move {
        Ok::<_, BoxError>(vec![MemoryWrite::add(r.sequence_number.to_string(), 1)])
    };
    let parallel = Parallel::with_outputs(Arc::new(sink), handler);
    let error = Worker::builder(w.stream.client("a"), w.store.client("a"))
        .build_with(parallel)
        .unwrap_err();
    assert_eq!(error.key, "Parallel::with_outputs");
}

#[tokio::test(start_paused = true)]
async fn a_sink_row_taken_by_a_late_opener_is_taken_back_and_the_commit_goes_on() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    let a = w.start("a", true);
    w.fill(20);
    w.exactly_once().await;
    // A tenure that opened late (its lease already lost) names itself on the row; the
    // holder's next commit is refused by the sink while its lease row is still its own: the
    // holder opens the sink again and commits, without an error or a restart.
    let position = w.sink.rows()[&shard].position.clone();
    let late = PositionRow {
        owner: WorkerId::new("late"),
        fence: FencingToken(1),
        position,
    };
    w.sink.insert_row(shard.clone(), late);
    let fenced_off = w.sink.fenced_off();
    w.fill(20);
    w.exactly_once().await;
    stop(a).await;
    assert!(
        w.sink.fenced_off() > fenced_off,
        "the commit was refused once"
    );
    let errors = w.errors.lock().unwrap().clone();
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(w.sink.rows()[&shard].owner.as_str(), "a", "opened again");
}

#[tokio::test(start_paused = true)]
async fn a_sink_down_gives_no_record_up_whatever_the_failure_policy() {
    let w = World::new(2);
    let letters = kcl_core::memory::MemorySink::new();
    let (handed, errors) = (w.handed.clone(), w.errors.clone());
    let sink = w.sink.client("a");
    let outputs = sink.clone();
    let config = config().failure(kcl_core::failure::FailurePolicy::dead_letter(1));
    let worker = Worker::builder(w.stream.client("a"), w.store.client("a"))
        .id("a")
        .config(config)
        .positions(sink)
        .dead_letters(kcl_core::failure::DeadLetters::new(letters.clone()))
        .build(move |shard: &ShardId| Exact {
            shard: shard.clone(),
            sink: outputs.clone(),
            handed: handed.clone(),
            errors: errors.clone(),
        })
        .unwrap();
    let a = Running {
        shutdown: worker.shutdown_handle(),
        task: tokio::spawn(w.faults.run_as("a", worker.run())),
    };
    w.fill(20);
    w.exactly_once().await;
    // The sink goes down (every call of worker a's fails) while records come: its commits
    // fail with the store's error, which is no record's fault.
    let limits = w.faults.clone();
    limits.set_error_rate(1.0);
    w.fill(20);
    sleep(Duration::from_secs(20)).await;
    limits.set_error_rate(0.0);
    w.exactly_once().await;
    stop(a).await;
    assert_eq!(
        letters.letters().len(),
        0,
        "no record dead-lettered for an outage"
    );
    assert!(
        !w.errors.lock().unwrap().is_empty(),
        "the commits did fail meanwhile"
    );
}
