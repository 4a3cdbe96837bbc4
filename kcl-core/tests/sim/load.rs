//! Balancing by load, simulated: one seed in eight runs a fleet under skewed, noisy, bursting
//! and then quiet and silent load, with workers of different capacities, and judges where the
//! leases went (the other seeds' fleets judge everything else).
//!
//! The fleet: 3 to 6 workers (a quarter of capacity 2) over 8 to 16 shards, under a leader,
//! half renewing per lease and half with heartbeats. Each shard gets a record a second; its
//! processor spends `load × noise` seconds on each (busy time is what the worker measures),
//! the noise ±20 % redrawn every 2.5 s (10 s at the default timing), and (before the change and while the hot set rotates)
//! now and then a shard bursts to 3× for 10 to 30 s.
//! The balancing settings run four times faster than the defaults (smoothing 15 s, window
//! 15 s, stickiness 150 s), so a simulated quarter of an hour stands for a worker-hour.
//!
//! The timeline: a skewed load (a few hot shards) from the start; at 6 min every lease of
//! the worker holding most turns hot and the rest cold (the worst a count balance can be
//! left with); steady to 16 min; the hot set rotating every 45 s to 19 min; quiet (a twentieth
//! of the load) to 27 min; silent to 33 min; then a drain.
//!
//! The invariants (`load-*`):
//! - `converge`: at 6 min (from the start) and from 4 min after the change (the stickiness
//!   window and six move windows: see `CONVERGE`) until 16 min, the highest worker level is
//!   at most 1.25 × the mean, or within two bands of the mean (at a mean under 8 bands, 0.8
//!   units by default: a move must gain a band to be made, see `lease/balance.rs`), or within
//!   one and a half bands of what a greedy placement of the whole fleet reaches (largest
//!   lease first, each where it ends lowest): the balancer moves one lease (or swaps two) at a
//!   time from where the leases are, never reshuffles them all;
//! - `moves`: from 4 min after the change to 16 min, from 4 min into the quiet phase (its
//!   start is a change of load) and from 1 min into the silent phase to their ends, at most
//!   one lease move per worker per quarter hour (a worker-hour at the default timing);
//! - `sticky`: after the start-up, no lease carrying load moves twice within the stickiness
//!   window;
//! - `budget`: after the start-up, no more moves of leases carrying load within 12 s than the
//!   budget per 15 s window (a move lands up to a few seconds after the leader asks);
//! - `lost`: every record processed: each shard's checkpoint at its last record.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    Balancing, BoxError, Checkpoint, Checkpointer, Coordination, LeaseStore, Liveness,
    ProcessRecordsInput, RecordProcessor, ShardId, Worker,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::scenario::{Fingerprint, Outcome, Stats};

/// The invariants judged here (see the module docs).
pub const INVARIANTS: &[&str] = &[
    "load-converge",
    "load-moves",
    "load-sticky",
    "load-budget",
    "load-lost",
];

/// Whether `seed` runs this scenario.
pub fn is_load_seed(seed: u64) -> bool {
    seed % 8 == 7
}

const MIN: Duration = Duration::from_secs(60);
/// A worker-hour at the default timing: the sim's balancing runs four times faster.
const HOUR: Duration = Duration::from_secs(15 * 60);
/// The sim's balancing settings (see the module docs).
const WINDOW: Duration = Duration::from_secs(15);
const STICKINESS: Duration = Duration::from_secs(150);
/// How long after a change of load the fleet has to converge: the stickiness window and six
/// move windows. The smoothing takes two or three windows to show a change and the first
/// moves follow; a lease they moved that must move again to finish the job (a swap that
/// needs it) can only once the stickiness window is over.
const CONVERGE: Duration = STICKINESS.saturating_add(WINDOW.saturating_mul(6));
const CHANGE: Duration = Duration::from_secs(6 * 60);
const STEADY_END: Duration = Duration::from_secs(16 * 60);
const ROTATE_END: Duration = Duration::from_secs(19 * 60);
const QUIET_END: Duration = Duration::from_secs(27 * 60);
const SILENT_END: Duration = Duration::from_secs(33 * 60);
const BAND: f64 = 0.1;

