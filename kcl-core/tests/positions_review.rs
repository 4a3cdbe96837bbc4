//! Exactly-once outputs into a sink that keeps positions (issue 52), on the paths a review
//! found the first tests did not take: `Parallel::with_outputs` over a sink whose row another
//! tenure named or whose commit applied with every answer lost (the committer opens the sink
//! again and brings the lease up to it), a slow sink commit (renewals go on meanwhile),
//! `SHARD_END` through the sink with the lease's write after it failing (the parent's row
//! still names its children), a committer over a store that is not the worker's (said, at
//! once). Each failed before its fix.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::sync::Arc;
use std::time::Duration;

use kcl_core::memory::{
    Faults, MemoryLeaseStore, MemoryPositionSink, MemoryStream, MemoryWrite, PositionRow,
};
use kcl_core::{
    BoxError, FencingToken, Parallel, Record, ShardId, ShutdownHandle, Worker, WorkerConfig,
    WorkerId,
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

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

/// One shard, a lease store and a sink, each with faults of its own.
struct World {
    stream: MemoryStream,
    store: MemoryLeaseStore,
    sink: MemoryPositionSink,
    store_faults: Faults,
    sink_faults: Faults,
}

impl World {
    fn new() -> Self {
        let (store_faults, sink_faults) = (Faults::seeded(7), Faults::seeded(8));
        Self {
            stream: MemoryStream::new(1),
            store: MemoryLeaseStore::with_faults(store_faults.clone()),
            sink: MemoryPositionSink::new(sink_faults.clone()),
            store_faults,
            sink_faults,
        }
    }

    fn shard(&self) -> ShardId {
        self.stream.shards()[0].id.clone()
    }

    /// Worker `id` running `Parallel::with_outputs` into the sink it was given.
    fn start_parallel(&self, id: &str) -> Running {
        let sink = self.sink.client(id);
        let handler = |r: Record| async move {
            Ok::<_, BoxError>(vec![MemoryWrite::add(r.position().to_string(), 1)])
        };
        let parallel = Parallel::with_outputs(Arc::new(sink.clone()), handler)
            .commit_interval(Duration::from_millis(200));
        let w = Worker::builder(self.stream.client(id), self.store.client(id))
            .id(id)
            .config(config())
            .positions(sink)
            .build_with(parallel)
            .unwrap();
        Running {
            shutdown: w.shutdown_handle(),
            task: tokio::spawn(self.store_faults.run_as(id, w.run())),
        }
    }

    fn fill(&self, n: usize) {
        for i in 0..n {
            self.stream
                .put(&format!("key-{}", i % 29), format!("record-{i}"));
        }
    }

    /// Records whose output is missing, and those counted other than once.
    fn off(&self) -> (usize, Vec<(String, i64)>) {
        let outputs = self.sink.outputs();
        let mut missing = 0;
        let mut twice = Vec::new();
        for r in self.stream.records(&self.shard()) {
            let k = r.position().to_string();
            match outputs.get(&k).map(|i| i.count) {
                None => missing += 1,
                Some(1) => {}
                Some(n) => twice.push((k, n)),
            }
        }
        (missing, twice)
    }

    /// Waits up to `limit` for every record's output; what is off then.
    async fn settle(&self, limit: Duration) -> (usize, Vec<(String, i64)>) {
        let end = Instant::now() + limit;
        while Instant::now() < end && self.off().0 > 0 {
            sleep(Duration::from_millis(50)).await;
        }
        self.off()
    }
}

async fn stop(r: Running) {
    r.shutdown.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(60), r.task).await;
}

/// The late opener of `a_sink_row_taken_by_a_late_opener_costs_a_restart_and_says_why`
/// (kcl-core/tests/positions.rs), under `Parallel::with_outputs`: the sink refuses the
/// holder's commits while its lease row is its own, which `Tenure::sink_refused` turns into
/// a retryable store error "the shard resumes from the sink's position when its processor
/// restarts". A sequential processor returns the error and restarts; the committer of
/// `Parallel::with_outputs` only logs "trying again" and commits the same way again, for
/// ever: nothing reopens the sink, and no record's output commits again.
#[tokio::test(start_paused = true)]
async fn parallel_outputs_recover_from_a_sink_row_naming_another_tenure() {
    let w = World::new();
    let shard = w.shard();
    let a = w.start_parallel("a");
    w.fill(20);
    assert_eq!(w.settle(Duration::from_secs(30)).await, (0, Vec::new()));
    let position = w.sink.rows()[&shard].position.clone();
    w.sink.insert_row(
        shard.clone(),
        PositionRow {
            owner: WorkerId::new("late"),
            fence: FencingToken(1),
            position,
        },
    );
    w.fill(20);
    let off = w.settle(Duration::from_secs(120)).await;
    let fenced_off = w.sink.fenced_off();
    let row = w.sink.rows()[&shard].clone();
    stop(a).await;
    println!("after 120 s: off {off:?}, commits fenced off {fenced_off}, row {row:?}");
    assert_eq!(
        off,
        (0, Vec::new()),
        "the shard's outputs commit again within two minutes (commits fenced off: \
         {fenced_off}, the row still names {}/{})",
        row.owner,
        row.fence.0
    );
}

