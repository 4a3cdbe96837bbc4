//! Exactly-once outputs into Postgres through real `Worker`s: kcl-core's in-memory stream,
//! and a processor that inserts one row per record with `Checkpointer::commit_outputs`
//! (into an output table without a key, so that a record written twice shows as two rows).
//!
//! - Leases elsewhere (kcl-core's in-memory lease store standing in for DynamoDB) and a
//!   `PostgresSink` per worker, given to the worker (`WorkerBuilder::positions`): every
//!   record's row once across a worker killed mid-stream and another taking over, and
//!   across a partition that makes a zombie of the first (its commit in flight reaches
//!   Postgres after the lease moved and the new holder opened the shard: refused).
//! - Leases in Postgres too (`PostgresLeaseStore` as the lease store and the outputs'
//!   store): a `COMMIT` whose answer is lost is retried by the core, refused on the lease row
//!   and read back as applied; the processor never sees an error.
//!
//! Real time (Postgres answers in real time): a failover time of 3 s.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryStream};
use kcl_core::outputs::Positions;
use kcl_core::outputs::{Outputs, Transact};
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    BoxError, Checkpointer, LeaseStore, LeaseStoreExtras, ProcessRecordsInput, RecordProcessor,
    ShardId, ShutdownHandle, Worker, WorkerConfig, WorkerId,
};
use kcl_postgres::{PostgresLeaseStore, PostgresSink, Sql};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use common::proxy::Proxy;

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(3))
        .taker_interval(Duration::from_millis(200))
        .idle_time_between_reads(Duration::from_millis(50))
        .max_records(10)
}

/// What the processors saw: the records handed to them, and their commits' errors.
#[derive(Debug, Default)]
struct Log {
    handed: BTreeSet<(String, String)>,
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Log>>;

/// Inserts one row per record (its shard, position and worker), committed with the batch's
/// checkpoint.
struct Inserting<T> {
    shard: ShardId,
    worker: String,
    outputs: T,
    insert: Arc<str>,
    log: Shared,
    /// How long each batch takes before its commit.
    work: Duration,
}

impl<T: Transact<Write = Sql>> Inserting<T> {
    async fn commit(
        &mut self,
        cp: &mut Checkpointer,
        outputs: Outputs<Sql>,
    ) -> Result<(), BoxError> {
        cp.commit_outputs(&self.outputs, outputs)
            .await
            .map_err(|e| {
                let error = format!("{}: {e}", self.worker);
                self.log.lock().unwrap().errors.push(error);
                e.into()
            })
    }
}

impl<T: Transact<Write = Sql>> RecordProcessor for Inserting<T> {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let mut outputs = Outputs::new();
        for r in input.records() {
            let record = (self.shard.to_string(), r.position().to_string());
            self.log.lock().unwrap().handed.insert(record);
            let write = Sql::new(self.insert.clone())
                .bind(self.shard.as_str().to_owned())
                .bind(r.position().to_string())
                .bind(self.worker.clone());
            outputs.push(r, write);
        }
        sleep(self.work).await;
        self.commit(cp, outputs).await
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        self.commit(cp, Outputs::new()).await
    }
}

struct Running {
    task: JoinHandle<Result<(), kcl_core::Error>>,
    shutdown: ShutdownHandle,
}

async fn stop(r: Running) {
    r.shutdown.shutdown();
    r.task.await.unwrap().unwrap();
}

/// A stream, an output table and an application of the test's own.
struct World {
    url: String,
    app: String,
    stream: MemoryStream,
    client: tokio_postgres::Client,
    table: String,
    log: Shared,
    /// The in-memory lease store's.
    faults: Faults,
    /// How long each batch takes before its commit.
    work: Duration,
}

impl World {
    async fn new(test: &str, shards: u32) -> Option<Self> {
        let url = common::url()?;
        let client = common::raw(&url).await;
        let table = common::unique("out");
        let create = format!("CREATE TABLE {table} (shard text, seq text, worker text)");
        client.batch_execute(&create).await.unwrap();
        Some(Self {
            app: common::unique(test),
            url,
            stream: MemoryStream::new(shards),
            client,
            table,
            log: Shared::default(),
            faults: Faults::seeded(52),
            work: Duration::ZERO,
        })
    }

    /// The in-memory lease store (DynamoDB's stand-in), through the world's faults.
    fn leases(&self) -> MemoryLeaseStore {
        MemoryLeaseStore::with_faults(self.faults.clone())
    }

    /// A sink for worker `id` (a process of its own: a pool of its own), on `url`.
    async fn sink(&self, url: &str) -> PostgresSink {
        PostgresSink::connect(url, &self.app).await.unwrap()
    }