/// The true load of each shard (units), the noise on it, and bursts.
#[derive(Default)]
struct Profile {
    base: Mutex<BTreeMap<ShardId, f64>>,
    noise: Mutex<BTreeMap<ShardId, f64>>,
    burst: Mutex<Option<ShardId>>,
}

impl Profile {
    fn base(&self) -> BTreeMap<ShardId, f64> {
        self.base.lock().unwrap().clone()
    }

    fn set(&self, base: BTreeMap<ShardId, f64>) {
        *self.base.lock().unwrap() = base;
    }

    /// What one record of `shard` costs now, in seconds.
    fn cost(&self, shard: &ShardId) -> f64 {
        let base = self.base.lock().unwrap().get(shard).copied().unwrap_or(0.0);
        let noise = self
            .noise
            .lock()
            .unwrap()
            .get(shard)
            .copied()
            .unwrap_or(1.0);
        let burst = if self.burst.lock().unwrap().as_ref() == Some(shard) {
            3.0
        } else {
            1.0
        };
        (base * noise * burst).min(0.95)
    }
}

/// Spends each record's cost, then checkpoints.
struct Busy {
    shard: ShardId,
    profile: Arc<Profile>,
}

impl RecordProcessor for Busy {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        #[allow(clippy::cast_precision_loss)]
        let cost = self.profile.cost(&self.shard) * input.records().len() as f64;
        sleep(Duration::from_secs_f64(cost)).await;
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

/// Where each lease was, every 5 s.
type Samples = Arc<Mutex<Vec<(Duration, BTreeMap<ShardId, String>)>>>;

struct Setup {
    capacities: BTreeMap<String, f64>,
    budget: usize,
    heartbeat: bool,
    stream: MemoryStream,
    store: MemoryLeaseStore,
    profile: Arc<Profile>,
    began: Instant,
}

pub async fn simulate(seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ad_ba1a);
    let shards = rng.random_range(8..=16u32);
    let workers = rng.random_range(3..=6usize);
    let setup = Setup {
        capacities: (0..workers)
            .map(|i| {
                (
                    format!("w{i}"),
                    if rng.random_ratio(1, 4) { 2.0 } else { 1.0 },
                )
            })
            .collect(),
        budget: rng.random_range(2..=3),
        heartbeat: rng.random_bool(0.5),
        stream: MemoryStream::new(shards),
        store: MemoryLeaseStore::new(),
        profile: Arc::new(Profile::default()),
        began: Instant::now(),
    };
    let ids: Vec<ShardId> = setup.stream.open_shards();
    setup.profile.set(skewed(&ids, &mut rng));
    let (stop, drivers) = (CancellationToken::new(), CancellationToken::new());
    let fleet: Vec<_> = setup
        .capacities
        .iter()
        .map(|(id, capacity)| start(&setup, id, *capacity, &stop))
        .collect();
    let samples = Samples::default();
    let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = [
        tokio::spawn(produce(
            setup.stream.clone(),
            silent.clone(),
            drivers.clone(),
        )),
        tokio::spawn(disturb(setup.profile.clone(), seed, drivers.clone())),
        tokio::spawn(sample(
            setup.store.clone(),
            setup.began,
            samples.clone(),
            drivers.clone(),
        )),
    ];
    let history = timeline(&setup, &ids, &silent, &mut rng).await;
    drivers.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let mut violations = drained(&setup).await;
    violations.extend(judge(&setup, &samples.lock().unwrap(), &history));
    stop.cancel();
    for worker in fleet {
        let _ = worker.await;
    }
    outcome(seed, &setup, violations)
}

/// A few hot shards (about 15 %, at least one) carry most of the load.
fn skewed(ids: &[ShardId], rng: &mut StdRng) -> BTreeMap<ShardId, f64> {
    let hot = (ids.len() * 15 / 100).max(1);
    let mut base: BTreeMap<ShardId, f64> = ids
        .iter()
        .map(|id| (id.clone(), rng.random_range(0.0..0.04)))
        .collect();
    for _ in 0..hot {
        let id = &ids[rng.random_range(0..ids.len())];
        base.insert(id.clone(), rng.random_range(0.3..0.7));
    }
    base
}

