//! `demo`: a small fleet on the in-memory backends, narrated.
//!
//! A producer writes numbered records to an 8-shard stream while three workers share it. The
//! demo prints the lease table whenever it changes, stops one worker gracefully (its leases
//! move at once), splits a shard (its children start once the parent is read to its end),
//! adds a worker (leases rebalance through handoffs), crashes one (its leases move after the
//! failover time), and ends with a ledger of every record: produced, processed, unique,
//! duplicates (at least once allows them) and lost (must be zero; the exit code says so).
//! `--endpoints` runs the same script on Kinesis and DynamoDB or their emulators
//! (`src/demo_aws.rs`).

#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpoint, Checkpointer, InitializationInput, Lease, LeaseStore,
    ProcessRecordsInput, RecordProcessor, ShardId, ShardSource, ShutdownHandle, Worker,
    WorkerConfig,
};
use kcl_example_consumer::{WindowCounter, WindowSink, WindowSummary};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;

/// Distinct partition keys the producer writes.
const PARTITION_KEYS: u64 = 64;
/// Window length of the demo's processors.
const WINDOW: Duration = Duration::from_secs(2);

/// Every record delivered, by the number the producer gave it.
#[derive(Debug, Default)]
struct Ledger {
    deliveries: Mutex<HashMap<u64, u32>>,
    by_worker: Mutex<BTreeMap<String, u64>>,
    windows: AtomicU64,
    window_records: AtomicU64,
    sample: Mutex<Option<WindowSummary>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts the windows the processors emit instead of printing them.
#[derive(Debug, Clone)]
struct LedgerSink(Arc<Ledger>);

impl WindowSink for LedgerSink {
    fn emit(&self, summary: &WindowSummary) -> Result<(), BoxError> {
        self.0.windows.fetch_add(1, Ordering::Relaxed);
        self.0
            .window_records
            .fetch_add(summary.records, Ordering::Relaxed);
        if summary.complete {
            lock(&self.0.sample).get_or_insert_with(|| summary.clone());
        }
        Ok(())
    }
}

/// The example's [`WindowCounter`], plus a note of every record it is handed.
#[derive(Debug)]
struct Audited {
    worker: String,
    ledger: Arc<Ledger>,
    inner: WindowCounter<LedgerSink>,
}

impl RecordProcessor for Audited {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        self.inner.initialize(input).await
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        {
            let mut deliveries = lock(&self.ledger.deliveries);
            for record in &input.records {
                if let Some(id) = record_id(&record.data) {
                    *deliveries.entry(id).or_default() += 1;
                }
            }
        }
        *lock(&self.ledger.by_worker)
            .entry(self.worker.clone())
            .or_default() += input.records.len() as u64;
        self.inner.process_records(input, checkpointer).await
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await;
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.inner.shard_ended(checkpointer).await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.inner.shutdown_requested(checkpointer).await
    }
}

/// Records are `<number> <json>`.
fn record_id(data: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(data).ok()?;
    text.split_once(' ')?.0.parse().ok()
}

/// What the demo needs from a stream and a lease table besides the worker's traits.
pub(crate) trait Backend: Send + Sync + 'static {
    type Source: ShardSource;
    type Store: LeaseStore;

    /// One sentence on what the demo runs on.
    fn describe(&self) -> String;
    /// The worker `name`'s handle on the stream.
    fn source(&self, name: &str) -> Self::Source;
    /// The worker `name`'s handle on the lease table.
    fn store(&self, name: &str) -> Self::Store;
    /// Writes `(partition key, data)` records.
    fn put(
        &self,
        records: Vec<(String, String)>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Splits an open shard; returns the parent and its children.
    fn split(&self) -> impl Future<Output = anyhow::Result<(ShardId, Vec<ShardId>)>> + Send;
    /// The lease table as it stands.
    fn leases(&self) -> impl Future<Output = anyhow::Result<Vec<Lease>>> + Send {
        let store = self.store("demo-observer");
        async move { Ok(store.list().await?) }
    }
    /// Records written after each lease's checkpoint, summed, if the backend can tell.
    fn not_checkpointed(&self) -> Option<usize> {
        None
    }
    /// Leases taken per worker, if the backend keeps a journal.
    fn takes(&self) -> Option<BTreeMap<String, usize>> {
        None
    }
}

