//! Exactly-once outputs through a real `Worker` on the in-memory backends, under paused time:
//! a processor commits each record's output (an `ADD 1` to the record's own item, so that a
//! duplicate shows as a count of 2) with its checkpoint, and every record's output is
//! committed exactly once across kills, a frozen zombie, conflicts, lost answers and
//! stragglers, stretches committed in parts; misuse is refused before anything is written;
//! and fencing tokens grow from one holder to the next.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::admin::{self, RESET_OWNER, ResetTo};
use kcl_core::memory::{
    Condition, Faults, MemoryLeaseStore, MemoryStream, MemoryWrite, OutputItem, Refusal,
};
use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Outputs, Transact};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, ExtendedSequenceNumber, InitializationInput, LeaseStore,
    ProcessRecordsInput, RecordProcessor, SequenceNumber, ShardId, ShutdownHandle, Worker,
    WorkerConfig,
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

/// The item a record's output adds 1 to.
fn key(shard: &ShardId, position: &ExtendedSequenceNumber) -> String {
    format!("{shard}/{position}")
}

/// One processor instance: who, for which shard, its fencing tokens (initialization's, then
/// the checkpointer's at each batch).
#[derive(Debug, Clone)]
struct Instance {
    worker: String,
    shard: ShardId,
    token: u64,
    seen: Vec<u64>,
}

#[derive(Debug, Default)]
struct Log {
    instances: Vec<Instance>,
    /// Commits that failed: worker, shard, the error.
    errors: Vec<(String, ShardId, String)>,
    /// Commits tried, by worker.
    attempts: BTreeMap<String, usize>,
}

type Shared = Arc<Mutex<Log>>;

/// What a processor does besides committing its outputs.
#[derive(Clone, Default)]
struct Behaviour {
    /// Commit every this many batches (0: only when stopping or at the shard's end).
    every: u32,
    /// Once, fleet-wide: add a write refused by its condition to a batch's third record.
    refuse_once: Option<Arc<AtomicBool>>,
    /// Once, fleet-wide: try commits that must be refused before anything is written.
    probe: Option<Arc<AtomicBool>>,
    /// Every instance but a shard's first commits at the first record of each batch.
    later_at_first: bool,
}

struct Exact<T> {
    worker: String,
    shard: ShardId,
    store: T,
    pending: Vec<(ExtendedSequenceNumber, MemoryWrite)>,
    batches: u32,
    behaviour: Behaviour,
    log: Shared,
    index: usize,
}

impl<T: Transact<Write = MemoryWrite>> Exact<T> {
    /// Commits the pending writes up to `at` (all of them, if `None`) with a checkpoint
    /// there.
    async fn commit(
        &mut self,
        cp: &mut Checkpointer,
        at: Option<ExtendedSequenceNumber>,
    ) -> Result<(), BoxError> {
        let pending = std::mem::take(&mut self.pending);
        let (now, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(p, _)| at.as_ref().is_none_or(|at| p <= at));
        self.pending = later;
        let mut outputs = Outputs::new();
        for (position, write) in now {
            outputs.push_at(position, write);
        }
        *self
            .log
            .lock()
            .unwrap()
            .attempts
            .entry(self.worker.clone())
            .or_default() += 1;
        let result = match at {
            Some(at) => cp.commit_outputs_at(&self.store, outputs, at).await,
            None => cp.commit_outputs(&self.store, outputs).await,
        };
        result.map_err(|e| {
            let error = (self.worker.clone(), self.shard.clone(), format!("{e:?}"));
            self.log.lock().unwrap().errors.push(error);
            e.into()
        })
    }

    /// Whether this is the first processor of its shard.
    fn first_of_shard(&self) -> bool {
        let log = self.log.lock().unwrap();
        let first = log.instances.iter().position(|i| i.shard == self.shard);
        first == Some(self.index)
    }
}