fn start(setup: &Setup, id: &str, capacity: f64, stop: &CancellationToken) -> JoinHandle<()> {
    let balancing = Balancing::by_load()
        .capacity(capacity)
        .smoothing(Duration::from_secs(15))
        .move_budget(setup.budget, WINDOW)
        .stickiness(STICKINESS);
    let liveness = if setup.heartbeat {
        Liveness::Heartbeat
    } else {
        Liveness::PerLease
    };
    let config = super::scenario::config()
        .coordination(Coordination::Leader)
        .liveness(liveness)
        .idle_time_between_reads(Duration::from_secs(1))
        .balancing(balancing);
    let profile = setup.profile.clone();
    let factory = move |shard: &ShardId| Busy {
        shard: shard.clone(),
        profile: profile.clone(),
    };
    let worker = Worker::builder(setup.stream.client(id), setup.store.client(id))
        .id(id)
        .config(config)
        .build_with(factory)
        .expect("valid config");
    let stop = stop.clone();
    tokio::spawn(async move {
        let _ = worker
            .run_until(async move { stop.cancelled().await })
            .await;
    })
}

/// The true loads in force from each instant on (since the run began).
type History = Vec<(Duration, BTreeMap<ShardId, f64>)>;

/// Runs the phases (see the module docs); returns the loads in force from when.
async fn timeline(
    setup: &Setup,
    ids: &[ShardId],
    silent: &std::sync::atomic::AtomicBool,
    rng: &mut StdRng,
) -> History {
    let at = |d: Duration| sleep_until(setup.began + d);
    let mut history = vec![(Duration::ZERO, setup.profile.base())];
    let set = |base: BTreeMap<ShardId, f64>, history: &mut History| {
        setup.profile.set(base.clone());
        history.push((setup.began.elapsed(), base));
    };
    at(CHANGE).await;
    set(worst_for_counts(setup, ids, rng).await, &mut history);
    at(STEADY_END).await;
    while setup.began.elapsed() + Duration::from_secs(45) <= ROTATE_END {
        set(skewed(ids, rng), &mut history);
        sleep(Duration::from_secs(45)).await;
    }
    at(ROTATE_END).await;
    let quiet = history[history.len() - 1].1.iter();
    set(
        quiet.map(|(k, v)| (k.clone(), v / 20.0)).collect(),
        &mut history,
    );
    at(QUIET_END).await;
    silent.store(true, std::sync::atomic::Ordering::Relaxed);
    set(ids.iter().map(|k| (k.clone(), 0.0)).collect(), &mut history);
    at(SILENT_END).await;
    history
}

/// Every lease of the worker holding most turns hot, the others cold.
async fn worst_for_counts(
    setup: &Setup,
    ids: &[ShardId],
    rng: &mut StdRng,
) -> BTreeMap<ShardId, f64> {
    let owners = owners(&setup.store).await;
    let mut by: BTreeMap<&String, usize> = BTreeMap::new();
    for owner in owners.values() {
        *by.entry(owner).or_default() += 1;
    }
    let most = by
        .into_iter()
        .max_by_key(|(w, n)| (*n, std::cmp::Reverse(*w)));
    let most = most.map(|(w, _)| w.clone());
    ids.iter()
        .map(|id| {
            let hot = owners.get(id).is_some_and(|o| Some(o) == most.as_ref());
            let load = if hot {
                rng.random_range(0.25..0.5)
            } else {
                rng.random_range(0.0..0.04)
            };
            (id.clone(), load)
        })
        .collect()
}

/// Each shard's owner in the table now.
async fn owners(store: &MemoryLeaseStore) -> BTreeMap<ShardId, String> {
    let rows = store.list().await.unwrap_or_default();
    rows.into_iter()
        .filter(|l| !kcl_core::singleton::is_coordination_key(&l.key))
        .filter_map(|l| Some((l.key, l.owner?.as_str().to_owned())))
        .collect()
}