    /// Worker `id` on `leases`, its processors committing into `outputs` (and fencing it, if
    /// it is a sink).
    fn start<L, T>(&self, id: &str, leases: L, outputs: T, sink: Option<PostgresSink>) -> Running
    where
        L: LeaseStore + LeaseStoreExtras + 'static,
        T: Transact<Write = Sql> + Clone,
    {
        let stream: MemoryStream = self.stream.client(id);
        let mut builder = Worker::builder(stream, leases).id(id).config(config());
        if let Some(sink) = sink {
            builder = builder.positions(sink);
        }
        let (worker, log, work) = (id.to_owned(), self.log.clone(), self.work);
        let insert: Arc<str> = format!(
            "INSERT INTO {} (shard, seq, worker) VALUES ($1, $2, $3)",
            self.table
        )
        .into();
        let w = builder
            .build(move |shard: &ShardId| Inserting {
                shard: shard.clone(),
                worker: worker.clone(),
                outputs: outputs.clone(),
                insert: insert.clone(),
                log: log.clone(),
                work,
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

    /// Every record, as (shard, position).
    fn expected(&self) -> BTreeSet<(String, String)> {
        let shards = self.stream.shards();
        let records = shards.iter().flat_map(|s| {
            let records = self.stream.records(&s.id).into_iter();
            records.map(|r| (s.id.to_string(), r.position().to_string()))
        });
        records.collect()
    }

    /// The rows written, counted by (shard, position).
    async fn written(&self) -> BTreeMap<(String, String), i64> {
        let sql = format!(
            "SELECT shard, seq, count(*) FROM {} GROUP BY shard, seq",
            self.table
        );
        let rows = self.client.query(&sql, &[]).await.unwrap();
        rows.iter()
            .map(|r| ((r.get(0), r.get(1)), r.get(2)))
            .collect()
    }

    /// Records whose row is missing, and those written more than once.
    async fn off(&self) -> (usize, Vec<((String, String), i64)>) {
        let written = self.written().await;
        let expected = self.expected();
        let missing = expected
            .iter()
            .filter(|k| !written.contains_key(*k))
            .count();
        let twice = written.into_iter().filter(|(_, n)| *n != 1).collect();
        (missing, twice)
    }

    /// Waits (up to 60 s) until every record's row is written; then none may be missing or
    /// twice, and none may be no record's.
    async fn exactly_once(&self) {
        let limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < limit && self.off().await.0 > 0 {
            sleep(Duration::from_millis(100)).await;
        }
        let (missing, twice) = self.off().await;
        assert!(!self.expected().is_empty());
        assert_eq!((missing, twice), (0, Vec::new()), "every record's row once");
        let strays = self.written().await.len() - self.expected().len();
        assert_eq!(strays, 0, "rows of no record");
    }

    /// Shard positions in `kcl_positions`, by shard.
    async fn positions(&self) -> BTreeMap<String, (String, String, i64)> {
        let sql = "SELECT lease_key, owner, checkpoint, checkpoint_sub FROM kcl_positions \
                   WHERE application = $1";
        let rows = self.client.query(sql, &[&self.app]).await.unwrap();
        let row = |r: &tokio_postgres::Row| {
            let checkpoint: Option<String> = r.get(2);
            (r.get(1), checkpoint.unwrap_or_default(), r.get(3))
        };
        rows.iter().map(|r| (r.get(0), row(r))).collect()
    }

    fn errors(&self) -> Vec<String> {
        self.log.lock().unwrap().errors.clone()
    }

    /// Records handed to a processor whose row is not written.
    async fn handed_unwritten(&self) -> usize {
        let written = self.written().await;
        let log = self.log.lock().unwrap();
        log.handed
            .iter()
            .filter(|k| !written.contains_key(*k))
            .count()
    }
}

/// Polls `done` every 50 ms for up to `limit`.
async fn until<F: std::future::Future<Output = bool>>(
    limit: Duration,
    mut done: impl FnMut() -> F,
) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done().await {
            return true;
        }
        sleep(Duration::from_millis(50)).await;
    }
    done().await
}

#[tokio::test]
async fn a_worker_killed_mid_stream_and_another_taking_over_write_every_row_once() {
    let Some(mut w) = World::new("sink_kill", 4).await else {
        return;
    };
    w.work = Duration::from_millis(30);
    let leases = w.leases();
    let sink_a = w.sink(&w.url).await;
    let a = w.start("a", leases.client("a"), sink_a.clone(), Some(sink_a));
    for _ in 0..10 {
        w.fill(20);
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        until(Duration::from_secs(10), || async {
            w.written().await.len() > 50
        })
        .await
    );
    // Killed with records handed and not committed.
    w.fill(60);
    sleep(Duration::from_millis(50)).await;
    a.task.abort();
    let _ = a.task.await;
    let (uncommitted, twice) = w.off().await;
    assert!(twice.is_empty(), "in step at the kill: {twice:?}");
    let redo = w.handed_unwritten().await;
    assert!(redo > 0, "the kill left records handed and not committed");
    let sink_b = w.sink(&w.url).await;
    let b = w.start(
        "b",
        leases.client("b"),
        sink_b.clone(),
        Some(sink_b.clone()),
    );
    w.fill(100);
    w.exactly_once().await;
    stop(b).await;
    println!("left to b at the kill: {uncommitted} of 260 records, {redo} of them handed to a");
    let positions = w.positions().await;
    let held: Vec<_> = leases
        .leases()
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key))
        .collect();
    assert_eq!(held.len(), 4);
    for lease in held {
        let (owner, checkpoint, _) = &positions[lease.key.as_str()];
        assert_eq!(owner, "b", "b fenced {}", lease.key);
        assert_eq!(
            checkpoint,
            lease.checkpoint.as_str(),
            "the lease followed the sink"
        );
    }
    assert_eq!(sink_b.fenced_off(), 0);
}

