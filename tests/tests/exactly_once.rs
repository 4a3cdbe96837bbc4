//! Exactly-once outputs under chaos, with real worker processes on the emulators.
//!
//! Four `kcl-test-worker` processes consume a stream of 4 shards while a producer writes
//! numbered records throughout. Each worker writes every record's output twice (see the
//! worker's `outputs` module): into the outputs table through
//! `Checkpointer::commit_outputs`, in the transaction of the batch's checkpoint, conditioned
//! on the lease (exactly once); and into the plain table with an `UpdateItem` before the
//! checkpoint, as a consumer without transactions does (at least once). Each batch then
//! "works" 250 ms on its thread before it commits, so that a process frozen there goes on to
//! commit when it thaws, as a zombie does.
//!
//! A seeded schedule runs, each at least once and in a seeded order, then drawn at random
//! until the chaos time is up:
//! - **freeze**: SIGSTOP a worker while a batch of it is working (its journal shows a `work`
//!   line without its outcome), keep it frozen past the failover time and until every lease
//!   it held is another's, then SIGCONT: the thawed zombie commits and must be refused
//!   (`commit_refused`, counted; at least one per such freeze);
//! - **kill**: SIGKILL a worker, preferably while a batch works (plain writes done, commit
//!   not), and start it again under the same id 1-3 s later;
//! - **kill the leader** (the worker holding the leader row; a random one under
//!   every-worker coordination), the same way;
//! - **restart**: SIGTERM a worker (graceful shutdown), and start it again;
//! - **split** the widest open shard, and later **merge** two adjacent open shards.
//!
//! Then every worker runs, the producer stops, and the outputs table must hold every record
//! of the stream (read back from every shard, closed ones included) exactly once: `n == 1`
//! for each, none missing, none extra. The plain table's duplicates (`n >= 2`) are what the
//! same run would have written without transactions; they are reported, not judged.
//!
//! On the emulators, this needs moto's transactions serializable and as cheap at 10,000
//! outputs as at 10, which `localstack/emulator` gives them (`localstack/moto_serial.py`; a moto
//! server started before that change must be restarted): moto's own can apply a transaction
//! twice when another races it, the very duplicate this test looks for.
//!
//! The same chaos runs three ways: outputs into DynamoDB with the lease row (the first
//! test); into Postgres tables with the leases in DynamoDB, where each commit is fenced by
//! the shard's `kcl_positions` row (`PostgresSink`, which the worker fences on every open);
//! and into Postgres with the leases in Postgres too, each commit fenced by the lease row
//! in the same transaction. The three run one after another (they share the two cores).
//!
//! Runtime: one seed, 25 s of chaos (the schedule's first steps, each step once, run in full
//! whatever the time), 40-60 s in all. For the long version:
//! `KCL_CHAOS_SEEDS=1,2,3` (a list) or `KCL_CHAOS_SEEDS=5` (seeds 1 to 5), and
//! `KCL_CHAOS_SECS=300` for the chaos time per seed, e.g.
//! `KCL_CHAOS_SEEDS=5 KCL_CHAOS_SECS=300 cargo test -p kcl-integration-tests --test exactly_once -- --nocapture`.
//! Each seed prints one `exactly-once seed …` line with its counts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use aws_sdk_dynamodb::types::{AttributeValue, TableStatus};
use kcl_aws::KinesisShardSource;
use kcl_core::{ShardId, ShardSource};
use kcl_integration_tests::leases::postgres_url;
use kcl_integration_tests::{Context, WorkerProcess, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const WORKERS: usize = 4;
const SHARDS: i32 = 4;
const FAILOVER_MS: u64 = 3000;
const LEADER_ROW: &str = "kcl-coordination/worker-leader";

/// Where the outputs commit, and with which row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outputs {
    /// DynamoDB tables, with the lease row in DynamoDB.
    DynamoDb,
    /// Postgres tables, with the shard's `kcl_positions` row; leases in DynamoDB.
    PostgresSink,
    /// Postgres tables, with the lease row in the same database.
    PostgresLeases,
}