/// A commit of `Parallel::with_outputs` applied by the sink whose every answer was lost
/// (six attempts, then `give_up`, which reads the lease row, not the sink's): the sink is
/// one commit ahead of the lease row and the tenure. The committer tries again later with
/// the records computed meanwhile as well, from the checkpoint before the applied commit: the
/// sink refuses it as ahead of its before, `sink_refused` makes it a store error, and so on
/// for ever (as above). Nothing was lost or doubled, but the shard stops committing.
#[tokio::test(start_paused = true)]
async fn parallel_outputs_recover_from_a_commit_applied_with_every_answer_lost() {
    let w = World::new();
    let a = w.start_parallel("a");
    w.fill(20);
    assert_eq!(w.settle(Duration::from_secs(30)).await, (0, Vec::new()));
    // Every sink commit applies and loses its answer for a while: the first applies, the
    // retries find it applied and lose their answers too, until the commit is given up.
    let applied = w.sink.applied_commits().len();
    w.sink_faults.set_ambiguous_rate(1.0);
    w.fill(10);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && w.sink.applied_commits().len() == applied {
        sleep(Duration::from_millis(10)).await;
    }
    assert!(w.sink.applied_commits().len() > applied, "a commit applied");
    // More records while its retries go on, so that the committer's next commit is not the
    // one that applied but one from the same checkpoint before, further.
    w.fill(10);
    // Long enough for its six attempts (about 2 s of backoff) to be given up.
    sleep(Duration::from_secs(5)).await;
    w.sink_faults.set_ambiguous_rate(0.0);
    let off = w.settle(Duration::from_secs(120)).await;
    let lease = w.store.leases().into_iter().find(|l| l.key == w.shard());
    let sink = w.sink.rows()[&w.shard()].position.clone();
    stop(a).await;
    println!(
        "after 120 s: off {off:?}, lease {:?}, sink {sink:?}",
        lease.map(|l| l.checkpoint)
    );
    assert_eq!(off, (0, Vec::new()), "the shard's outputs commit again");
}

/// A sink whose commits take `delay` (a Postgres transaction waiting on a row lock of the
/// application's, or 2,000 statements of a few milliseconds), well within `call_timeout`
/// (15 s) and `statement_timeout` (10 s).
#[derive(Clone)]
struct SlowSink {
    inner: MemoryPositionSink,
    delay: Duration,
}

impl kcl_core::outputs::Positions for SlowSink {
    async fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> Result<Option<kcl_core::Checkpoint>, kcl_core::BackendError> {
        kcl_core::outputs::Positions::open(&self.inner, shard, owner, fence).await
    }
}

impl kcl_core::outputs::Transact for SlowSink {
    type Write = MemoryWrite;

    fn limits(&self) -> kcl_core::outputs::Limits {
        self.inner.limits()
    }

    fn measure(&self, write: &MemoryWrite) -> kcl_core::outputs::Measure {
        self.inner.measure(write)
    }

    fn keeps_position(&self) -> bool {
        true
    }

    async fn commit(
        &self,
        commit: kcl_core::outputs::Commit<'_, MemoryWrite>,
    ) -> Result<(), kcl_core::outputs::CommitError> {
        sleep(self.delay).await;
        self.inner.commit(commit).await
    }
}