/// The lease moves under a holder that still believes it holds it (an operator's forced
/// take, `kcl-admin`'s reset or release, while the holder's renewal is not due): the new
/// tenure opens the shard in the sink, and the old holder's commit in flight reaches
/// Postgres after it.
#[tokio::test]
async fn a_commit_of_a_holder_whose_lease_moved_under_it_is_refused_by_the_sink() {
    let Some(w) = World::new("sink_zombie", 1).await else {
        return;
    };
    let leases = w.leases();
    let proxy = Proxy::start(&w.url).await;
    let sink_a = w.sink(&proxy.url(&w.url)).await;
    let a = w.start(
        "a",
        leases.client("a"),
        sink_a.clone(),
        Some(sink_a.clone()),
    );
    w.fill(20);
    w.exactly_once().await;
    // a's next commit is held on its way to Postgres.
    proxy.freeze();
    w.fill(10);
    assert!(until(Duration::from_secs(5), || async { proxy.held() > 0 }).await);
    // Meanwhile the lease is taken for b and b's tenure opens the shard in the sink.
    let shard = w.stream.shards()[0].id.clone();
    let operator = leases.client("operator");
    let row = operator.get(&shard).await.unwrap().unwrap();
    let taken = operator.take(&row, &WorkerId::new("b")).await.unwrap();
    let sink_b = w.sink(&w.url).await;
    let fence = taken.fence.unwrap();
    sink_b
        .open(&shard, &WorkerId::new("b"), fence)
        .await
        .unwrap();
    proxy.thaw();
    assert!(
        until(Duration::from_secs(10), || async {
            sink_a.fenced_off() > 0
        })
        .await
    );
    // b, started, adopts the lease and redoes what a did not commit.
    let b = w.start("b", leases.client("b"), sink_b.clone(), Some(sink_b));
    w.fill(20);
    w.exactly_once().await;
    stop(b).await;
    stop(a).await;
    println!("zombie transactions refused: {}", sink_a.fenced_off());
    let errors = w.errors();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("a: ") && e.contains("lost")),
        "a learned it lost the lease: {errors:?}"
    );
}

#[tokio::test]
async fn a_lost_commit_answer_with_leases_in_postgres_is_read_back_as_applied() {
    let Some(w) = World::new("lost_answer", 2).await else {
        return;
    };
    let proxy = Proxy::start(&w.url).await;
    let store = PostgresLeaseStore::connect(&proxy.url(&w.url), &w.app)
        .await
        .unwrap();
    let a = w.start("a", store.clone(), store.clone(), None);
    w.fill(20);
    w.exactly_once().await;
    for _ in 0..3 {
        proxy.lose_next_commit_answer();
        let cut = proxy.commits_cut();
        w.fill(10);
        assert!(
            until(Duration::from_secs(10), || async {
                proxy.commits_cut() > cut
            })
            .await
        );
    }
    w.fill(20);
    w.exactly_once().await;
    stop(a).await;
    assert_eq!(proxy.commits_cut(), 3, "three answers lost");
    assert_eq!(
        w.errors(),
        Vec::<String>::new(),
        "every lost answer read back as applied"
    );
    for lease in store.list().await.unwrap() {
        if !is_coordination_key(&lease.key) {
            let last = w.stream.records(&lease.key).last().unwrap().position();
            assert_eq!(lease.checkpoint.as_str(), last.sequence.as_str());
        }
    }
}