/// The in-memory stream and lease table of kcl-core's `test-util` feature.
#[derive(Debug)]
struct Memory {
    stream: MemoryStream,
    store: MemoryLeaseStore,
}

impl Backend for Memory {
    type Source = MemoryStream;
    type Store = MemoryLeaseStore;

    fn describe(&self) -> String {
        format!(
            "in-memory stream of {} shards and lease table",
            self.stream.open_shards().len()
        )
    }

    fn source(&self, name: &str) -> MemoryStream {
        self.stream.client(name)
    }

    fn store(&self, name: &str) -> MemoryLeaseStore {
        self.store.client(name)
    }

    async fn put(&self, records: Vec<(String, String)>) -> anyhow::Result<()> {
        for (key, data) in records {
            self.stream.put(&key, data);
        }
        Ok(())
    }

    async fn split(&self) -> anyhow::Result<(ShardId, Vec<ShardId>)> {
        let parent = self
            .stream
            .open_shards()
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no open shard"))?;
        let children = self.stream.split(&parent).map_err(anyhow::Error::msg)?;
        Ok((parent, children.to_vec()))
    }

    async fn leases(&self) -> anyhow::Result<Vec<Lease>> {
        Ok(self.store.leases())
    }

    fn not_checkpointed(&self) -> Option<usize> {
        let mut behind = 0;
        for lease in self.store.leases() {
            let records = self.stream.records(&lease.key);
            behind += match &lease.checkpoint {
                Checkpoint::ShardEnd => 0,
                Checkpoint::Sequence(c) => records.iter().filter(|r| r.position() > *c).count(),
                _ => records.len(),
            };
        }
        Some(behind)
    }

    fn takes(&self) -> Option<BTreeMap<String, usize>> {
        let mut taken: BTreeMap<String, usize> = BTreeMap::new();
        for event in self.store.journal() {
            if let ("take", Some(owner)) = (event.operation, &event.lease.owner) {
                *taken.entry(owner.to_string()).or_default() += 1;
            }
        }
        Some(taken)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Running,
    Stopped,
    Crashed,
}

#[derive(Debug)]
struct Member {
    name: String,
    handle: ShutdownHandle,
    task: Option<JoinHandle<Result<(), kcl_core::Error>>>,
    fate: Fate,
    failed: Option<String>,
}

struct Fleet<B> {
    backend: Arc<B>,
    config: WorkerConfig,
    ledger: Arc<Ledger>,
    members: Vec<Member>,
}

impl<B: Backend> Fleet<B> {
    fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let ledger = self.ledger.clone();
        let worker_name = name.to_owned();
        let factory = move |shard: &ShardId| Audited {
            worker: worker_name.clone(),
            ledger: ledger.clone(),
            inner: WindowCounter::new(shard, WINDOW, 3, LedgerSink(ledger.clone())),
        };
        let worker = Worker::new(
            name,
            self.config.clone(),
            self.backend.source(name),
            self.backend.store(name),
            factory,
        )?;
        self.members.push(Member {
            name: name.to_owned(),
            handle: worker.shutdown_handle(),
            task: Some(tokio::spawn(worker.run())),
            fate: Fate::Running,
            failed: None,
        });
        Ok(())
    }

    fn member(&mut self, name: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.name == name)
    }

    /// Graceful stop; returns how long it took.
    async fn stop(&mut self, name: &str) -> Option<Duration> {
        let member = self.member(name)?;
        let started = Instant::now();
        member.handle.shutdown();
        let task = member.task.take()?;
        member.fate = Fate::Stopped;
        match timeout(Duration::from_secs(15), task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => member.failed = Some(format!("run failed: {e}")),
            Ok(Err(e)) => member.failed = Some(format!("task failed: {e}")),
            Err(_) => member.failed = Some("did not stop within 15s".to_owned()),
        }
        Some(started.elapsed())
    }

    /// Like a `kill -9`: the worker's tasks vanish without releasing anything.
    fn crash(&mut self, name: &str) {
        if let Some(member) = self.member(name) {
            if let Some(task) = member.task.take() {
                task.abort();
            }
            member.fate = Fate::Crashed;
        }
    }

    fn running(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.fate == Fate::Running)
            .map(|m| m.name.clone())
            .collect()
    }
}