/// A commit into a sink that keeps positions runs behind the tenure's lock
/// (`Tenure::commit` holds `held` across `store.commit`), although its condition is the
/// sink's own row and not the lease row: the lease's renewals (DynamoDB) wait for the
/// Postgres transaction. A commit slower than the renewal slack (0.9 F − F/3: 3.6 s at a
/// failover time of 6 s, 5.7 s at the default 10 s) loses the lease every time, well within
/// `call_timeout` and `statement_timeout`; the shard is taken again, the sink opened again,
/// and the batch processed again.
#[tokio::test(start_paused = true)]
async fn a_slow_sink_commit_does_not_cost_the_lease() {
    let w = World::new();
    let slow = SlowSink {
        inner: w.sink.client("a"),
        delay: Duration::from_secs(5),
    };
    let outputs = slow.clone();
    let exact = move |_shard: &ShardId| SlowExact {
        sink: outputs.clone(),
    };
    let worker = Worker::builder(w.stream.client("a"), w.store.client("a"))
        .id("a")
        .config(config())
        .positions(slow)
        .build(exact)
        .unwrap();
    let a = Running {
        shutdown: worker.shutdown_handle(),
        task: tokio::spawn(w.store_faults.run_as("a", worker.run())),
    };
    for _ in 0..6 {
        w.fill(10);
        sleep(Duration::from_secs(10)).await;
    }
    let off = w.settle(Duration::from_secs(60)).await;
    let opens = w.sink.opens();
    let fence = w.sink.rows()[&w.shard()].fence;
    stop(a).await;
    println!("opens {opens}, fence now {}, off {off:?}", fence.0);
    assert_eq!(off, (0, Vec::new()));
    assert_eq!(
        opens, 1,
        "one worker, no fault: one tenure (fence now {})",
        fence.0
    );
}

/// Commits each batch's outputs into the sink, one `ADD 1` per record.
struct SlowExact {
    sink: SlowSink,
}

impl kcl_core::RecordProcessor for SlowExact {
    async fn process_records(
        &mut self,
        input: kcl_core::ProcessRecordsInput<'_>,
        cp: &mut kcl_core::Checkpointer,
    ) -> Result<(), BoxError> {
        let mut outputs = kcl_core::outputs::Outputs::new();
        for r in input.records() {
            outputs.push(r, MemoryWrite::add(r.position().to_string(), 1));
        }
        Ok(cp.commit_outputs(&self.sink, outputs).await?)
    }
}

/// The sink, cutting the lease store off from worker `a` for a second right after it
/// applied a commit of `SHARD_END`: the lease row's checkpoint cannot follow it.
#[derive(Clone)]
struct CutAfterShardEnd {
    inner: MemoryPositionSink,
    store_faults: Faults,
}

impl kcl_core::outputs::Positions for CutAfterShardEnd {
    async fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> Result<Option<kcl_core::Checkpoint>, kcl_core::BackendError> {
        kcl_core::outputs::Positions::open(&self.inner, shard, owner, fence).await
    }
}

impl kcl_core::outputs::Transact for CutAfterShardEnd {
    type Write = MemoryWrite;

    fn limits(&self) -> kcl_core::outputs::Limits {
        self.inner.limits()
    }

    fn measure(&self, write: &MemoryWrite) -> kcl_core::outputs::Measure {
        self.inner.measure(write)
    }

    fn keeps_position(&self) -> bool {
        true
    }

    async fn commit(
        &self,
        commit: kcl_core::outputs::Commit<'_, MemoryWrite>,
    ) -> Result<(), kcl_core::outputs::CommitError> {
        let end = commit.update.checkpoint == kcl_core::Checkpoint::ShardEnd;
        let result = self.inner.commit(commit).await;
        if end && result.is_ok() {
            self.store_faults.partition("a");
            let faults = self.store_faults.clone();
            tokio::spawn(async move {
                sleep(Duration::from_secs(1)).await;
                faults.heal("a");
            });
        }
        result
    }
}

/// Commits each batch's outputs, and `SHARD_END` in `shard_ended`, into the sink.
struct EndingExact {
    sink: CutAfterShardEnd,
}

impl kcl_core::RecordProcessor for EndingExact {
    async fn process_records(
        &mut self,
        input: kcl_core::ProcessRecordsInput<'_>,
        cp: &mut kcl_core::Checkpointer,
    ) -> Result<(), BoxError> {
        let mut outputs = kcl_core::outputs::Outputs::new();
        for r in input.records() {
            outputs.push(r, MemoryWrite::add(r.position().to_string(), 1));
        }
        Ok(cp.commit_outputs(&self.sink, outputs).await?)
    }

    async fn shard_ended(&mut self, cp: &mut kcl_core::Checkpointer) -> Result<(), BoxError> {
        Ok(cp
            .commit_outputs(&self.sink, kcl_core::outputs::Outputs::new())
            .await?)
    }
}