/// A record a second on every open shard, except while `silent`.
async fn produce(
    stream: MemoryStream,
    silent: Arc<std::sync::atomic::AtomicBool>,
    stop: CancellationToken,
) {
    let mut keys: BTreeMap<ShardId, String> = BTreeMap::new();
    let shards = stream.open_shards().len();
    for i in 0..100_000 {
        if keys.len() == shards {
            break;
        }
        let key = format!("k{i}");
        if let Some(shard) = stream.shard_for(&key) {
            keys.entry(shard).or_insert(key);
        }
    }
    while !stop.is_cancelled() {
        if !silent.load(std::sync::atomic::Ordering::Relaxed) {
            for key in keys.values() {
                stream.put(key, "x");
            }
        }
        sleep(Duration::from_secs(1)).await;
    }
}

/// Noise (±20 %, redrawn every 2.5 s: 10 s at the default timing) and bursts (3× on one shard
/// for 10 to 30 s, about once a minute, before the change and while the hot set rotates: the steady phase has noise
/// only).
async fn disturb(profile: Arc<Profile>, seed: u64, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb0_0575);
    let began = Instant::now();
    let mut burst_until = None;
    while !stop.is_cancelled() {
        let shards: Vec<ShardId> = profile.base().into_keys().collect();
        *profile.noise.lock().unwrap() = shards
            .iter()
            .map(|s| (s.clone(), rng.random_range(0.8..1.2)))
            .collect();
        let now = began.elapsed();
        if burst_until.is_some_and(|until| now >= until) {
            *profile.burst.lock().unwrap() = None;
            burst_until = None;
        }
        let bursting = now < CHANGE || (STEADY_END..ROTATE_END).contains(&now);
        if burst_until.is_none() && bursting && rng.random_ratio(1, 24) && !shards.is_empty() {
            let shard = shards[rng.random_range(0..shards.len())].clone();
            *profile.burst.lock().unwrap() = Some(shard);
            burst_until = Some(now + Duration::from_secs(rng.random_range(10..=30)));
        }
        sleep(NOISE_EVERY).await;
    }
}

/// How often the noise is redrawn: 10 s at the default timing.
const NOISE_EVERY: Duration = Duration::from_millis(2_500);

/// Where each lease is, every 5 s.
async fn sample(
    store: MemoryLeaseStore,
    began: Instant,
    samples: Samples,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let owners = owners(&store).await;
        samples.lock().unwrap().push((began.elapsed(), owners));
        sleep(Duration::from_secs(5)).await;
    }
}

/// Waits for every record to be processed (at most two minutes); returns a violation for
/// each shard whose checkpoint stands before its last record.
async fn drained(setup: &Setup) -> Vec<String> {
    let deadline = Instant::now() + 2 * MIN;
    loop {
        let rows = setup.store.list().await.unwrap_or_default();
        let behind: Vec<String> = setup
            .stream
            .open_shards()
            .iter()
            .filter_map(|shard| {
                let last = setup.stream.records(shard).last()?.position();
                let row = rows.iter().find(|l| &l.key == shard);
                let done = row.is_some_and(|l| l.checkpoint == Checkpoint::Sequence(last.clone()));
                (!done).then(|| {
                    format!("load-lost: {shard} not checkpointed at its last record {last:?}")
                })
            })
            .collect();
        if behind.is_empty() || Instant::now() >= deadline {
            return behind;
        }
        sleep(Duration::from_secs(1)).await;
    }
}

/// The loads in force at `t`.
fn loads_at(history: &History, t: Duration) -> &BTreeMap<ShardId, f64> {
    let i = history.partition_point(|(from, _)| *from <= t);
    &history[i.saturating_sub(1)].1
}

/// Each worker's level (true load over capacity) with leases where `owners` says.
fn levels(
    setup: &Setup,
    owners: &BTreeMap<ShardId, String>,
    loads: &BTreeMap<ShardId, f64>,
) -> BTreeMap<String, f64> {
    let mut level: BTreeMap<String, f64> =
        setup.capacities.keys().map(|w| (w.clone(), 0.0)).collect();
    for (key, owner) in owners {
        let capacity = setup.capacities.get(owner).copied().unwrap_or(1.0);
        *level.entry(owner.clone()).or_default() +=
            loads.get(key).copied().unwrap_or(0.0) / capacity;
    }
    level
}