/// `shardId-000000000012` → `12`.
fn short(shard: &ShardId) -> String {
    let s = shard.as_str();
    let digits = s.trim_start_matches("shardId-").trim_start_matches('0');
    if digits.is_empty() {
        "0".to_owned()
    } else {
        digits.to_owned()
    }
}

/// Owner → shards, for leases not finished yet.
fn distribution(leases: &[Lease]) -> BTreeMap<String, Vec<ShardId>> {
    let mut out: BTreeMap<String, Vec<ShardId>> = BTreeMap::new();
    for lease in leases {
        if lease.is_finished() {
            continue;
        }
        let owner = lease
            .owner
            .as_ref()
            .map_or_else(|| "(free)".to_owned(), ToString::to_string);
        out.entry(owner).or_default().push(lease.key.clone());
    }
    out
}

fn render(dist: &BTreeMap<String, Vec<ShardId>>) -> String {
    let mut line = String::new();
    for (owner, shards) in dist {
        if !line.is_empty() {
            line.push_str("  ");
        }
        let ids: Vec<String> = shards.iter().map(short).collect();
        let _ = write!(line, "{owner}[{}]", ids.join(" "));
    }
    line
}

struct Clock(Instant);

impl Clock {
    fn say(&self, message: &str) {
        println!("{:>6.1}s  {message}", self.0.elapsed().as_secs_f64());
    }
}

/// Runs the demo; the exit code is non-zero if a record was lost or a worker failed.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.shards >= 1,
        "invalid setting `shards`: must be at least 1"
    );
    anyhow::ensure!(
        args.workers >= 1,
        "invalid setting `workers`: must be at least 1"
    );
    anyhow::ensure!(args.rate >= 1, "invalid setting `rate`: must be at least 1");
    if args.endpoints {
        return endpoints(args).await;
    }
    let backend = Memory {
        stream: MemoryStream::new(args.shards),
        store: MemoryLeaseStore::new(),
    };
    run_on(args, Arc::new(backend)).await
}

#[cfg(feature = "aws")]
async fn endpoints(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let backend = Arc::new(crate::demo_aws::Endpoints::create(args.shards).await?);
    let result = run_on(args, backend.clone()).await;
    for problem in backend.delete().await {
        println!("cleanup: {problem}");
    }
    result
}

#[cfg(not(feature = "aws"))]
#[allow(clippy::unused_async, clippy::needless_pass_by_value)]
async fn endpoints(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("this build has no AWS backends: build with `--features aws`")
}