impl<T: Transact<Write = MemoryWrite>> RecordProcessor for Exact<T> {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        let mut log = self.log.lock().unwrap();
        self.index = log.instances.len();
        log.instances.push(Instance {
            worker: self.worker.clone(),
            shard: self.shard.clone(),
            token: input.fencing_token.0,
            seen: Vec::new(),
        });
        Ok(())
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let records = input.records().to_vec();
        self.log.lock().unwrap().instances[self.index]
            .seen
            .push(cp.fencing_token().0);
        let mut from = 0;
        if let Some(probed) = self.behaviour.probe.clone()
            && !probed.swap(true, Ordering::SeqCst)
        {
            probe(cp, &self.store, &self.shard, &records, &self.log).await;
            from = 1;
        }
        for r in records[from..]
            .iter()
            .filter(|r| !r.data.starts_with(b"quiet"))
        {
            let write = MemoryWrite::add(key(&self.shard, &r.position()), 1);
            self.pending.push((r.position(), write));
        }
        if self.behaviour.later_at_first && !self.first_of_shard() {
            return self.commit(cp, Some(records[0].position())).await;
        }
        if let Some(refused) = &self.behaviour.refuse_once
            && records.len() >= 3
            && !refused.swap(true, Ordering::SeqCst)
        {
            let write = MemoryWrite::put("taken", "again").when(Condition::Absent);
            self.pending.push((records[2].position(), write));
        }
        self.batches += 1;
        let every = self.behaviour.every;
        if every > 0 && self.batches.is_multiple_of(every) {
            self.commit(cp, None).await?;
        }
        Ok(())
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        self.commit(cp, None).await
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        self.commit(cp, None).await
    }
}