/// The fleet's mean level, and the highest a greedy placement (largest lease first, each
/// where it ends lowest) reaches.
fn reachable(setup: &Setup, loads: &BTreeMap<ShardId, f64>) -> (f64, f64) {
    let capacity: f64 = setup.capacities.values().sum();
    let mean = loads.values().sum::<f64>() / capacity;
    let mut sorted: Vec<f64> = loads.values().copied().collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut placed: Vec<(f64, f64)> = setup.capacities.values().map(|c| (0.0, *c)).collect();
    for load in sorted {
        let best = placed
            .iter_mut()
            .min_by(|a, b| ((a.0 + load) / a.1).total_cmp(&((b.0 + load) / b.1)));
        if let Some(worker) = best {
            worker.0 += load;
        }
    }
    let greedy = placed.iter().map(|(l, c)| l / c).fold(0.0, f64::max);
    (mean, greedy)
}

/// Owner changes by when (since the run began) and lease, from the store's journal.
fn moves(setup: &Setup) -> Vec<(Duration, ShardId)> {
    let mut last: BTreeMap<ShardId, String> = BTreeMap::new();
    let mut moves = Vec::new();
    for event in setup.store.journal() {
        let key = &event.lease.key;
        if kcl_core::singleton::is_coordination_key(key) {
            continue;
        }
        let Some(owner) = event.lease.owner.as_ref().map(|o| o.as_str().to_owned()) else {
            continue;
        };
        if let Some(before) = last.insert(key.clone(), owner.clone())
            && before != owner
        {
            moves.push((event.at - setup.began, key.clone()));
        }
    }
    moves
}

fn judge(
    setup: &Setup,
    samples: &[(Duration, BTreeMap<ShardId, String>)],
    history: &History,
) -> Vec<String> {
    let mut violations = converged(setup, samples, history);
    let moves = moves(setup);
    if std::env::var_os("SIM_LOAD_DEBUG").is_some() {
        debug(setup, samples, history, &moves);
    }
    #[allow(clippy::cast_precision_loss)]
    let workers = setup.capacities.len() as f64;
    for (phase, from, to) in [
        ("steady", CHANGE + CONVERGE, STEADY_END),
        ("quiet", ROTATE_END + CONVERGE, QUIET_END),
        ("silent", QUIET_END + MIN, SILENT_END),
    ] {
        let made = moves.iter().filter(|(t, _)| (from..to).contains(t)).count();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let allowed = ((workers * (to - from).as_secs_f64() / HOUR.as_secs_f64()) as usize).max(1);
        if made > allowed {
            violations.push(format!(
                "load-moves: {made} moves in the {phase} phase ({:?} to {:?}), at most {allowed} allowed (one per worker-hour)",
                from, to
            ));
        }
    }
    let loaded = |t: Duration, key: &ShardId| {
        loads_at(history, t).get(key).copied().unwrap_or(0.0) >= BAND / 2.0
    };
    let mut by_key: BTreeMap<&ShardId, Vec<Duration>> = BTreeMap::new();
    for (t, key) in &moves {
        by_key.entry(key).or_default().push(*t);
    }
    for (key, times) in &by_key {
        for pair in times.windows(2) {
            // From the end of the start-up (the first placement of every lease) on.
            let balancing = pair[0] >= MIN;
            if balancing && pair[1] - pair[0] < STICKINESS && loaded(pair[1], key) {
                violations.push(format!(
                    "load-sticky: {key} moved at {:?} and again at {:?}, within the stickiness window",
                    pair[0], pair[1]
                ));
            }
        }
    }
    // From the end of the start-up (the first placement of every lease) on.
    let heavy: Vec<Duration> = moves
        .iter()
        .filter(|(t, k)| *t >= MIN && loaded(*t, k))
        .map(|(t, _)| *t)
        .collect();
    for (i, t) in heavy.iter().enumerate() {
        let within = heavy[i..]
            .iter()
            .take_while(|u| **u - *t < Duration::from_secs(10))
            .count();
        if within > setup.budget {
            violations.push(format!(
                "load-budget: {within} moves of leases carrying load from {t:?} within 10 s, budget {} per 15 s",
                setup.budget
            ));
            break;
        }
    }
    violations
}