/// The demo's script, on any backend.
async fn run_on<B: Backend>(args: DemoArgs, backend: Arc<B>) -> anyhow::Result<ExitCode> {
    let config = WorkerConfig::default()
        .failover_time(args.failover_time)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(100))
        .parent_poll_interval(Duration::from_millis(200))
        .shard_sync_interval(Duration::from_secs(5))
        .shutdown_timeout(Duration::from_secs(5));
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid setting `{}`: {}", e.key, e.reason))?;

    let mut fleet = Fleet {
        backend: backend.clone(),
        config,
        ledger: Arc::new(Ledger::default()),
        members: Vec::new(),
    };
    let clock = Arc::new(Clock(Instant::now()));
    println!(
        "kcl demo: {}, {} workers, {} records/s, failover time {}",
        backend.describe(),
        args.workers,
        args.rate,
        humantime::format_duration(args.failover_time)
    );
    println!(
        "lease table lines show owner[shards]; (free) = nobody holds it. Worker logs: --log-filter info\n"
    );

    // The producer.
    let produced = Arc::new(AtomicU64::new(0));
    let stop_producing = CancellationToken::new();
    let producer = {
        let (backend, produced, stop, clock) = (
            backend.clone(),
            produced.clone(),
            stop_producing.clone(),
            clock.clone(),
        );
        let per_tick = u64::from(args.rate).div_ceil(50);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stop.is_cancelled() {
                tick.tick().await;
                let first = produced.load(Ordering::Relaxed);
                let batch = (first..first + per_tick)
                    .map(|id| {
                        let user = format!("user-{:02}", id % PARTITION_KEYS);
                        let data = format!("{id} {{\"user\":\"{user}\",\"amount\":{}}}", id % 100);
                        (user, data)
                    })
                    .collect();
                // Ids count as produced once written; a failed batch is written again.
                match backend.put(batch).await {
                    Ok(()) => {
                        produced.fetch_add(per_tick, Ordering::Relaxed);
                    }
                    Err(e) => clock.say(&format!("producer: put failed, retrying: {e:#}")),
                }
            }
        })
    };
    clock.say(&format!(
        "producer started: {} records/s over {PARTITION_KEYS} partition keys",
        args.rate
    ));

    // The lease table, printed whenever it changes.
    let watching = CancellationToken::new();
    let watcher = {
        let (backend, clock, stop) = (backend.clone(), clock.clone(), watching.clone());
        tokio::spawn(async move {
            let mut last = BTreeMap::new();
            while !stop.is_cancelled() {
                let now = match backend.leases().await {
                    Ok(leases) => distribution(&leases),
                    Err(_) => last.clone(),
                };
                if now != last {
                    clock.say(&format!("leases  {}", render(&now)));
                    last = now;
                }
                sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let names: Vec<String> = (1..=args.workers).map(|i| format!("worker-{i}")).collect();
    for name in &names {
        fleet.start(name)?;
    }
    clock.say(&format!("started {}", names.join(", ")));

    let at = |secs: f64| clock.0 + Duration::from_secs_f64(secs);

    // A graceful stop: leases are released and taken by the others at once.
    sleep_until(at(5.0)).await;
    let leaving = names.last().cloned().unwrap_or_default();
    let leases = backend.leases().await.unwrap_or_default();
    let held = distribution(&leases).get(&leaving).map_or(0, Vec::len);
    clock.say(&format!(
        "stopping {leaving} gracefully (it holds {held} leases): processors checkpoint, leases are released"
    ));
    if let Some(took) = fleet.stop(&leaving).await {
        clock.say(&format!("{leaving} stopped in {} ms", took.as_millis()));
    }

    // A split: the parent is read to its end, then its children start.
    sleep_until(at(8.0)).await;
    if !args.no_split {
        match backend.split().await {
            Ok((parent, children)) => clock.say(&format!(
                "split shard {} into {}: the children start once the parent is processed to its end",
                short(&parent),
                children.iter().map(short).collect::<Vec<_>>().join(" and ")
            )),
            Err(e) => clock.say(&format!("split failed: {e:#}")),
        }
    }

    // A new worker: leases rebalance through handoffs.
    sleep_until(at(10.0)).await;
    let joining = format!("worker-{}", args.workers + 1);
    fleet.start(&joining)?;
    clock.say(&format!(
        "started {joining}: it asks busier workers to hand leases over"
    ));

    // A crash: the leases stay owned until they expire after the failover time.
    sleep_until(at(14.0)).await;
    let victim = names.first().cloned().unwrap_or_default();
    if !args.no_crash && fleet.running().len() > 1 && fleet.running().contains(&victim) {
        fleet.crash(&victim);
        clock.say(&format!(
            "crashed {victim} (no release, no checkpoint): its leases move once they expire, after {}",
            humantime::format_duration(args.failover_time)
        ));
    }

    // Stop producing, let the fleet catch up.
    sleep_until(at(19.0)).await;
    stop_producing.cancel();
    let _ = producer.await;
    let total = produced.load(Ordering::Relaxed);
    clock.say(&format!(
        "producer stopped after {total} records; waiting for the fleet to catch up"
    ));
    let drain_deadline = Instant::now() + Duration::from_secs(8);
    let caught_up = loop {
        if lock(&fleet.ledger.deliveries).len() as u64 >= total {
            break true;
        }
        if Instant::now() >= drain_deadline {
            break false;
        }
        sleep(Duration::from_millis(100)).await;
    };
    if caught_up {
        clock.say("every record was delivered");
    } else {
        clock.say("gave up waiting after 8s");
    }

    let final_leases = distribution(&backend.leases().await.unwrap_or_default());
    for name in fleet.running() {
        fleet.stop(&name).await;
    }
    clock.say("stopped every worker");
    sleep(Duration::from_millis(150)).await;
    watching.cancel();
    let _ = watcher.await;

    Ok(summarize(&fleet, total, &final_leases, clock.0.elapsed()))
}

fn summarize<B: Backend>(
    fleet: &Fleet<B>,
    produced: u64,
    final_leases: &BTreeMap<String, Vec<ShardId>>,
    took: Duration,
) -> ExitCode {
    let deliveries = lock(&fleet.ledger.deliveries);
    let processed: u64 = deliveries.values().map(|&n| u64::from(n)).sum();
    let unique = deliveries.len() as u64;
    let lost = (0..produced)
        .filter(|id| !deliveries.contains_key(id))
        .count();
    let unexpected = deliveries.keys().filter(|&&id| id >= produced).count();
    drop(deliveries);

    // After a graceful stop every shard should be checkpointed at its last record.
    let behind = fleet.backend.not_checkpointed();
    let taken = fleet.backend.takes();
    let by_worker = lock(&fleet.ledger.by_worker).clone();

    println!("\nsummary after {:.1}s", took.as_secs_f64());
    println!("  records produced    {produced:>7}");
    println!("  records processed   {processed:>7}   (deliveries, re-deliveries included)");
    println!("  unique              {unique:>7}");
    println!(
        "  duplicates          {:>7}   (at least once: records after the last checkpoint of a crashed worker repeat)",
        processed - unique
    );
    println!("  lost                {lost:>7}");
    if unexpected > 0 {
        println!("  unexpected          {unexpected:>7}   (delivered but never produced)");
    }
    println!(
        "  windows emitted     {:>7}   ({} records counted in them)",
        fleet.ledger.windows.load(Ordering::Relaxed),
        fleet.ledger.window_records.load(Ordering::Relaxed)
    );
    if let Some(behind) = behind {
        println!("  not checkpointed    {behind:>7}   (records after the final checkpoints)");
    }
    println!();
    println!(
        "  {:<10} {:<9} {:>12} {:>11}   leases at the end",
        "worker", "fate", "leases taken", "records"
    );
    for m in &fleet.members {
        let fate = match (m.fate, &m.failed) {
            (_, Some(_)) => "FAILED",
            (Fate::Crashed, None) => "crashed",
            (Fate::Stopped | Fate::Running, None) => "stopped",
        };
        let leases = final_leases.get(&m.name).map_or_else(
            || "-".to_owned(),
            |s| {
                let ids: Vec<String> = s.iter().map(short).collect();
                format!("{} [{}]", s.len(), ids.join(" "))
            },
        );
        println!(
            "  {:<10} {:<9} {:>12} {:>11}   {leases}",
            m.name,
            fate,
            taken.as_ref().map_or_else(
                || "-".to_owned(),
                |t| t.get(&m.name).copied().unwrap_or(0).to_string()
            ),
            by_worker.get(&m.name).copied().unwrap_or(0)
        );
        if let Some(why) = &m.failed {
            println!("             {why}");
        }
    }
    let sample = lock(&fleet.ledger.sample)
        .as_ref()
        .and_then(|s| serde_json::to_string(s).ok());
    if let Some(line) = sample {
        println!("\n  a window line, as `run` prints them on stdout:\n  {line}");
    }
    let failed = fleet.members.iter().any(|m| m.failed.is_some());
    if lost == 0 && unexpected == 0 && !failed {
        println!("\nOK: no record lost");
        ExitCode::SUCCESS
    } else {
        println!(
            "\nFAILED: {lost} records lost, {unexpected} unexpected, worker failure: {failed}"
        );
        ExitCode::FAILURE
    }
}