/// One chaos test at a time: each runs five processes on the two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_commit_exactly_once_under_chaos() -> anyhow::Result<()> {
    chaos(Outputs::DynamoDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_commit_exactly_once_into_postgres_with_leases_in_dynamodb() -> anyhow::Result<()> {
    chaos(Outputs::PostgresSink).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_commit_exactly_once_into_postgres_with_leases_in_postgres() -> anyhow::Result<()> {
    chaos(Outputs::PostgresLeases).await
}

async fn chaos(outputs: Outputs) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let secs = std::env::var("KCL_CHAOS_SECS")
        .ok()
        .map(|s| s.parse::<u64>().context("KCL_CHAOS_SECS"))
        .transpose()?
        .unwrap_or(25);
    for seed in seeds()? {
        let name = format!("exactly-once-{outputs:?}-s{seed}").to_lowercase();
        let ctx = match outputs {
            Outputs::PostgresLeases => Context::new_postgres(&name).await?,
            Outputs::DynamoDb | Outputs::PostgresSink => Context::new(&name).await?,
        };
        let Some(ctx) = ctx else {
            return Ok(());
        };
        let tables = match outputs {
            Outputs::DynamoDb => Tables::dynamodb(&ctx).await?,
            Outputs::PostgresSink | Outputs::PostgresLeases => {
                let Some(url) = postgres_url()? else {
                    return Ok(());
                };
                Tables::postgres(&url).await?
            }
        };
        let limit = Duration::from_secs(secs + 240);
        let run = run(ctx, tables, seed, Duration::from_secs(secs));
        with_timeout(limit, Box::pin(run)).await?;
    }
    Ok(())
}

/// `KCL_CHAOS_SEEDS`: a list (`1,2,7`) or a count (`5`: seeds 1 to 5); seed 1 by default.
fn seeds() -> anyhow::Result<Vec<u64>> {
    let Ok(given) = std::env::var("KCL_CHAOS_SEEDS") else {
        return Ok(vec![1]);
    };
    let list: Vec<u64> = given
        .split(',')
        .map(|s| s.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .context("KCL_CHAOS_SEEDS: a list of seeds or a count")?;
    Ok(match list.as_slice() {
        [count] if !given.contains(',') => (1..=*count).collect(),
        _ => list,
    })
}

/// splitmix64: the schedule's randomness, from the seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % (n.max(1) as u64)).unwrap_or(0)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.next() % (to - from).max(1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Freeze,
    Kill,
    KillLeader,
    Restart,
    Split,
    Merge,
}

/// Every step once in a seeded order (split before merge), then random ones (no more
/// reshards) until `chaos` is up; [`run`] stops drawing when the time is.
fn first_steps(rng: &mut Rng) -> Vec<Step> {
    let mut steps = vec![Step::Freeze, Step::Kill, Step::KillLeader, Step::Restart];
    for i in (1..steps.len()).rev() {
        steps.swap(i, rng.below(i + 1));
    }
    let split_at = rng.below(steps.len() + 1);
    steps.insert(split_at, Step::Split);
    let merge_at = split_at + 1 + rng.below(steps.len() - split_at);
    steps.insert(merge_at, Step::Merge);
    steps
}

/// What a seed's run counted.
#[derive(Debug, Default)]
struct Tally {
    steps: Vec<String>,
    /// Freezes that caught a batch at work, and the commits refused after each thaw.
    thaws: Vec<usize>,
}

/// The test's fleet: a process per id, restarted under the same id.
struct Fleet {
    ctx: Context,
    args: Vec<String>,
    workers: Vec<WorkerProcess>,
    /// With the outputs in Postgres and the leases in DynamoDB: the sink's database, whose
    /// `kcl_positions` rows say which tenure opened each shard last.
    sink: Option<Arc<tokio_postgres::Client>>,
}

impl Fleet {
    fn spawn(&self, id: &str) -> anyhow::Result<WorkerProcess> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        WorkerProcess::spawn(WORKER, &self.ctx, id, &args)
    }

    fn logs(&self) -> String {
        (self.workers.iter())
            .map(|w| format!("--- {}\n{}", w.id, w.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

async fn run(ctx: Context, tables: Tables, seed: u64, chaos: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut rng = Rng(seed);
    ctx.create_stream(SHARDS).await?;
    let (exact, plain) = (tables.exact.clone(), tables.plain.clone());
    let mut args: Vec<String> = [
        "--failover-ms",
        &FAILOVER_MS.to_string(),
        "--taker-ms",
        "500",
        "--idle-ms",
        "200",
        "--shard-sync-ms",
        "1000",
        "--max-records",
        "40",
        "--max-steal",
        "2",
        "--work-ms",
        "250",
        "--outputs-table",
        &exact,
        "--plain-table",
        &plain,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(pg) = &tables.postgres {
        args.extend(["--outputs-postgres".to_owned(), pg.url.clone()]);
    }
    let sink = match (&tables.postgres, ctx.postgres()) {
        (Some(pg), None) => Some(pg.client.clone()),
        _ => None,
    };
    let mut fleet = Fleet {
        ctx: ctx.clone(),
        args,
        workers: Vec::new(),
        sink,
    };
    for i in 0..WORKERS {
        let worker = fleet.spawn(&format!("w{i}"))?;
        fleet.workers.push(worker);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(&ctx, stop.clone());
    wait_until(
        "every shard held and committing",
        Duration::from_secs(60),
        Duration::from_millis(250),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            let held = owners.len() == SHARDS as usize && owners.values().all(Option::is_some);
            Ok(held && committed_shards(&fleet)? == SHARDS as usize)
        },
    )
    .await
    .map_err(|e| e.context(fleet.logs()))?;

    let mut tally = Tally::default();
    let chaos_start = Instant::now();
    let mut steps = first_steps(&mut rng).into_iter();
    loop {
        let step = match steps.next() {
            Some(step) => step,
            None if chaos_start.elapsed() < chaos => {
                [Step::Freeze, Step::Kill, Step::KillLeader, Step::Restart][rng.below(4)]
            }
            None => break,
        };
        tokio::time::sleep(rng.millis(1000, 3000)).await;
        let done = act(&mut fleet, &mut rng, step, &mut tally)
            .await
            .map_err(|e| e.context(format!("step {step:?}\n{}", fleet.logs())))?;
        tally.steps.push(done);
    }
    let chaos_took = chaos_start.elapsed();
    stop.store(true, Ordering::SeqCst);
    let produced = producer.await??;
    let drain = Instant::now();
    let verdict = verify(&ctx, &fleet, &tables, &produced).await;
    let drained = drain.elapsed();
    for worker in &mut fleet.workers {
        let _ = worker.terminate();
    }
    for worker in &mut fleet.workers {
        let _ = worker.wait_exit(Duration::from_secs(20)).await;
    }
    let counts = verdict.map_err(|e| e.context(fleet.logs()))?;
    let refused = refused_total(&fleet)?;
    eprintln!(
        "exactly-once seed {seed}, outputs in {}: produced {} records ({} in the stream), outputs table: {} \
         items, {} missing, {} extra, {} with n != 1; plain table: {} records written twice \
         or more ({} extra writes); zombie commits refused: {refused} in all, {:?} after the \
         thaws of the freezes that caught a batch at work; {} steps in {:.0?} of chaos: {:?}; \
         drained in {drained:.0?}; {:.0?} in all",
        tables.describe(&ctx),
        produced.len(),
        counts.stream,
        counts.exact_items,
        counts.missing,
        counts.extra,
        counts.not_one,
        counts.plain_duplicates,
        counts.plain_extra,
        tally.thaws,
        tally.steps.len(),
        chaos_took,
        tally.steps,
        started.elapsed(),
    );
    ensure!(
        !tally.thaws.is_empty(),
        "no freeze caught a batch at work: {:?}",
        tally.steps
    );
    ensure!(
        tally.thaws.iter().all(|&n| n > 0),
        "a zombie thawed with a batch at work and no commit of it was refused: {:?}",
        tally.thaws
    );
    Ok(())
}

/// Writes `eo-<n>` records, 10 every 200 ms over 32 partition keys, one PutRecord each,
/// retried while resharding refuses it; returns the payloads written.
fn produce(
    ctx: &Context,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<String>>> {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut n = 0usize;
        while !stop.load(Ordering::SeqCst) {
            for _ in 0..10 {
                let (pk, data) = (format!("pk-{}", n % 32), format!("eo-{n}"));
                ctx.put_retried(&pk, &data).await?;
                written.push(data);
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(written)
    })
}

/// An on-demand table keyed by `id` (S), ACTIVE.
async fn create_table(ctx: &Context, table: &str) -> anyhow::Result<()> {
    kcl_integration_tests::items::create(ctx, table, false)
        .await
        .with_context(|| format!("CreateTable {table}"))?;
    wait_until(
        "the table to be ACTIVE",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let out = ctx
                .dynamodb
                .describe_table()
                .table_name(table)
                .send()
                .await?;
            Ok(out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active))
        },
    )
    .await?;
    Ok(())
}

/// One step of the schedule; what was done, in a few words.
async fn act(
    fleet: &mut Fleet,
    rng: &mut Rng,
    step: Step,
    tally: &mut Tally,
) -> anyhow::Result<String> {
    match step {
        Step::Freeze => freeze(fleet, rng, tally).await,
        Step::Kill => {
            let i = rng.below(fleet.workers.len());
            kill(fleet, rng, i).await
        }
        Step::KillLeader => {
            let leader = leader(&fleet.ctx).await?;
            let i = (fleet.workers.iter())
                .position(|w| Some(&w.id) == leader.as_ref())
                .unwrap_or_else(|| rng.below(fleet.workers.len()));
            Ok(format!("leader {}", kill(fleet, rng, i).await?))
        }
        Step::Restart => {
            let i = rng.below(fleet.workers.len());
            let id = fleet.workers[i].id.clone();
            fleet.workers[i].terminate()?;
            let status = fleet.workers[i].wait_exit(Duration::from_secs(30)).await?;
            ensure!(status.success(), "{id} exited with {status} after SIGTERM");
            tokio::time::sleep(rng.millis(0, 2000)).await;
            fleet.workers[i] = fleet.spawn(&id)?;
            Ok(format!("SIGTERM {id}"))
        }
        Step::Split => split(&fleet.ctx).await,
        Step::Merge => merge(&fleet.ctx).await,
    }
}

/// SIGKILL worker `i`, at a batch's work if one comes within 5 s, and start it again 1-3 s
/// later under the same id.
async fn kill(fleet: &mut Fleet, rng: &mut Rng, i: usize) -> anyhow::Result<String> {
    let at_work = wait_at_work(&fleet.workers[i], Duration::from_secs(5)).await?;
    let id = fleet.workers[i].id.clone();
    fleet.workers[i].kill()?;
    tokio::time::sleep(rng.millis(1000, 3000)).await;
    fleet.workers[i] = fleet.spawn(&id)?;
    Ok(format!(
        "SIGKILL {id}{}",
        if at_work { " at work" } else { "" }
    ))
}

/// SIGSTOP a worker with a batch at work, until its leases are all another's, then SIGCONT;
/// counts the commits refused after the thaw. A worker with no batch at work within 5 s is
/// passed over for another.
async fn freeze(fleet: &mut Fleet, rng: &mut Rng, tally: &mut Tally) -> anyhow::Result<String> {
    let first = rng.below(fleet.workers.len());
    for k in 0..fleet.workers.len() {
        let worker = &fleet.workers[(first + k) % fleet.workers.len()];
        if !wait_at_work(worker, Duration::from_secs(5)).await? {
            continue;
        }
        let id = worker.id.clone();
        let owners = fleet.ctx.owners().await?;
        let held: Vec<String> = (owners.into_iter())
            .filter(|(_, owner)| owner.as_ref() == Some(&id))
            .map(|(shard, _)| shard)
            .collect();
        let since = last_work(worker)?;
        signal(worker, "STOP")?;
        let frozen = Instant::now();
        // Past the failover time, and until its leases are all another's.
        tokio::time::sleep(Duration::from_millis(FAILOVER_MS + 1000)).await;
        wait_until(
            "the frozen worker's leases to be another's",
            Duration::from_secs(60),
            Duration::from_millis(200),
            async || {
                let owners = fleet.ctx.owners().await?;
                Ok(owners.values().all(|o| o.as_ref() != Some(&id)))
            },
        )
        .await?;
        if let Some(sink) = &fleet.sink {
            opened_by_others(&fleet.ctx, sink, &id, &held).await?;
        }
        let thawed = chrono::Utc::now().timestamp_millis();
        signal(worker, "CONT")?;
        let held = frozen.elapsed();
        let refused = wait_until(
            "the thawed zombie's commit to be refused",
            Duration::from_secs(15),
            Duration::from_millis(100),
            async || Ok(refused_since(worker, thawed)? > 0 || in_flight(worker, since, thawed)?),
        )
        .await
        .is_ok();
        if refused_since(worker, thawed)? == 0 && in_flight(worker, since, thawed)? {
            // The signal landed after the stretch ended: the commit was under way, sent
            // before the freeze, no zombie's. Another freeze.
            continue;
        }
        let count = refused_since(worker, thawed)?;
        tally.thaws.push(count);
        ensure!(
            refused,
            "{id} thawed with a batch at work and no commit refused:\n{}",
            worker.log_tail()
        );
        return Ok(format!("SIGSTOP {id} {held:.1?}: {count} refused"));
    }
    Ok("SIGSTOP: no batch at work".to_owned())
}

/// Waits until the next tenures of the shards `frozen` held have opened them, fencing the
/// sink's rows: a sink is fenced when a processor opens, not when its lease is taken, and a
/// zombie's commit between the two lands (the next tenure then resumes after it), so only
/// from then on must it be refused. A finished shard is not opened again.
async fn opened_by_others(
    ctx: &Context,
    sink: &tokio_postgres::Client,
    frozen: &str,
    held: &[String],
) -> anyhow::Result<()> {
    wait_until(
        "the frozen worker's shards opened by their next tenures",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let finished: BTreeSet<String> = (ctx.list().await?.into_iter())
                .filter(|l| l.checkpoint == kcl_core::Checkpoint::ShardEnd)
                .map(|l| l.key.as_str().to_owned())
                .collect();
            let query = "SELECT lease_key FROM kcl_positions WHERE application = $1 AND owner = $2";
            let rows = sink.query(query, &[&ctx.table, &frozen]).await?;
            let still: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            Ok(!held
                .iter()
                .any(|s| still.contains(s) && !finished.contains(s)))
        },
    )
    .await
    .map(drop)
}

fn signal(worker: &WorkerProcess, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), worker.pid().to_string()])
        .status()?;
    ensure!(status.success(), "kill -{name} {} failed", worker.pid());
    Ok(())
}