/// `load-converge`: see the module docs.
fn converged(
    setup: &Setup,
    samples: &[(Duration, BTreeMap<ShardId, String>)],
    history: &History,
) -> Vec<String> {
    let before_change = samples.iter().rev().find(|(t, _)| *t < CHANGE);
    let settled = samples
        .iter()
        .filter(|(t, _)| (CHANGE + CONVERGE..STEADY_END).contains(t));
    let mut violations = Vec::new();
    for (t, owners) in before_change.into_iter().chain(settled) {
        let loads = loads_at(history, *t);
        let (mean, greedy) = reachable(setup, loads);
        let bound = (1.25 * mean)
            .max(mean + 2.0 * BAND)
            .max(greedy + 1.5 * BAND);
        let levels = levels(setup, owners, loads);
        let (worst, level) = levels
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(w, l)| (w.clone(), *l))
            .unwrap_or_default();
        if level > bound {
            violations.push(format!(
                "load-converge: at {t:?} {worst} is at {level:.3} (mean {mean:.3}, bound {bound:.3}, greedy {greedy:.3}): {levels:?}"
            ));
            break;
        }
    }
    violations
}

fn outcome(seed: u64, setup: &Setup, violations: Vec<String>) -> Outcome {
    let journal = setup.store.journal();
    let mut trace = String::new();
    for e in &journal {
        trace.push_str(&format!(
            "{:?} {} {} {:?}\n",
            e.at - setup.began,
            e.client,
            e.operation,
            e.lease
        ));
    }
    for v in &violations {
        trace.push_str(&format!("violation {v}\n"));
    }
    if let Some(dir) = std::env::var_os("SIM_TRACE") {
        let path = std::path::Path::new(&dir).join(format!("seed-{seed}.trace"));
        std::fs::write(&path, &trace).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let records = setup
        .stream
        .open_shards()
        .iter()
        .map(|s| setup.stream.records(s).len())
        .sum();
    let stats = Stats {
        load: 1,
        load_moves: moves(setup).len(),
        heartbeat: usize::from(setup.heartbeat),
        led: 1,
        ..Stats::default()
    };
    Outcome {
        fingerprint: Fingerprint {
            store_events: journal.len(),
            violations: violations.len(),
            digest: super::hash(&trace),
            ..Fingerprint::default()
        },
        violations,
        records,
        balance_cycles: 0,
        stats,
    }
}

/// `SIM_LOAD_DEBUG=1`: the moves, and the levels every minute.
fn debug(
    setup: &Setup,
    samples: &[(Duration, BTreeMap<ShardId, String>)],
    history: &History,
    moves: &[(Duration, ShardId)],
) {
    eprintln!(
        "capacities {:?}, budget {}, heartbeat {}",
        setup.capacities, setup.budget, setup.heartbeat
    );
    for (t, key) in moves {
        let load = loads_at(history, *t).get(key).copied().unwrap_or(0.0);
        eprintln!("move {:>7.1}s {key} (load {load:.3})", t.as_secs_f64());
    }
    for (t, owners) in samples.iter().filter(|(t, _)| t.as_secs() % 60 == 0) {
        let loads = loads_at(history, *t);
        let (mean, greedy) = reachable(setup, loads);
        let levels: Vec<String> = levels(setup, owners, loads)
            .values()
            .map(|l| format!("{l:.2}"))
            .collect();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for owner in owners.values() {
            *counts.entry(owner.as_str()).or_default() += 1;
        }
        eprintln!(
            "{:>5}s mean {mean:.3} greedy {greedy:.3} levels {} leases {counts:?}",
            t.as_secs(),
            levels.join(" ")
        );
    }
}