/// `SHARD_END` committed into the sink, the lease row's plain write after it failing: the
/// processor restarts (`ShardEndNotCheckpointed`), the open finds the sink ahead and
/// `forward` moves the lease up with `CheckpointUpdate::new(position)`, which carries no
/// child shard ids. The parent's row ends without its children, so the shard sync never
/// deletes it as done (`to_delete` wants them), only once the stream no longer lists the
/// shard; tools reading `childShardIds` (KCL Java in a shared table, kcl-admin) see none.
#[tokio::test(start_paused = true)]
async fn a_parent_ended_through_the_sink_keeps_its_children_on_the_lease_row() {
    let w = World::new();
    let parent = w.shard();
    let sink = CutAfterShardEnd {
        inner: w.sink.client("a"),
        store_faults: w.store_faults.clone(),
    };
    let outputs = sink.clone();
    let worker = Worker::builder(w.stream.client("a"), w.store.client("a"))
        .id("a")
        .config(config().shard_sync_interval(Duration::from_secs(1)))
        .positions(sink)
        .build(move |_shard: &ShardId| EndingExact {
            sink: outputs.clone(),
        })
        .unwrap();
    let a = Running {
        shutdown: worker.shutdown_handle(),
        task: tokio::spawn(w.store_faults.run_as("a", worker.run())),
    };
    w.fill(20);
    sleep(Duration::from_secs(5)).await;
    let children = w.stream.split(&parent).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let row = w.store.leases().into_iter().find(|l| l.key == parent);
        if row.as_ref().is_none_or(|r| r.is_finished()) || Instant::now() > end {
            break row;
        }
        sleep(Duration::from_millis(100)).await;
    };
    sleep(Duration::from_secs(10)).await;
    let later = w.store.leases().into_iter().find(|l| l.key == parent);
    stop(a).await;
    println!(
        "sink {:?}; parent row when finished: {:?}; 10 s later: {:?}",
        w.sink.rows().get(&parent).map(|r| r.position.clone()),
        row.as_ref()
            .map(|r| (r.checkpoint.clone(), r.child_shard_ids.clone())),
        later
            .as_ref()
            .map(|r| (r.checkpoint.clone(), r.child_shard_ids.clone()))
    );
    let row = row.expect("the parent's row");
    assert!(row.is_finished(), "the parent ended");
    let mut got = row.child_shard_ids;
    got.sort();
    let mut want = children.to_vec();
    want.sort();
    assert_eq!(got, want, "the parent's row names its children");
}

/// API misuse, `Parallel::with_outputs` over a lease store's `Transact` that is not the
/// worker's lease store (`PostgresLeaseStore` of another database or application while the
/// worker's leases are elsewhere): every commit finds no row of its tenure (`LeaseRow`), the
/// tenure reads its real row, at the commit's checkpoint before, and calls it `Behind`; the
/// committer takes `Behind` as "the row's checkpoint moved, go again", three rounds, then
/// `Ok(())`. Nothing commits, ever, and no error is logged or reported (`writes.failed` is
/// never told): the shard is at best "stalled".
#[tokio::test(start_paused = true)]
async fn parallel_outputs_into_another_lease_store_say_so() {
    let w = World::new();
    // Another database's lease table, made, without this fleet's rows.
    let other = MemoryLeaseStore::new();
    kcl_core::LeaseStore::ensure_table(&other, kcl_core::TableFeatures::default())
        .await
        .unwrap();
    let handler = |r: Record| async move {
        Ok::<_, BoxError>(vec![MemoryWrite::add(r.position().to_string(), 1)])
    };
    let parallel = Parallel::with_outputs(Arc::new(other.clone()), handler)
        .commit_interval(Duration::from_millis(200));
    let worker = Worker::builder(w.stream.client("a"), w.store.client("a"))
        .id("a")
        .config(config())
        .build_with(parallel)
        .unwrap();
    let status = worker.status();
    let a = Running {
        shutdown: worker.shutdown_handle(),
        task: tokio::spawn(w.store_faults.run_as("a", worker.run())),
    };
    w.fill(20);
    sleep(Duration::from_secs(120)).await;
    let refused = other.refused_commits().len();
    let applied = other.applied_commits().len();
    let problems = status.borrow().problems.clone();
    stop(a).await;
    println!(
        "in 120 s, commits into the other store: {applied} applied, {refused} refused; \
         problems reported: {problems:?}"
    );
    assert_eq!(applied, 0, "the misuse commits nothing");
    assert!(
        !problems.is_empty(),
        "{refused} commits refused in two minutes, none applied, and no problem reported"
    );
}