/// The journal lines of the worker's current process (after its last `started` line).
fn current_lines(worker: &WorkerProcess) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(&worker.journal).unwrap_or_default();
    let from = text.rfind("\"event\":\"started\"").unwrap_or(0);
    let wanted = [
        "\"work\"",
        "\"worked\"",
        "\"committed\"",
        "\"commit_refused\"",
        "\"commit_failed\"",
    ];
    Ok(text[from..]
        .lines()
        .filter(|l| wanted.iter().any(|w| l.contains(w)))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Whether a batch of the worker is at work: a `work` line of a shard, last of its lines
/// (`worked` ends the stretch: the commit is under way).
fn at_work(worker: &WorkerProcess) -> anyhow::Result<bool> {
    let mut last: BTreeMap<String, bool> = BTreeMap::new();
    for line in current_lines(worker)? {
        let shard = line["shard"].as_str().unwrap_or_default().to_owned();
        last.insert(shard, line["event"] == "work");
    }
    Ok(last.values().any(|&working| working))
}

/// Whether the stretch at work when the worker was frozen (its `work` line at `since`) had
/// ended before `thawed`: the freeze came after it, while its commit was under way (sent
/// before the freeze), so no zombie's commit is to be refused.
fn in_flight(worker: &WorkerProcess, since: i64, thawed: i64) -> anyhow::Result<bool> {
    Ok(current_lines(worker)?.iter().any(|l| {
        let ms = l["ms"].as_i64().unwrap_or(0);
        l["event"] == "worked" && ms >= since && ms < thawed
    }))
}

/// The time of the worker's last `work` line.
fn last_work(worker: &WorkerProcess) -> anyhow::Result<i64> {
    let lines = current_lines(worker)?;
    let last = lines.iter().rev().find(|l| l["event"] == "work");
    Ok(last.and_then(|l| l["ms"].as_i64()).unwrap_or(0))
}

/// Waits up to `limit` for a batch of the worker at work.
async fn wait_at_work(worker: &WorkerProcess, limit: Duration) -> anyhow::Result<bool> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if at_work(worker)? {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(false)
}

/// Commits of the worker refused because its lease was lost, journaled at or after `ms`.
fn refused_since(worker: &WorkerProcess, ms: i64) -> anyhow::Result<usize> {
    Ok(worker
        .events()?
        .iter()
        .filter(|e| e.event == "commit_refused" && e.ms >= ms)
        .count())
}

/// Every refused commit in every journal.
fn refused_total(fleet: &Fleet) -> anyhow::Result<usize> {
    let mut n = 0;
    for worker in &fleet.workers {
        n += refused_since(worker, 0)?;
    }
    Ok(n)
}

/// The shards with a committed batch.
fn committed_shards(fleet: &Fleet) -> anyhow::Result<usize> {
    let mut shards = BTreeSet::new();
    for worker in &fleet.workers {
        for e in worker.events()? {
            if e.event == "committed" {
                shards.extend(e.shard);
            }
        }
    }
    Ok(shards.len())
}

/// The worker holding the leader row, if any (in the store the workers use).
async fn leader(ctx: &Context) -> anyhow::Result<Option<String>> {
    let rows = ctx.list().await?;
    let row = rows.into_iter().find(|r| r.key == ShardId::new(LEADER_ROW));
    Ok(row.and_then(|r| r.owner).map(|o| o.as_str().to_owned()))
}

/// Splits the open shard with the widest hash key range in the middle.
async fn split(ctx: &Context) -> anyhow::Result<String> {
    ctx.wait_stream_active().await?;
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let shards = source.list_shards().await?;
    let widest = (shards.iter())
        .filter(|s| !s.closed)
        .max_by_key(|s| s.hash_key_range.end - s.hash_key_range.start)
        .context("no open shard")?;
    let range = &widest.hash_key_range;
    let middle = range.start + (range.end - range.start) / 2 + 1;
    ctx.kinesis
        .split_shard()
        .stream_name(&ctx.stream)
        .shard_to_split(widest.id.as_str())
        .new_starting_hash_key(middle.to_string())
        .send()
        .await?;
    ctx.wait_stream_active().await?;
    Ok(format!("split {}", widest.id))
}

/// Merges the two adjacent open shards lowest in the hash key space.
async fn merge(ctx: &Context) -> anyhow::Result<String> {
    ctx.wait_stream_active().await?;
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let mut open: Vec<_> = (source.list_shards().await?)
        .into_iter()
        .filter(|s| !s.closed)
        .collect();
    open.sort_by_key(|s| s.hash_key_range.start);
    let (a, b) = open
        .windows(2)
        .find(|w| w[0].hash_key_range.end + 1 == w[1].hash_key_range.start)
        .map(|w| (w[0].id.clone(), w[1].id.clone()))
        .context("no two adjacent open shards")?;
    ctx.kinesis
        .merge_shards()
        .stream_name(&ctx.stream)
        .shard_to_merge(a.as_str())
        .adjacent_shard_to_merge(b.as_str())
        .send()
        .await?;
    ctx.wait_stream_active().await?;
    Ok(format!("merge {a} {b}"))
}

/// What the tables hold against the stream.
#[derive(Debug)]
struct Counts {
    stream: usize,
    exact_items: usize,
    missing: usize,
    extra: usize,
    not_one: usize,
    plain_duplicates: usize,
    plain_extra: u64,
}

/// Waits until the outputs table holds an item for every record of the stream, then
/// compares both tables with the stream.
async fn verify(
    ctx: &Context,
    fleet: &Fleet,
    tables: &Tables,
    produced: &[String],
) -> anyhow::Result<Counts> {
    let stream = stream_ids(ctx).await?;
    let payloads: BTreeSet<&String> = stream.values().collect();
    let lost: Vec<&String> = produced.iter().filter(|p| !payloads.contains(p)).collect();
    ensure!(lost.is_empty(), "written but not in the stream: {lost:?}");
    wait_until(
        "an output committed for every record",
        Duration::from_secs(120),
        Duration::from_secs(1),
        async || {
            let items = tables.read(ctx, &tables.exact).await?;
            Ok(stream.keys().all(|id| items.contains_key(id)))
        },
    )
    .await
    .map_err(|e| e.context(fleet.logs()))?;
    // Stragglers (a zombie's commit) would land now, if they could.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let items = tables.read(ctx, &tables.exact).await?;
    let plain_items = tables.read(ctx, &tables.plain).await?;
    let counts = Counts {
        stream: stream.len(),
        exact_items: items.len(),
        missing: stream.keys().filter(|id| !items.contains_key(*id)).count(),
        extra: items.keys().filter(|id| !stream.contains_key(*id)).count(),
        not_one: items.values().filter(|(n, _)| *n != 1).count(),
        plain_duplicates: plain_items.values().filter(|(n, _)| *n >= 2).count(),
        plain_extra: plain_items.values().map(|(n, _)| n.saturating_sub(1)).sum(),
    };
    let wrong: Vec<(&String, &(u64, String))> = items
        .iter()
        .filter(|(_, (n, _))| *n != 1)
        .take(10)
        .collect();
    ensure!(
        counts.missing == 0 && counts.extra == 0 && counts.not_one == 0,
        "the outputs table is not exactly once: {counts:?}; e.g. {wrong:?}"
    );
    let plain_missing = stream
        .keys()
        .filter(|id| !plain_items.contains_key(*id))
        .count();
    ensure!(
        plain_missing == 0,
        "{plain_missing} records missing from the plain table"
    );
    for (id, (_, data)) in &items {
        ensure!(stream.get(id) == Some(data), "{id}: payload {data:?}");
    }
    Ok(counts)
}

/// Every record of the stream, every shard read from TRIM_HORIZON: `shard/seq/0 → payload`.
async fn stream_ids(ctx: &Context) -> anyhow::Result<BTreeMap<String, String>> {
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let mut ids = BTreeMap::new();
    for shard in source.list_shards().await? {
        for (seq, data) in ctx.read_shard(shard.id.as_str()).await? {
            ids.insert(format!("{}/{seq}/0", shard.id), data);
        }
    }
    Ok(ids)
}

/// Every item of `table`: `id → (n, data)`.
async fn scan(ctx: &Context, table: &str) -> anyhow::Result<BTreeMap<String, (u64, String)>> {
    let mut items = BTreeMap::new();
    let mut start = None;
    loop {
        let page = ctx
            .dynamodb
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .with_context(|| format!("Scan {table}"))?;
        for item in page.items() {
            let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
            let n = item
                .get("n")
                .and_then(|v: &AttributeValue| v.as_n().ok())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if let Some(id) = text("id") {
                items.insert(id, (n, text("data").unwrap_or_default()));
            }
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return Ok(items),
        }
    }
}

/// The two output tables of a run, and the database they are in.
struct Tables {
    exact: String,
    plain: String,
    /// `None`: DynamoDB tables on the emulator.
    postgres: Option<Postgres>,
}

struct Postgres {
    url: String,
    client: Arc<tokio_postgres::Client>,
}

impl Tables {
    /// Two DynamoDB tables, named after the test.
    async fn dynamodb(ctx: &Context) -> anyhow::Result<Self> {
        let (exact, plain) = (
            format!("{}-exact", ctx.table),
            format!("{}-plain", ctx.table),
        );
        create_table(ctx, &exact).await?;
        create_table(ctx, &plain).await?;
        Ok(Self {
            exact,
            plain,
            postgres: None,
        })
    }

    /// Two Postgres tables of a unique name on the server of `url`.
    async fn postgres(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let base = kcl_integration_tests::unique("eo").replace('-', "_");
        let (exact, plain) = (format!("{base}_exact"), format!("{base}_plain"));
        for table in [&exact, &plain] {
            let create =
                format!("CREATE TABLE {table} (id text PRIMARY KEY, n bigint NOT NULL, data text)");
            client.batch_execute(&create).await?;
        }
        Ok(Self {
            exact,
            plain,
            postgres: Some(Postgres {
                url: url.to_owned(),
                client: Arc::new(client),
            }),
        })
    }

    /// Where the outputs and the leases are, in a few words.
    fn describe(&self, ctx: &Context) -> &'static str {
        match (&self.postgres, ctx.postgres()) {
            (None, _) => "DynamoDB (leases in DynamoDB)",
            (Some(_), None) => "Postgres (leases in DynamoDB)",
            (Some(_), Some(_)) => "Postgres (leases in Postgres)",
        }
    }

    /// Every item of `table`: `id → (n, data)`.
    async fn read(
        &self,
        ctx: &Context,
        table: &str,
    ) -> anyhow::Result<BTreeMap<String, (u64, String)>> {
        let Some(pg) = &self.postgres else {
            return scan(ctx, table).await;
        };
        let rows = pg
            .client
            .query(&format!("SELECT id, n, data FROM {table}"), &[])
            .await
            .with_context(|| format!("SELECT from {table}"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let n: i64 = row.get(1);
                let data: Option<String> = row.get(2);
                (
                    row.get(0),
                    (u64::try_from(n).unwrap_or(0), data.unwrap_or_default()),
                )
            })
            .collect())
    }
}