/// Commits that must be refused before anything is written, each logged as an error of
/// worker `probe`: an output of an undelivered record, one of a record at the checkpoint,
/// a record's writes over the limits, and two writes of one item by one record.
async fn probe<T: Transact<Write = MemoryWrite>>(
    cp: &mut Checkpointer,
    store: &T,
    shard: &ShardId,
    records: &[kcl_core::Record],
    log: &Shared,
) {
    let last = records.last().unwrap().position();
    let next = ExtendedSequenceNumber::new(SequenceNumber::from(
        last.sequence.as_str().parse::<u128>().unwrap() + 1,
    ));
    let first = &records[0];
    let mut cases: Vec<Outputs<MemoryWrite>> = Vec::new();
    let mut beyond = Outputs::new();
    beyond.push_at(next, MemoryWrite::add("beyond", 1));
    cases.push(beyond);
    let mut large = Outputs::new();
    for i in 0..=store.limits().writes {
        large.push(first, MemoryWrite::add(format!("large-{i}"), 1));
    }
    cases.push(large);
    let mut twice = Outputs::new();
    twice.push(first, MemoryWrite::add("twice", 1));
    twice.push(first, MemoryWrite::add("twice", 1));
    cases.push(twice);
    for outputs in cases {
        let error = cp.commit_outputs(store, outputs).await.unwrap_err();
        let error = ("probe".to_owned(), shard.clone(), format!("{error:?}"));
        log.lock().unwrap().errors.push(error);
    }
    // The first record committed with a write of the probe's, then an output of it again.
    let mut one = Outputs::new();
    one.push(first, MemoryWrite::add(key(shard, &first.position()), 1));
    one.push(first, MemoryWrite::put(format!("probe-{shard}"), "ok"));
    cp.commit_outputs_at(store, one, first.position())
        .await
        .unwrap();
    let mut again = Outputs::new();
    again.push(first, MemoryWrite::add("again", 1));
    let error = cp.commit_outputs(store, again).await.unwrap_err();
    let error = ("probe".to_owned(), shard.clone(), format!("{error:?}"));
    log.lock().unwrap().errors.push(error);
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

struct World {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    faults: Faults,
    log: Shared,
}

impl World {
    fn new(shards: u32) -> Self {
        // `KCL_MUTATION=<name>` with `--features mutation-testing`: which of these tests a
        // deliberate bug fails.
        #[cfg(feature = "mutation-testing")]
        if let Ok(name) = std::env::var("KCL_MUTATION") {
            let all = kcl_core::mutation::Mutation::ALL.iter();
            kcl_core::mutation::set(all.copied().find(|m| format!("{m:?}") == name));
        }
        let faults = Faults::seeded(51);
        Self {
            stream: MemoryStream::new(shards),
            store: MemoryLeaseStore::with_faults(faults.clone()),
            faults,
            log: Shared::default(),
        }
    }

    /// Starts worker `id` as a process of its own, its processors committing through its
    /// own handle of the store.
    fn start(&self, id: &str, config: WorkerConfig, behaviour: &Behaviour) -> Running {
        self.start_with(id, config, behaviour, self.store.client(id))
    }

    /// As [`start`](Self::start), the processors committing through `outputs`.
    fn start_with<T: Transact<Write = MemoryWrite> + Clone>(
        &self,
        id: &str,
        config: WorkerConfig,
        behaviour: &Behaviour,
        outputs: T,
    ) -> Running {
        let (worker, behaviour, log) = (id.to_owned(), behaviour.clone(), self.log.clone());
        let w = Worker::new(
            id,
            config,
            self.stream.client(id),
            self.store.client(id),
            move |shard: &ShardId| Exact {
                worker: worker.clone(),
                shard: shard.clone(),
                store: outputs.clone(),
                pending: Vec::new(),
                batches: 0,
                behaviour: behaviour.clone(),
                log: log.clone(),
                index: 0,
            },
        )
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

    /// Every record's item, by key.
    fn expected(&self) -> BTreeSet<String> {
        let shards = self.stream.shards();
        let records = shards.iter().flat_map(|s| {
            let records = self.stream.records(&s.id).into_iter();
            let loud = records.filter(|r| !r.data.starts_with(b"quiet"));
            loud.map(|r| key(&s.id, &r.position()))
        });
        records.collect()
    }

    /// The records' items missing, counted more than once, or that are no record's.
    fn off(&self) -> (Vec<String>, Vec<(String, i64)>, Vec<String>) {
        let outputs = self.store.outputs();
        let expected = self.expected();
        let missing = expected
            .iter()
            .filter(|k| !outputs.contains_key(*k))
            .cloned()
            .collect();
        let twice = outputs
            .iter()
            .filter(|(k, i)| expected.contains(*k) && i.count != 1)
            .map(|(k, i)| (k.clone(), i.count))
            .collect();
        let strays = outputs
            .keys()
            .filter(|k| !expected.contains(*k) && !k.starts_with("probe-") && *k != "taken")
            .cloned()
            .collect();
        (missing, twice, strays)
    }

    /// Waits (up to 60 s) until every record's output is committed; then none may be
    /// missing, twice or a stray.
    async fn exactly_once(&self) {
        let limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < limit && !self.off().0.is_empty() {
            sleep(Duration::from_millis(50)).await;
        }
        let (missing, twice, strays) = self.off();
        assert!(
            missing.is_empty() && twice.is_empty() && strays.is_empty(),
            "{} missing (first {:?}), not once {twice:?}, strays {strays:?}",
            missing.len(),
            missing.first()
        );
        assert!(!self.expected().is_empty());
    }

    /// Whether every shard's outputs stand in step with its checkpoint: the outputs of the
    /// records at or before it committed once, none after it. What does not.
    fn out_of_step(&self) -> Vec<String> {
        let outputs = self.store.outputs();
        let mut off = Vec::new();
        for lease in self.store.leases() {
            if is_coordination_key(&lease.key) {
                continue;
            }
            for r in self.stream.records(&lease.key) {
                let covered = match &lease.checkpoint {
                    Checkpoint::Sequence(s) => r.position() <= *s,
                    Checkpoint::ShardEnd => true,
                    _ => false,
                };
                let count = outputs
                    .get(&key(&lease.key, &r.position()))
                    .map_or(0, |i| i.count);
                let owed = covered && !r.data.starts_with(b"quiet");
                if count != i64::from(owed) {
                    off.push(format!(
                        "{} at {}: record {} counted {count}",
                        lease.key,
                        lease.checkpoint,
                        r.position()
                    ));
                }
            }
        }
        off
    }

    fn errors(&self, of: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        let errors = log.errors.iter().filter(|(w, _, _)| w == of);
        errors.map(|(_, _, e)| e.clone()).collect()
    }

    fn fence(&self, shard: &ShardId) -> Option<u64> {
        let lease = self.store.leases().into_iter().find(|l| l.key == *shard)?;
        lease.fence.map(|f| f.0)
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
async fn a_worker_killed_mid_stream_and_another_taking_over_commit_every_output_once() {
    let w = World::new(4);
    let every = Behaviour {
        every: 3,
        ..Behaviour::default()
    };
    let a = w.start("a", config(), &every);
    for _ in 0..10 {
        w.fill(20);
        sleep(Duration::from_millis(150)).await;
    }
    assert!(
        w.store.output_counts().applied > 4,
        "a committed as it went"
    );
    a.task.abort();
    let _ = a.task.await;
    assert_eq!(w.out_of_step(), Vec::<String>::new(), "in step at the kill");
    let uncommitted = w.off().0.len();
    assert!(uncommitted > 0, "the kill left work to redo");
    let each = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let b = w.start("b", config(), &each);
    w.fill(100);
    w.exactly_once().await;
    stop(b).await;
    assert_eq!(w.out_of_step(), Vec::<String>::new());
    let by: BTreeSet<String> = w
        .store
        .applied_commits()
        .into_iter()
        .map(|c| c.client)
        .collect();
    assert_eq!(by, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
}

#[tokio::test(start_paused = true)]
async fn a_frozen_workers_commit_is_refused_once_the_lease_moved() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let a = w.start("a", config(), &every);
    w.fill(20);
    assert!(until(Duration::from_secs(5), || w.off().0.is_empty()).await);
    let zombie_fence = w.fence(&shard).unwrap();
    // a's next commit gets no answer and lands two failover times later; a freezes the
    // instant it sent it, for three.
    let tried = |w: &World| w.log.lock().unwrap().attempts.get("a").copied();
    let before = tried(&w);
    w.faults.set_stragglers(1.0, FAILOVER * 2);
    w.fill(10);
    assert!(until(Duration::from_secs(2), || tried(&w) != before).await);
    w.faults.pause("a");
    w.faults.set_stragglers(0.0, Duration::ZERO);
    let frozen = Instant::now();
    let b = w.start("b", config(), &every);
    sleep(FAILOVER * 3).await;
    w.faults.resume("a");
    w.fill(20);
    w.exactly_once().await;
    stop(b).await;
    stop(a).await;
    let refused: Vec<_> = w
        .store
        .refused_commits()
        .into_iter()
        .filter(|r| r.client == "a" && r.fence.0 == zombie_fence)
        .collect();
    assert!(
        !refused.is_empty() && refused.iter().all(|r| r.reason == Refusal::LeaseRow),
        "the zombie's commit landed and was refused: {refused:?}"
    );
    let late = w
        .store
        .applied_commits()
        .into_iter()
        .filter(|c| c.client == "a" && c.fence.0 == zombie_fence && c.at >= frozen);
    assert_eq!(late.count(), 0, "nothing of the zombie's tenure applied");
    assert_eq!(w.out_of_step(), Vec::<String>::new());
    println!("zombie commits refused: {}", refused.len());
}

#[tokio::test(start_paused = true)]
async fn an_operators_reset_under_a_holder_refuses_its_next_commit_as_lease_lost() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let a = w.start("a", config(), &every);
    w.fill(20);
    assert!(until(Duration::from_secs(5), || w.off().0.is_empty()).await);
    // Reset to where the row stands: nothing is replayed, but the holder's tenure is over.
    let row = w.store.get(&shard).await.unwrap().unwrap();
    let to = ResetTo {
        checkpoint: row.checkpoint,
        pin: None,
    };
    admin::reset(&w.store.client(RESET_OWNER), &shard, &to)
        .await
        .unwrap();
    w.fill(10);
    w.exactly_once().await;
    stop(a).await;
    let lost = w.errors("a");
    assert!(
        lost.len() == 1 && lost[0].starts_with("LeaseLost"),
        "the holder's commit after the reset: {lost:?}"
    );
    let refused = w.store.refused_commits();
    assert!(
        refused
            .iter()
            .any(|r| r.client == "a" && r.reason == Refusal::LeaseRow && r.reported),
        "refused by the row's fence, not by the worker's own view: {refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn transaction_conflicts_are_retried_not_taken_for_a_lost_lease() {
    let w = World::new(1);
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let a = w.start("a", config(), &every);
    w.fill(20);
    assert!(until(Duration::from_secs(5), || w.off().0.is_empty()).await);
    let fences: Vec<Option<u64>> = w.stream.shards().iter().map(|s| w.fence(&s.id)).collect();
    // Fewer than a commit's attempts: retried within it. Then more: the commit fails as a
    // store error, and the processor's next instance commits again.
    w.store.inject_conflicts(3);
    w.fill(20);
    assert!(until(Duration::from_secs(10), || w.off().0.is_empty()).await);
    assert_eq!(
        w.errors("a"),
        Vec::<String>::new(),
        "retried within the commit"
    );
    w.store.inject_conflicts(7);
    w.fill(20);
    w.exactly_once().await;
    stop(a).await;
    let errors = w.errors("a");
    assert!(
        !errors.is_empty() && errors.iter().all(|e| e.starts_with("Store")),
        "store errors only, never a lost lease: {errors:?}"
    );
    assert_eq!(w.store.output_counts().conflicts, 10);
    let after: Vec<Option<u64>> = w.stream.shards().iter().map(|s| w.fence(&s.id)).collect();
    assert_eq!(fences, after, "the same tenures throughout");
    assert_eq!(w.out_of_step(), Vec::<String>::new());
}

/// Store errors, lost answers and stragglers on every call for a while; `window`: the
/// store's idempotency window.
async fn lost_answers_and_stragglers(window: Option<Duration>) -> World {
    let w = World::new(2);
    w.store.set_idempotency_window(window);
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let a = w.start("a", config(), &every);
    w.faults.set_error_rate(0.1);
    w.faults.set_ambiguous_rate(0.3);
    w.faults.set_stragglers(0.2, Duration::from_millis(300));
    for _ in 0..40 {
        w.fill(5);
        sleep(Duration::from_millis(200)).await;
        assert_eq!(w.out_of_step(), Vec::<String>::new());
    }
    w.faults.clear();
    w.exactly_once().await;
    stop(a).await;
    assert_eq!(w.out_of_step(), Vec::<String>::new());
    let unanswered = w
        .store
        .applied_commits()
        .iter()
        .filter(|c| !c.reported)
        .count();
    assert!(unanswered > 0, "some commits applied without an answer");
    w
}

#[tokio::test(start_paused = true)]
async fn lost_answers_and_stragglers_apply_once_with_tokens_remembered() {
    let w = lost_answers_and_stragglers(Some(Duration::from_secs(600))).await;
    assert!(
        w.store.output_counts().replays > 0,
        "a retry answered by its token"
    );
}

#[tokio::test(start_paused = true)]
async fn lost_answers_and_stragglers_apply_once_without_tokens() {
    let w = lost_answers_and_stragglers(None).await;
    assert_eq!(w.store.output_counts().replays, 0);
    let refused = w.store.refused_commits();
    assert!(
        refused.iter().any(|r| r.reason == Refusal::LeaseRow),
        "a retry of an applied commit fails on the row, and is found applied"
    );
}

/// Commits through `inner` until `left` runs out, then hangs (a process that died between
/// two parts of a stretch, as far as the store can tell).
#[derive(Clone)]
struct HangAfter {
    inner: MemoryLeaseStore,
    left: Arc<AtomicUsize>,
}

impl Transact for HangAfter {
    type Write = MemoryWrite;

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn measure(&self, write: &MemoryWrite) -> Measure {
        self.inner.measure(write)
    }

    async fn commit(&self, commit: Commit<'_, MemoryWrite>) -> Result<(), CommitError> {
        let left = self.left.load(Ordering::SeqCst);
        if left == 0 {
            std::future::pending::<()>().await;
        }
        self.left.store(left - 1, Ordering::SeqCst);
        self.inner.commit(commit).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_stretch_past_the_limits_commits_in_parts_and_a_kill_between_them_leaves_them_in_step() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    w.store.set_output_limits(Limits {
        writes: 3,
        bytes: 1 << 20,
    });
    w.fill(40);
    let hang = HangAfter {
        inner: w.store.client("a"),
        left: Arc::new(AtomicUsize::new(3)),
    };
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let a = w.start_with("a", config().max_records(40), &every, hang);
    assert!(
        until(Duration::from_secs(5), || w.store.output_counts().applied
            == 3)
        .await
    );
    sleep(Duration::from_secs(1)).await;
    a.task.abort();
    let _ = a.task.await;
    let records = w.stream.records(&shard);
    let row = w.store.get(&shard).await.unwrap().unwrap();
    assert_eq!(
        row.checkpoint,
        Checkpoint::Sequence(records[8].position()),
        "each part checkpointed its own last record"
    );
    assert_eq!(
        w.out_of_step(),
        Vec::<String>::new(),
        "in step between parts"
    );
    let b = w.start("b", config().max_records(40), &every);
    w.exactly_once().await;
    stop(b).await;
    let commits = w.store.applied_commits();
    assert!(commits.len() >= 3 + 11, "{} commits", commits.len());
    // A stretch without writes commits its checkpoint alone.
    for c in commits.iter().filter(|c| !c.writes.is_empty()) {
        let last = c.writes.last().unwrap();
        assert!(c.writes.len() <= 3, "within the limits");
        let end = Checkpoint::Sequence(
            records
                .iter()
                .find(|r| key(&shard, &r.position()) == last.key)
                .unwrap()
                .position(),
        );
        assert!(
            c.checkpoint == end || c.checkpoint == Checkpoint::ShardEnd,
            "{c:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_output_refused_by_its_condition_fails_the_commit_and_writes_nothing_of_it() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    w.store.insert_output(
        "taken",
        OutputItem {
            value: Some("before".to_owned()),
            count: 0,
        },
    );
    let behaviour = Behaviour {
        every: 1,
        refuse_once: Some(Arc::default()),
        ..Behaviour::default()
    };
    w.fill(10);
    let a = w.start("a", config(), &behaviour);
    w.exactly_once().await;
    stop(a).await;
    let records = w.stream.records(&shard);
    let errors = w.errors("a");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("OutputRefused")
            && errors[0].contains(&records[2].position().to_string()),
        "names the third record: {errors:?}"
    );
    assert_eq!(
        w.store.output("taken").unwrap().value.as_deref(),
        Some("before")
    );
    let refused = w.store.refused_commits();
    assert_eq!(refused.len(), 1);
    // Records 0 to 2's own writes, then the refused one.
    assert_eq!(refused[0].reason, Refusal::Write { index: 3 });
}

#[tokio::test(start_paused = true)]
async fn outputs_outside_the_stretch_or_too_large_are_refused_before_anything_is_written() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    w.store.set_output_limits(Limits {
        writes: 3,
        bytes: 1 << 20,
    });
    let behaviour = Behaviour {
        every: 1,
        probe: Some(Arc::default()),
        ..Behaviour::default()
    };
    w.fill(5);
    let a = w.start("a", config(), &behaviour);
    w.exactly_once().await;
    stop(a).await;
    let errors = w.errors("probe");
    let kinds: Vec<&str> = errors
        .iter()
        .map(|e| e.split([' ', '{']).next().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "OutputOutside",
            "OutputsTooLarge",
            "OutputsTooLarge",
            "OutputOutside"
        ],
        "{errors:?}"
    );
    // The probe's own commit first, then the rest of the batch: nothing else applied.
    let commits = w.store.applied_commits();
    let first = &commits[0].writes;
    assert_eq!(first[1], MemoryWrite::put(format!("probe-{shard}"), "ok"));
    assert_eq!(first.len(), 2);
    let strays = ["beyond", "twice", "again", "large-0"];
    assert!(strays.iter().all(|k| w.store.output(k).is_none()));
    assert!(
        w.store.refused_commits().is_empty(),
        "none reached the store"
    );
    assert_eq!(w.errors("a"), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_grow_strictly_from_one_holder_to_the_next() {
    let w = World::new(2);
    let every = Behaviour {
        every: 1,
        ..Behaviour::default()
    };
    let config = config().restart_grace(Duration::from_secs(20));
    let held = |w: &World, by: &str| {
        let leases = w.store.leases().into_iter();
        let shards = leases.filter(|l| !is_coordination_key(&l.key));
        shards
            .filter(|l| l.owner.as_ref().is_some_and(|o| o.as_str() == by))
            .count()
    };
    let a = w.start("a", config.clone(), &every);
    w.fill(20);
    assert!(until(Duration::from_secs(5), || w.off().0.is_empty()).await);
    // A restart under the same id: the leases kept for it, adopted again.
    stop(a).await;
    let a = w.start("a", config.clone(), &every);
    w.fill(20);
    assert!(until(Duration::from_secs(10), || w.off().0.is_empty()).await);
    // A handoff to a new worker, then its takeover by the first when it dies.
    let b = w.start("b", config.clone(), &every);
    assert!(until(Duration::from_secs(20), || held(&w, "b") == 1).await);
    w.fill(20);
    assert!(until(Duration::from_secs(10), || w.off().0.is_empty()).await);
    b.task.abort();
    let _ = b.task.await;
    assert!(until(Duration::from_secs(40), || held(&w, "a") == 2).await);
    // An operator's reset of each lease where it stands.
    for shard in w.stream.shards() {
        let row = w.store.get(&shard.id).await.unwrap().unwrap();
        let to = ResetTo {
            checkpoint: row.checkpoint,
            pin: None,
        };
        admin::reset(&w.store.client(RESET_OWNER), &shard.id, &to)
            .await
            .unwrap();
    }
    w.fill(20);
    w.exactly_once().await;
    stop(a).await;
    let instances = w.log.lock().unwrap().instances.clone();
    for shard in w.stream.shards() {
        let tenures: Vec<&Instance> = instances.iter().filter(|i| i.shard == shard.id).collect();
        let tokens: Vec<(String, u64)> = tenures
            .iter()
            .map(|i| (i.worker.clone(), i.token))
            .collect();
        assert!(tokens.len() >= 3, "{} had {tokens:?}", shard.id);
        assert!(
            tokens.windows(2).all(|t| t[0].1 < t[1].1),
            "{}: strictly growing from one holder to the next: {tokens:?}",
            shard.id
        );
        for i in &tenures {
            assert!(
                i.seen.iter().all(|t| *t == i.token),
                "the checkpointer's is the same: {i:?}"
            );
        }
    }
    let by_b = instances.iter().filter(|i| i.worker == "b").count();
    assert_eq!(by_b, 1, "one lease handed to b");
    let tenures = instances.len();
    assert!(
        tenures >= 2 + 2 + 1 + 1 + 2,
        "{tenures} tenures: {instances:?}"
    );
}

/// A commit that applied without an answer, which the tenure could not settle (every retry
/// and the read after them failed), then a plain checkpoint of the next processor (a record
/// without outputs, behind the commit's checkpoint): that checkpoint must not move the row
/// back under the commit, or the commit's outputs are committed again. The tenure reads the
/// row before its next checkpoint write (`Tenure::learn_commit`), and a plain checkpoint is
/// conditioned on the checkpoint it replaces as well as the counter (which a commit leaves
/// alone), so a commit that lands late is not overwritten either.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_after_an_unsettled_commit_does_not_move_the_row_back() {
    let w = World::new(1);
    let shard = w.stream.shards()[0].id.clone();
    let behaviour = Behaviour {
        every: 1,
        later_at_first: true,
        ..Behaviour::default()
    };
    let config = config()
        .failover_time(Duration::from_secs(30))
        .max_records(2);
    let a = w.start("a", config, &behaviour);
    assert!(until(Duration::from_secs(5), || w.fence(&shard).is_some()).await);
    sleep(Duration::from_secs(1)).await;
    // The commit of the first batch applies; its answer is lost; then every call fails
    // until the tenure gives it up unsettled.
    w.faults.set_ambiguous_rate(1.0);
    w.stream.put("k", "quiet-1");
    w.stream.put("k", "record-2");
    let applied = || w.store.output_counts().applied == 1;
    assert!(until(Duration::from_secs(5), applied).await);
    w.faults.set_ambiguous_rate(0.0);
    w.faults.partition("a");
    let failed = || !w.errors("a").is_empty();
    assert!(until(Duration::from_secs(10), failed).await);
    w.faults.heal("a");
    for i in 3..10 {
        w.stream.put("k", format!("record-{i}"));
        sleep(Duration::from_millis(500)).await;
    }
    w.exactly_once().await;
    stop(a).await;
    let moved_back = w.store.journal().windows(2).any(|e| {
        e[0].lease.key == shard
            && e[1].lease.key == shard
            && e[1].lease.checkpoint.progress_cmp(&e[0].lease.checkpoint)
                == Some(std::cmp::Ordering::Less)
    });
    assert!(!moved_back, "the row's checkpoint moved back");
}
