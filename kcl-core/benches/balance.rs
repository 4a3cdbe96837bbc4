//! Balancing by load against balancing by count, on a skewed stream: 16 workers under a
//! leader on 256 shards, on the in-memory backends under paused tokio time (the figures are
//! simulated time, the same on any machine).
//!
//! `cargo bench -p kcl-core --bench balance` (`-- --seeds 1,2,3` picks the seeds)
//!
//! Every shard gets a record a second; its processor spends `load × noise` seconds of busy
//! time on each (busy time is what a worker measures, see `kcl_core::lease::load`), the noise
//! ±20 % per shard, redrawn every 10 s, and checkpoints once a minute. The load starts even
//! (6.4 units over 256 shards); after [`WARM_UP`] (longer than the 10 min stickiness, so that
//! the leader has watched every lease long enough to move it: a fleet that has been running
//! a while) 26 shards (10 %) chosen by the seed carry 60 % of it (0.148 units each) and the
//! other 230 share the rest (0.011 each). The mean level is then 0.4 of a worker, and even a
//! count balance that gives one worker 5 hot shards leaves it under full load.
//!
//! Reported per run and as medians over the seeds, for `Balancing::by_load()` (production
//! timing: smoothing 60 s, move window 60 s, budget 4, stickiness 10 min, band 0.1) and for
//! `Balancing::by_count()` (the default) on the same seed:
//! - max/mean: the most loaded worker's level over the mean level (true loads, without the
//!   noise, of the leases where the table says they are), at the end of the steady hour and
//!   the worst sample during it; and max − mean at the end, in units, against the band (0.1);
//! - moves and time to converge: owner changes from the skew to [`CONVERGE`] after it, and
//!   when the last of them landed; and when the most loaded worker came within the band of
//!   the mean for good (sampled every second to the end of the steady hour);
//! - moves per hour afterwards: owner changes in the steady hour that follows;
//! - the lease table's bill in that hour, from the store's request accounting
//!   (`kcl_core::lease::usage`): read and write units, and the write units of renewals,
//!   checkpoints and moves (takes, releases, handoff requests). The load figures ride on the
//!   renewals, so the two modes pay the same but for their moves.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::lease::usage::{Operation, Tally};
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    Balancing, BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId,
    ShutdownHandle, Worker, WorkerConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep, sleep_until};

const SHARDS: u32 = 256;
const WORKERS: usize = 16;
const HOT: usize = 26;
/// The fleet's load in units (1: one processor busy all the time).
const TOTAL: f64 = 6.4;
/// Share of [`TOTAL`] the hot shards carry.
const HOT_SHARE: f64 = 0.6;
/// Even load until then.
const WARM_UP: Duration = Duration::from_secs(12 * 60);
/// Time given to converge after the skew appears.
const CONVERGE: Duration = Duration::from_secs(20 * 60);
/// The steady hour measured after that.
const STEADY: Duration = Duration::from_secs(60 * 60);
const NOISE_EVERY: Duration = Duration::from_secs(10);
const CHECKPOINT_EVERY: Duration = Duration::from_secs(60);
/// How often the table's owners are sampled (a move takes longer than this).
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// `Balancing::band`'s default, in units per unit of capacity.
const BAND: f64 = 0.1;

/// Each shard's true load (units) and the noise on it.
#[derive(Default)]
struct Profile {
    base: Mutex<BTreeMap<ShardId, f64>>,
    noise: Mutex<BTreeMap<ShardId, f64>>,
}

impl Profile {
    /// Seconds one record of `shard` costs now.
    fn cost(&self, shard: &ShardId) -> f64 {
        let base = self.base.lock().unwrap().get(shard).copied().unwrap_or(0.0);
        let noise = self
            .noise
            .lock()
            .unwrap()
            .get(shard)
            .copied()
            .unwrap_or(1.0);
        base * noise
    }
}

/// Spends each record's cost; checkpoints once a minute.
struct Busy {
    shard: ShardId,
    profile: Arc<Profile>,
    checkpointed: Instant,
}

impl RecordProcessor for Busy {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let cost = self.profile.cost(&self.shard) * input.records().len() as f64;
        sleep(Duration::from_secs_f64(cost)).await;
        if self.checkpointed.elapsed() >= CHECKPOINT_EVERY {
            checkpointer.checkpoint().await?;
            self.checkpointed = Instant::now();
        }
        Ok(())
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    max_over_mean_end: f64,
    max_over_mean_worst: f64,
    max_minus_mean_end: f64,
    /// Seconds from the skew until max − mean stayed within the band; `None`: never.
    within_band_secs: Option<f64>,
    converge_moves: usize,
    /// Of which of hot leases (the others: cold ones spread by count).
    converge_hot: usize,
    converge_secs: f64,
    steady_moves: usize,
    read_units: f64,
    write_units: f64,
    renew_units: f64,
    checkpoint_units: f64,
    move_units: f64,
}

/// The leases' owners, sampled: owner changes since the skew, by when.
struct Watch {
    owners: BTreeMap<ShardId, String>,
    moves: Vec<(Duration, ShardId)>,
}

impl Watch {
    fn sample(&mut self, store: &MemoryLeaseStore, since_skew: Option<Duration>) {
        for lease in store.leases() {
            if kcl_core::singleton::is_coordination_key(&lease.key) {
                continue;
            }
            let Some(owner) = lease.owner.map(|o| o.as_str().to_owned()) else {
                continue;
            };
            let before = self.owners.insert(lease.key.clone(), owner.clone());
            if let (Some(before), Some(t)) = (before, since_skew)
                && before != owner
            {
                self.moves.push((t, lease.key));
            }
        }
    }

    /// The most loaded worker's level and the mean level, with `loads`.
    fn max_and_mean(&self, loads: &BTreeMap<ShardId, f64>) -> (f64, f64) {
        let mut by: BTreeMap<&str, f64> = BTreeMap::new();
        for (key, owner) in &self.owners {
            *by.entry(owner.as_str()).or_default() += loads.get(key).copied().unwrap_or(0.0);
        }
        let max = by.values().copied().fold(0.0, f64::max);
        (max, loads.values().sum::<f64>() / WORKERS as f64)
    }

    /// Samples the owners at `since_skew`; notes it in `above` if the most loaded worker is
    /// then above the band.
    fn sample_at(
        &mut self,
        store: &MemoryLeaseStore,
        since_skew: Duration,
        loads: &BTreeMap<ShardId, f64>,
        above: &mut Option<Duration>,
    ) -> (f64, f64) {
        self.sample(store, Some(since_skew));
        let (max, mean) = self.max_and_mean(loads);
        if max - mean > BAND {
            *above = Some(since_skew);
        }
        (max, mean)
    }
}

fn main() {
    let seeds: Vec<u64> = std::env::args()
        .skip_while(|a| a != "--seeds")
        .nth(1)
        .map_or_else(
            || vec![1, 2, 3],
            |s| s.split(',').map(|n| n.parse().unwrap()).collect(),
        );
    let modes = [
        ("load", Balancing::by_load()),
        ("count", Balancing::by_count()),
    ];
    println!(
        "| mode | seed | max/mean at end | worst max/mean in the hour | max − mean at end | moves to converge | of which hot leases | seconds to the last | seconds to within the band | moves in the steady hour | read units/h | write units/h | of which renewals | checkpoints | moves |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut all: Vec<(&str, Vec<Run>)> = modes.iter().map(|(m, _)| (*m, Vec::new())).collect();
    for seed in &seeds {
        for (i, (mode, balancing)) in modes.iter().enumerate() {
            let wall = std::time::Instant::now();
            let run = run(*seed, balancing);
            print_row(mode, &seed.to_string(), &run);
            eprintln!(
                "({mode}, seed {seed}: {:.0} s of wall time)",
                wall.elapsed().as_secs_f64()
            );
            all[i].1.push(run);
        }
    }
    for (mode, runs) in &all {
        print_row(mode, "median", &median(runs));
    }
}

fn print_row(mode: &str, seed: &str, r: &Run) {
    println!(
        "| {mode} | {seed} | {:.2} | {:.2} | {:.3} | {} | {} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        r.max_over_mean_end,
        r.max_over_mean_worst,
        r.max_minus_mean_end,
        r.converge_moves,
        r.converge_hot,
        r.converge_secs,
        r.within_band_secs
            .map_or("never".to_owned(), |s| format!("{s:.0}")),
        r.steady_moves,
        r.read_units,
        r.write_units,
        r.renew_units,
        r.checkpoint_units,
        r.move_units,
    );
}

/// Each field's median over `runs`.
fn median(runs: &[Run]) -> Run {
    let of = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = |f: &dyn Fn(&Run) -> usize| of(&|r| f(r) as f64) as usize;
    // Never within the band sorts last.
    let within = {
        let mut v: Vec<Option<f64>> = runs.iter().map(|r| r.within_band_secs).collect();
        v.sort_by(|a, b| match (a, b) {
            (Some(a), Some(b)) => a.total_cmp(b),
            (a, b) => a.is_none().cmp(&b.is_none()),
        });
        v.get(v.len() / 2).copied().flatten()
    };
    Run {
        max_over_mean_end: of(&|r| r.max_over_mean_end),
        max_over_mean_worst: of(&|r| r.max_over_mean_worst),
        max_minus_mean_end: of(&|r| r.max_minus_mean_end),
        within_band_secs: within,
        converge_moves: count(&|r| r.converge_moves),
        converge_hot: count(&|r| r.converge_hot),
        converge_secs: of(&|r| r.converge_secs),
        steady_moves: count(&|r| r.steady_moves),
        read_units: of(&|r| r.read_units),
        write_units: of(&|r| r.write_units),
        renew_units: of(&|r| r.renew_units),
        checkpoint_units: of(&|r| r.checkpoint_units),
        move_units: of(&|r| r.move_units),
    }
}

/// One fleet, one seed, one balancing: see the module docs.
fn run(seed: u64, balancing: &Balancing) -> Run {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let stream = MemoryStream::new(SHARDS);
        let store = MemoryLeaseStore::new();
        let profile = Arc::new(Profile::default());
        let ids = stream.open_shards();
        let even = TOTAL / f64::from(SHARDS);
        *profile.base.lock().unwrap() = ids.iter().map(|id| (id.clone(), even)).collect();
        let began = Instant::now();
        let stops: Vec<ShutdownHandle> = (0..WORKERS)
            .map(|i| start(&stream, &store, &profile, &format!("w{i:02}"), balancing))
            .collect();
        let drivers = [
            tokio::spawn(produce(stream.clone())),
            tokio::spawn(disturb(profile.clone(), seed)),
        ];
        let mut watch = Watch {
            owners: BTreeMap::new(),
            moves: Vec::new(),
        };
        while began.elapsed() < WARM_UP {
            watch.sample(&store, None);
            sleep(SAMPLE_EVERY).await;
        }
        let skewed = skew(&ids, seed);
        *profile.base.lock().unwrap() = skewed.clone();
        let run = measure(&store, &mut watch, &skewed, began + WARM_UP).await;
        for stop in &stops {
            stop.force();
        }
        for driver in drivers {
            driver.abort();
        }
        run
    })
}

/// From the skew (at `skew`) on: the convergence window, then the steady hour.
async fn measure(
    store: &MemoryLeaseStore,
    watch: &mut Watch,
    loads: &BTreeMap<ShardId, f64>,
    skew: Instant,
) -> Run {
    let mut run = Run::default();
    let mut above = None;
    let steady = skew + CONVERGE;
    while Instant::now() < steady {
        watch.sample_at(store, skew.elapsed(), loads, &mut above);
        sleep_until((Instant::now() + SAMPLE_EVERY).min(steady)).await;
    }
    watch.sample_at(store, skew.elapsed(), loads, &mut above);
    run.converge_moves = watch.moves.len();
    let hot = |key: &ShardId| loads.get(key).is_some_and(|l| *l >= BAND);
    run.converge_hot = watch.moves.iter().filter(|(_, k)| hot(k)).count();
    run.converge_secs = watch.moves.last().map_or(0.0, |(t, _)| t.as_secs_f64());
    let before = store.table_usage().by_operation();
    let end = steady + STEADY;
    while Instant::now() < end {
        let (max, mean) = watch.sample_at(store, skew.elapsed(), loads, &mut above);
        run.max_over_mean_worst = run.max_over_mean_worst.max(max / mean);
        sleep_until((Instant::now() + SAMPLE_EVERY).min(end)).await;
    }
    let (max, mean) = watch.sample_at(store, skew.elapsed(), loads, &mut above);
    let after = store.table_usage().by_operation();
    run.max_over_mean_end = max / mean;
    run.max_minus_mean_end = max - mean;
    // Within the band from the sample after the last one above it; never if that was the
    // last sample.
    run.within_band_secs = match above {
        Some(t) if t >= skew.elapsed() => None,
        Some(t) => Some((t + SAMPLE_EVERY).as_secs_f64()),
        None => Some(0.0),
    };
    let times: Vec<String> = watch
        .moves
        .iter()
        .map(|(t, k)| format!("{}{}", t.as_secs(), if hot(k) { "*" } else { "" }))
        .collect();
    eprintln!(
        "(moves at seconds after the skew, * a hot lease: {})",
        times.join(" ")
    );
    run.steady_moves = watch.moves.len() - run.converge_moves;
    let hours = STEADY.as_secs_f64() / 3600.0;
    let spent = |ops: &[Operation]| -> Tally {
        let mut sum = Tally::default();
        for op in ops {
            let (a, b) = (after.get(op), before.get(op));
            let (a, b) = (
                a.copied().unwrap_or_default(),
                b.copied().unwrap_or_default(),
            );
            sum += Tally {
                requests: a.requests - b.requests,
                rows: a.rows - b.rows,
                read_units: a.read_units - b.read_units,
                write_units: a.write_units - b.write_units,
            };
        }
        sum
    };
    let all = spent(&Operation::ALL);
    run.read_units = all.read_units / hours;
    run.write_units = all.write_units / hours;
    run.renew_units = spent(&[Operation::Renew]).write_units / hours;
    run.checkpoint_units = spent(&[Operation::Checkpoint]).write_units / hours;
    let moves = [
        Operation::Take,
        Operation::Release,
        Operation::RequestHandoff,
    ];
    run.move_units = spent(&moves).write_units / hours;
    run
}

/// 26 shards drawn by `seed` carry 60 % of the load, the rest share 40 %.
fn skew(ids: &[ShardId], seed: u64) -> BTreeMap<ShardId, f64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5ca1_ab1e);
    let mut hot = Vec::new();
    while hot.len() < HOT {
        let i = rng.random_range(0..ids.len());
        if !hot.contains(&i) {
            hot.push(i);
        }
    }
    let (warm, cold) = (
        TOTAL * HOT_SHARE / HOT as f64,
        TOTAL * (1.0 - HOT_SHARE) / (ids.len() - HOT) as f64,
    );
    ids.iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), if hot.contains(&i) { warm } else { cold }))
        .collect()
}

fn start(
    stream: &MemoryStream,
    store: &MemoryLeaseStore,
    profile: &Arc<Profile>,
    id: &str,
    balancing: &Balancing,
) -> ShutdownHandle {
    let config = WorkerConfig::default()
        .idle_time_between_reads(Duration::from_secs(1))
        .balancing(balancing.clone());
    let profile = profile.clone();
    let factory = move |shard: &ShardId| Busy {
        shard: shard.clone(),
        profile: profile.clone(),
        checkpointed: Instant::now(),
    };
    let worker = Worker::builder(stream.client(id), store.client(id))
        .id(id)
        .config(config)
        .build_with(factory)
        .unwrap();
    let stop = worker.shutdown_handle();
    tokio::spawn(worker.run());
    stop
}

/// A record a second on every shard.
async fn produce(stream: MemoryStream) {
    let shards = stream.open_shards().len();
    let mut keys: BTreeMap<ShardId, String> = BTreeMap::new();
    for i in 0.. {
        if keys.len() == shards {
            break;
        }
        let key = format!("k{i}");
        if let Some(shard) = stream.shard_for(&key) {
            keys.entry(shard).or_insert(key);
        }
    }
    loop {
        for key in keys.values() {
            stream.put(key, "x");
        }
        sleep(Duration::from_secs(1)).await;
    }
}

/// ±20 % on every shard, redrawn every 10 s.
async fn disturb(profile: Arc<Profile>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb0_0575);
    loop {
        let shards: Vec<ShardId> = profile.base.lock().unwrap().keys().cloned().collect();
        *profile.noise.lock().unwrap() = shards
            .into_iter()
            .map(|s| (s, rng.random_range(0.8..1.2)))
            .collect();
        sleep(NOISE_EVERY).await;
    }
}
