//! One seeded run: choose a start, fill the stream's past, start a fleet, let a scheduler
//! disturb it while a producer writes, drain, and gather the evidence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kcl_core::lease::Lineage;
use kcl_core::memory::{Faults, MemoryLeaseStore, MemoryNetwork, MemoryPositionSink, MemoryStream};
use kcl_core::multi_stream::StreamId;
use kcl_core::singleton::{COORDINATION_PREFIX, is_coordination_key};
use kcl_core::{
    BalanceBy, Balancing, Checkpoint, Coordination, InitialPosition, Lease, LeaseStore, Liveness,
    Record, Retrieval, Shard, ShardId, WorkerConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::checks::{self, Evidence, Openings, SinkCounts, SinkEvidence, Start};
use super::fleet::{Fleet, Keys, send_messages};
use super::outputs::Transactional;
use super::poison::Poison;
use super::processor::Log;
use super::schedule::{Run, disturb, produce, reshard};

pub const MAX_SHARDS: usize = 32;
/// The restart grace of the seeds that have one (a third): most of their graceful leaves are
/// restarts under the same id (`schedule::leave`).
pub const RESTART_GRACE: Duration = Duration::from_secs(8);
pub const MAX_WORKERS: usize = 5;
/// How many taker cycles after the drain the fleet may take to balance.
const BALANCE_CYCLES: u32 = 20;

pub fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(Duration::from_secs(3))
        .taker_interval(Duration::from_millis(500))
        .shard_sync_interval(Duration::from_secs(5))
        .lease_cleanup_delay(Duration::from_secs(15))
        .idle_time_between_reads(Duration::from_millis(250))
        .parent_poll_interval(Duration::from_millis(250))
        .max_records(40)
        .max_leases_to_steal(2)
        .min_backoff(Duration::from_millis(50))
        .max_backoff(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(10))
        .call_timeout(Duration::from_secs(2))
        .stalled_after(super::problems::STALLED_AFTER)
        // Counts (the default; `sim/load.rs` proves balancing by load), at the sim's pace should
        // a seed turn load on: figures that fade within seconds once the drain stops the work.
        .balancing(
            Balancing::default()
                .smoothing(Duration::from_secs(1))
                .move_budget(4, Duration::from_secs(5))
                .stickiness(Duration::from_secs(5)),
        )
}

pub struct Outcome {
    pub violations: Vec<String>,
    pub records: usize,
    /// Taker cycles after the drain until balance held twice in a row.
    pub balance_cycles: u32,
    pub stats: Stats,
    /// What the run did, to compare replays of the seed (see [`Fingerprint`]).
    pub fingerprint: Fingerprint,
}

/// A digest of what a run did: its store writes and deliveries in the order they happened,
/// each with its time since the run began, its verdict and its counts. Two runs of one seed
/// must have the same. The event numbers (`seq`) only order events, and are left out: seeds
/// running side by side draw them from one counter.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub store_events: usize,
    pub deliveries: usize,
    pub handler_runs: usize,
    pub balance_cycles: u32,
    pub violations: usize,
    /// Of the store's journal, the deliveries, the violations and the counts.
    pub digest: u64,
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} store events, {} deliveries, {} handler runs, {} taker cycles, {} violations, digest {:016x}",
            self.store_events,
            self.deliveries,
            self.handler_runs,
            self.balance_cycles,
            self.violations,
            self.digest
        )
    }
}

/// What a run went through, to show the faults and cases really happened.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Seeds run under `Coordination::Leader`.
    pub led: usize,
    /// Of those, seeds whose table had no change feed (observers read the table whole).
    pub without_feed: usize,
    /// Of those, seeds balancing by load (`BalanceBy::Load`).
    pub by_load: usize,
    /// Seeds with workers under `Liveness::Heartbeat`.
    pub heartbeat: usize,
    /// Of those, seeds where every other worker renewed per lease.
    pub mixed: usize,
    /// Seeds read with enhanced fan-out (subscriptions) instead of polling.
    pub fan_out: usize,
    /// Seeds whose workers read through a `MultiStreamSource` (leases keyed by stream).
    pub multi_stream: usize,
    /// Seeds whose singletons run in health mode (some runs hang).
    pub health: usize,
    /// Seeds processed with `Parallel` (per-key parallelism, acknowledged later).
    pub parallel: usize,
    /// Handler runs under `Parallel`, and how many were cut short (crash, lease lost).
    pub handler_runs: usize,
    pub handler_runs_cut: usize,
    /// Seeds under a failure policy with failing records; of those, under `Parallel`, with
    /// parked keys, with batch processors that name the failed record, with a sink that
    /// refused at times.
    pub poison: usize,
    pub poison_parallel: usize,
    pub poison_parked: usize,
    /// Seeds with an outage; redrives asked; letters replayed by holders.
    pub outages: usize,
    pub redrives: usize,
    pub replayed: usize,
    pub poison_named: usize,
    pub sink_refused: usize,
    /// Dead letters accepted, by reason: attempts, permanent, parked.
    pub letters: [usize; 3],
    /// User records that came in KPL aggregates, and checkpoints written inside one.
    pub aggregated: usize,
    pub mid_aggregate_checkpoints: usize,
    /// Checkpoints past the last delivered record tried (each must be refused).
    pub beyond_tried: usize,
    /// Seeds whose fleet started under store faults, and of those, with closed shards (a
    /// resharded past) for the first sync to create leases of.
    pub early_store_faults: usize,
    pub early_faults_resharded: usize,
    /// Shards open at a `LATEST` start, never leased and closed since (their creates failed
    /// until they closed): never opened, nothing owed.
    pub never_opened: usize,
    /// Seeds by how many standbys their singletons have (0 to 3).
    pub standbys: [usize; 4],
    /// Runs of the periodic job.
    pub periodic_runs: usize,
    /// Messages sent to the singleton, and how many `send` reported delivered.
    pub sends: usize,
    pub sends_ok: usize,
    pub latest: usize,
    pub at_timestamp: usize,
    pub planned: usize,
    pub crashes: usize,
    pub freezes: usize,
    /// Seeds whose workers keep their leases through a restart (`restart_grace`), their
    /// restarts, and the leases kept through a restart judged by `restart-kept`.
    pub grace: usize,
    pub restarts: usize,
    pub kept_judged: usize,
    /// Seeds whose workers' `max_leases` is capped, and the problems reported (each report
    /// counted once, from when it appeared until it was gone), by kind.
    pub capped: usize,
    pub stalled_reports: usize,
    /// Stretches where records waited on a still checkpoint long enough that the holder had
    /// to report the shard stalled (each judged by `stall-reported`).
    pub stall_windows: usize,
    pub failing_reports: usize,
    pub unowned_reports: usize,
    /// The whole fleet's host suspended past the failover time (work woken as it resumes).
    pub suspends: usize,
    /// Role rows deleted, or deleted and created again, by the operator's hand.
    pub role_rows_meddled: usize,
    /// Times the leader and the standby were killed together.
    pub roles_killed: usize,
    pub joins: usize,
    pub leaves: usize,
    pub store_faults: usize,
    pub partitions: usize,
    pub splits: usize,
    pub merges: usize,
    /// A shard closed with one child (DynamoDB Streams' rollover).
    pub roll_overs: usize,
    pub aged_out: usize,
    pub aged_out_unread: usize,
    /// Operator resets of a checkpoint (`kcl-admin reset`).
    pub resets: usize,
    pub processors: usize,
    pub refused_checkpoints: usize,
    pub handoffs: usize,
    pub deliveries: usize,
    pub singleton_runs: usize,
    /// Seeds balancing by load under skewed load (`sim/load.rs`), and the lease moves in them.
    pub load: usize,
    pub load_moves: usize,
    /// Seeds whose processors commit outputs with their checkpoints (`sim/outputs.rs`), of
    /// those with small limits; commits applied; stretches one transaction could not hold;
    /// commits refused by the lease row (of those, stragglers that landed after their
    /// writer gave up); conflicts injected; retries answered by their token.
    pub outputs: usize,
    pub small_limits: usize,
    pub commits: usize,
    pub large_stretches: usize,
    pub refused_by_row: usize,
    pub refused_stragglers: usize,
    pub conflicts: usize,
    pub replays: usize,
    /// Seeds whose outputs go to a sink that keeps each shard's position (`sim/positions.rs`);
    /// its commits applied, refused because its row named another tenure, and opens; what
    /// the opens and the operator's hand came to (`checks/positions.rs`); the operator's
    /// rows deleted.
    pub sink: usize,
    pub sink_commits: usize,
    pub sink_fenced_off: usize,
    pub sink_opens: usize,
    pub sink_counts: SinkCounts,
    pub sink_deletes: usize,
    /// Under `Parallel`: records handled again after a change of tenure, by why, and how
    /// many would have been without sparse acknowledgements (`checks/acks.rs`).
    pub again: checks::Again,
}

impl Outcome {
    /// A run that could not be checked.
    pub fn failed(why: String) -> Self {
        Self {
            violations: vec![why],
            records: 0,
            balance_cycles: 0,
            stats: Stats::default(),
            fingerprint: Fingerprint::default(),
        }
    }
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Self) {
        self.led += o.led;
        self.without_feed += o.without_feed;
        self.by_load += o.by_load;
        self.heartbeat += o.heartbeat;
        self.mixed += o.mixed;
        self.fan_out += o.fan_out;
        self.multi_stream += o.multi_stream;
        self.health += o.health;
        self.parallel += o.parallel;
        self.handler_runs += o.handler_runs;
        self.handler_runs_cut += o.handler_runs_cut;
        self.poison += o.poison;
        self.poison_parallel += o.poison_parallel;
        self.poison_parked += o.poison_parked;
        self.outages += o.outages;
        self.redrives += o.redrives;
        self.replayed += o.replayed;
        self.poison_named += o.poison_named;
        self.sink_refused += o.sink_refused;
        for (a, b) in self.letters.iter_mut().zip(o.letters) {
            *a += b;
        }
        self.aggregated += o.aggregated;
        self.mid_aggregate_checkpoints += o.mid_aggregate_checkpoints;
        self.beyond_tried += o.beyond_tried;
        self.early_store_faults += o.early_store_faults;
        self.early_faults_resharded += o.early_faults_resharded;
        self.never_opened += o.never_opened;
        for (mine, theirs) in self.standbys.iter_mut().zip(o.standbys) {
            *mine += theirs;
        }
        self.periodic_runs += o.periodic_runs;
        self.sends += o.sends;
        self.sends_ok += o.sends_ok;
        self.latest += o.latest;
        self.at_timestamp += o.at_timestamp;
        self.planned += o.planned;
        self.crashes += o.crashes;
        self.freezes += o.freezes;
        self.grace += o.grace;
        self.restarts += o.restarts;
        self.kept_judged += o.kept_judged;
        self.capped += o.capped;
        self.stalled_reports += o.stalled_reports;
        self.stall_windows += o.stall_windows;
        self.failing_reports += o.failing_reports;
        self.unowned_reports += o.unowned_reports;
        self.suspends += o.suspends;
        self.role_rows_meddled += o.role_rows_meddled;
        self.roles_killed += o.roles_killed;
        self.joins += o.joins;
        self.leaves += o.leaves;
        self.store_faults += o.store_faults;
        self.partitions += o.partitions;
        self.splits += o.splits;
        self.merges += o.merges;
        self.roll_overs += o.roll_overs;
        self.aged_out += o.aged_out;
        self.aged_out_unread += o.aged_out_unread;
        self.resets += o.resets;
        self.processors += o.processors;
        self.refused_checkpoints += o.refused_checkpoints;
        self.handoffs += o.handoffs;
        self.deliveries += o.deliveries;
        self.singleton_runs += o.singleton_runs;
        self.load += o.load;
        self.load_moves += o.load_moves;
        self.outputs += o.outputs;
        self.small_limits += o.small_limits;
        self.commits += o.commits;
        self.large_stretches += o.large_stretches;
        self.refused_by_row += o.refused_by_row;
        self.refused_stragglers += o.refused_stragglers;
        self.conflicts += o.conflicts;
        self.replays += o.replays;
        self.sink += o.sink;
        self.sink_commits += o.sink_commits;
        self.sink_fenced_off += o.sink_fenced_off;
        self.sink_opens += o.sink_opens;
        self.sink_counts.behind += o.sink_counts.behind;
        self.sink_counts.forwarded += o.sink_counts.forwarded;
        self.sink_counts.before_successor += o.sink_counts.before_successor;
        self.sink_counts.after_reset += o.sink_counts.after_reset;
        self.sink_counts.resets_behind += o.sink_counts.resets_behind;
        self.sink_counts.lower_fences += o.sink_counts.lower_fences;
        self.sink_deletes += o.sink_deletes;
        self.again += o.again;
    }
}

/// Seeds whose number is a multiple of this run with planned changes only.
const PLANNED_EVERY: u64 = 5;

pub async fn simulate(seed: u64) -> Outcome {
    if super::load::is_load_seed(seed) {
        return super::load::simulate(seed).await;
    }
    let began = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let planned = seed.is_multiple_of(PLANNED_EVERY);
    // Odd seeds run under a leader, even ones with every worker coordinating for itself.
    let led = seed % 2 == 1;
    let coordination = if led {
        Coordination::Leader
    } else {
        Coordination::EveryWorker
    };
    // A third of each run per-lease renewals, a third heartbeats, a third both mixed.
    let (heartbeat, mixed) = match (seed / 2) % 3 {
        0 => (false, false),
        1 => (true, false),
        _ => (true, true),
    };
    let liveness = if heartbeat {
        Liveness::Heartbeat
    } else {
        Liveness::PerLease
    };
    let faults = Faults::seeded(seed.wrapping_mul(31).wrapping_add(7));
    let stream = MemoryStream::with_faults(rng.random_range(1..=16u32), faults.clone());
    // The wall clock starts at the same instant whenever the seed runs (the periodic job's
    // periods are numbered on it), in a phase of the period that varies with the seed.
    stream.set_wall_clock(
        chrono::DateTime::UNIX_EPOCH
            + chrono::Duration::days(20_454)
            + chrono::Duration::milliseconds(i64::try_from(seed % 10_007).unwrap_or(0)),
    );
    // A third of the seeds read with subscriptions, whose lifetime (5 minutes on Kinesis) is
    // short enough that they are renewed during the run. Drawn apart, so that the
    // scenario's own draws stay as they were.
    let mut reading = StdRng::seed_from_u64(seed ^ 0x00fa_0017);
    let fan_out = reading.random_ratio(1, 3);
    let retrieval = if fan_out {
        stream
            .set_subscription_lifetime(Duration::from_millis(reading.random_range(1_000..=20_000)));
        Retrieval::FanOut {
            consumer_name: "simulation".to_owned(),
        }
    } else {
        Retrieval::Polling
    };
    // A third of the seeds key their leases as KCL Java's multi-stream mode does, reading
    // through a `MultiStreamSource` (its keys, routing, children and parents under every
    // fault); the several-streams pool itself is tested in `tests/multi_stream.rs`.
    let keys = Keys(
        StdRng::seed_from_u64(seed ^ 0x5717_ea55)
            .random_ratio(1, 3)
            .then(|| StreamId::new("123456789012", "simulation", 1_700_000_000)),
    );
    // Half the seeds run the singletons in health mode, with some runs hanging.
    let mut singletons = StdRng::seed_from_u64(seed ^ 0x0bea_7000);
    let health = singletons.random_bool(0.5);
    // A quarter of the seeds without standbys (every candidate polls), the rest with lines
    // of one to three.
    let standbys: u8 = singletons.random_range(0..4);
    // A third of the seeds process with `Parallel`, 1 to 12 records of a shard in flight.
    let mut processing = StdRng::seed_from_u64(seed ^ 0x9a7a_11e1);
    let parallel = processing
        .random_ratio(1, 3)
        .then(|| processing.random_range(1..=12usize));
    // What they may hold behind an unfinished record, drawn low so that a stuck record
    // reaches the bound (`held-bound`).
    let max_unacknowledged = processing.random_range(10..=80usize);
    // Every message an instance's inbox takes goes to the log, with where and when.
    let log = Log::default();
    // A third of the disturbed seeds have records that fail, under a failure policy.
    let poison = Poison::draw(seed, planned, &log);
    let network = {
        let log = log.clone();
        MemoryNetwork::with_hook(Arc::new(
            move |worker: &str, _: &str, message: &bytes::Bytes| {
                log.lock().acceptances.push(super::processor::Acceptance {
                    worker: worker.to_owned(),
                    message: String::from_utf8_lossy(message).into_owned(),
                    at: Instant::now(),
                });
            },
        ))
    };
    let mut stats = Stats {
        health: usize::from(health),
        standbys: {
            let mut by = [0; 4];
            by[usize::from(standbys)] = 1;
            by
        },
        multi_stream: usize::from(keys.0.is_some()),
        parallel: usize::from(parallel.is_some()),
        led: usize::from(led),
        heartbeat: usize::from(heartbeat),
        mixed: usize::from(mixed),
        fan_out: usize::from(fan_out),
        planned: usize::from(planned),
        ..Stats::default()
    };
    let position = past(&stream, &mut rng, &mut stats).await;
    let start = Start {
        position,
        at: stream.now(),
        instant: Instant::now(),
        skew: config().max_clock_skew,
        shards: stream
            .shards()
            .into_iter()
            .map(|s| (keys.of(&s.id), s.closed))
            .collect(),
    };
    let store = MemoryLeaseStore::with_faults(faults.clone());
    // Half the seeds with batch processors and no failure policy commit outputs with their
    // checkpoints (drawn apart).
    let outputs = Transactional::draw(seed, poison.is_none() && parallel.is_none());
    if let Some(outputs) = &outputs {
        outputs.apply(&store);
        stats.outputs = 1;
        stats.small_limits = usize::from(outputs.limits.is_some() && !outputs.sink);
        stats.sink = usize::from(outputs.sink);
    }
    // Half of those commit into a sink that keeps positions, sharing the store's faults.
    let sink = outputs
        .filter(|o| o.sink)
        .map(|_| MemoryPositionSink::new(faults.clone()));
    if led {
        // The table's change feed and owner index lag as DynamoDB's may (the stream by up to
        // 2 s, the index by up to 3 s), and one table in five has no feed. Drawn apart, so
        // that the scenario's own draws stay as they were.
        let mut lags = StdRng::seed_from_u64(seed ^ 0x0fee_d1a6);
        let feed = lags
            .random_bool(0.8)
            .then(|| Duration::from_millis(lags.random_range(0..=2_000)));
        stats.without_feed = usize::from(feed.is_none());
        store.set_feed(feed);
        store.set_index_lag(Duration::from_millis(lags.random_range(0..=3_000)));
    }
    // A third of the seeds keep leases through restarts (drawn apart).
    let grace = StdRng::seed_from_u64(seed ^ 0x6ace_5eed)
        .random_ratio(1, 3)
        .then_some(RESTART_GRACE);
    stats.grace = usize::from(grace.is_some());
    // A quarter of the leader seeds balance by load (drawn apart), through the same crashes,
    // partitions, restarts and reshards as the others: `sim/load.rs` proves what balancing
    // by load achieves, these that it loses nothing and settles.
    let by_load = led && StdRng::seed_from_u64(seed ^ 0x10ad_10ad).random_ratio(1, 4);
    stats.by_load = usize::from(by_load);
    let balancing = if by_load {
        config().balancing.by(BalanceBy::Load)
    } else {
        config().balancing
    };
    // A quarter of the seeds cap `max_leases` (drawn apart: see `problems::cap`).
    let cap = super::problems::cap(seed);
    stats.capped = usize::from(cap.is_some());
    let mut fleet = Fleet {
        seed,
        config: config()
            .max_leases(cap.unwrap_or(config().max_leases))
            .initial_position(position)
            .coordination(coordination)
            .liveness(liveness)
            .retrieval(retrieval)
            .max_unacknowledged(max_unacknowledged)
            .restart_grace(grace)
            .balancing(balancing),
        stream: stream.clone(),
        store,
        faults: faults.clone(),
        log,
        instances: Arc::new(AtomicU64::new(0)),
        live: BTreeMap::new(),
        next_id: 0,
        // Drawn either way, so that the rest of the seed's draws stay as they were.
        failure_rate: if !planned && rng.random_bool(0.5) && poison.is_none() {
            0.02
        } else {
            0.0
        },
        mixed,
        keys,
        health,
        standbys,
        network: network.clone(),
        parallel,
        poison: poison.clone(),
        outputs,
        sink,
    };
    // A quarter of the disturbed seeds start under store faults, so that the first shard
    // sync's lease creates (of a resharded past, often) fail and are retried.
    let early = StdRng::seed_from_u64(seed ^ 0x0ea7_1e55);
    let early_faults = !planned && { early }.random_ratio(1, 4);
    if early_faults {
        early_store_faults(&fleet, seed);
        stats.early_store_faults = 1;
        stats.early_faults_resharded = usize::from(start.shards.values().any(|closed| *closed));
    }
    for _ in 0..rng.random_range(1..=MAX_WORKERS) {
        fleet.join();
    }
    let producing = CancellationToken::new();
    let producer = tokio::spawn(produce(stream.clone(), seed, producing.clone()));
    let sink_faults = poison
        .clone()
        .map(|p| tokio::spawn(p.disturb_sink(producing.clone())));
    let outage = poison
        .clone()
        .map(|p| tokio::spawn(p.run_outage(fleet.log.clone(), producing.clone())));
    let redrives = poison.clone().map(|p| {
        let (store, log) = (fleet.store.clone(), fleet.log.clone());
        tokio::spawn(p.redrive(store, log, producing.clone()))
    });
    let sender = tokio::spawn(send_messages(
        network,
        fleet.store.clone(),
        faults.clone(),
        fleet.log.clone(),
        seed,
        producing.clone(),
    ));
    let mut aged_out = BTreeMap::new();
    let run = Run {
        fleet: &mut fleet,
        rng: &mut rng,
        stats: &mut stats,
        aged_out: &mut aged_out,
        violations: Vec::new(),
    };
    let mut violations = disturb(run, planned).await;
    faults.clear();
    if fleet.live.is_empty() {
        fleet.join();
    }
    let quiet_from = Instant::now();
    sleep(Duration::from_secs(2)).await;
    producing.cancel();
    let _ = producer.await;
    if let Some(faults) = sink_faults {
        let _ = faults.await;
    }
    if let Some(outage) = outage {
        let _ = outage.await;
    }
    if let Some(redrives) = redrives {
        let _ = redrives.await;
    }
    let _ = sender.await;
    if let Some(cap) = cap {
        super::problems::make_room(&mut fleet, cap).await;
    }
    let records = fleet.keys.keyed(records(&stream));
    drain(&fleet, &records, &start).await;
    let (balance_cycles, unbalanced) = balance(&fleet).await;
    violations.extend(unbalanced);
    let quiet = (quiet_from, Instant::now());
    violations.extend(fleet.stop_all().await);
    super::problems::settle().await;
    violations.extend(judge(
        &fleet,
        &records,
        &aged_out,
        &start,
        (planned, quiet),
        &mut stats,
    ));
    let records = records.values().map(Vec::len).sum();
    let fingerprint = fingerprint(seed, &fleet, began, &violations, records, balance_cycles);
    Outcome {
        violations,
        records,
        balance_cycles,
        stats,
        fingerprint,
    }
}

/// The run's [`Fingerprint`]; with `SIM_TRACE=DIR`, also what it digests, as
/// `DIR/seed-N.trace` (to diff two runs of a seed).
fn fingerprint(
    seed: u64,
    fleet: &Fleet,
    began: Instant,
    violations: &[String],
    records: usize,
    balance_cycles: u32,
) -> Fingerprint {
    use std::fmt::Write;
    let store = fleet.store.journal();
    let journal = fleet.log.lock();
    let mut trace = String::new();
    for e in &store {
        let _ = writeln!(
            trace,
            "{:?} {:?} store {} {} reported {} {:?}",
            e.started - began,
            e.at - began,
            e.client,
            e.operation,
            e.reported,
            e.lease
        );
    }
    for d in &journal.deliveries {
        let _ = writeln!(
            trace,
            "{:?} delivery {} #{} {} {:?} keyed {}",
            d.at - began,
            d.worker,
            d.instance,
            d.shard,
            d.position,
            d.keyed
        );
    }
    for c in fleet.sink.iter().flat_map(|s| s.applied_commits()) {
        let _ = writeln!(
            trace,
            "{:?} sink {} {} fence {} {:?} to {} writes {}",
            c.at - began,
            c.client,
            c.shard,
            c.fence.0,
            c.before,
            c.checkpoint,
            c.writes.len()
        );
    }
    for v in violations {
        let _ = writeln!(trace, "violation {v}");
    }
    let _ = writeln!(
        trace,
        "{records} records, {balance_cycles} taker cycles, {} handler runs",
        journal.runs.len()
    );
    if let Some(dir) = std::env::var_os("SIM_TRACE") {
        let path = std::path::Path::new(&dir).join(format!("seed-{seed}.trace"));
        std::fs::write(&path, &trace).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    Fingerprint {
        store_events: store.len(),
        deliveries: journal.deliveries.len(),
        handler_runs: journal.runs.len(),
        balance_cycles,
        violations: violations.len(),
        digest: super::hash(&trace),
    }
}

/// Store errors and lost responses from the fleet's first instant, for 2 to 6 s.
fn early_store_faults(fleet: &Fleet, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0ea7_1e56);
    let faults = fleet.faults.clone();
    faults.set_error_rate(rng.random_range(0.1..0.4));
    faults.set_ambiguous_rate(rng.random_range(0.0..0.1));
    let now = Instant::now();
    let until = now + Duration::from_millis(rng.random_range(2_000..6_000));
    let mut log = fleet.log.lock();
    log.disturbed.push((now, until));
    log.store_faulted.push((now, until));
    drop(log);
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        faults.set_error_rate(0.0);
        faults.set_ambiguous_rate(0.0);
    });
}

/// Waits (at most two minutes) until everything owed was delivered; with a sink that keeps
/// positions, until every owed output is in it or will be at the graceful stop.
async fn drain(fleet: &Fleet, records: &BTreeMap<ShardId, Vec<Record>>, start: &Start) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let openings = openings(fleet, records, start);
        let outstanding: usize = {
            let journal = fleet.log.lock();
            let undelivered: usize = checks::undelivered(&journal, records, &openings, start)
                .iter()
                .map(|(_, lost, _)| lost.len())
                .sum();
            let unsettled = fleet.sink.as_ref().map_or(0, |sink| {
                let live = |id: &str| fleet.live.contains_key(id);
                checks::unsettled(&journal, (records, &openings, start), sink, live)
            });
            undelivered + unsettled
        };
        if outstanding == 0 {
            return;
        }
        sleep(Duration::from_millis(500)).await;
    }
}

/// Checks the run against every invariant; fills in the counts of what happened.
fn judge(
    fleet: &Fleet,
    records: &BTreeMap<ShardId, Vec<Record>>,
    aged_out: &BTreeMap<ShardId, Vec<Record>>,
    start: &Start,
    (planned, quiet): (bool, (Instant, Instant)),
    stats: &mut Stats,
) -> Vec<String> {
    let journal = fleet.log.lock();
    let store_events = fleet.store.journal();
    let commits = fleet.store.applied_commits();
    let sink = fleet.sink.as_ref().map(SinkEvidence::new);
    output_stats(fleet, &journal, sink.as_ref(), stats);
    stats.refused_checkpoints = journal.attempts.iter().filter(|a| !a.ok).count();
    stats.processors = journal.instances.len();
    stats.deliveries = journal.deliveries.len();
    stats.handler_runs = journal.runs.len();
    stats.handler_runs_cut = journal.runs.iter().filter(|r| r.end.is_none()).count();
    if let Some(poison) = &fleet.poison {
        stats.poison = 1;
        stats.poison_parallel = usize::from(fleet.parallel.is_some());
        stats.poison_parked = usize::from(fleet.parallel.is_some() && poison.park);
        stats.outages = usize::from(journal.outage.is_some());
        stats.redrives = journal.redrives.len();
        stats.replayed = journal.removed.len();
        stats.poison_named = usize::from(fleet.parallel.is_none() && poison.names);
        stats.sink_refused = usize::from(journal.sink_refusals > 0);
        for (_, letter) in &journal.letters {
            let i = match letter.reason {
                kcl_core::failure::Reason::Attempts => 0,
                kcl_core::failure::Reason::Permanent => 1,
                _ => 2,
            };
            stats.letters[i] += 1;
        }
    }
    stats.beyond_tried = journal.beyond_tried;
    let reports = |kind| {
        let reports = journal.problems.reports.iter();
        reports.filter(|r| r.kind == kind).count()
    };
    stats.stalled_reports = reports(kcl_core::ProblemKind::Stalled);
    stats.failing_reports = reports(kcl_core::ProblemKind::Failing);
    stats.unowned_reports = reports(kcl_core::ProblemKind::Unowned);
    let openings = openings(fleet, records, start);
    if start.position == InitialPosition::Latest {
        stats.never_opened = start
            .shards
            .iter()
            .filter(|(key, closed)| {
                !**closed
                    && openings.closed.contains(*key)
                    && !openings.first_lease.contains_key(*key)
            })
            .count();
    }
    stats.aggregated = records
        .values()
        .flatten()
        .filter(|r| kcl_core::aggregation::is_aggregated(&r.data) || r.sub_sequence_number > 0)
        .count();
    stats.mid_aggregate_checkpoints = store_events
        .iter()
        .filter(|e| e.operation == "checkpoint")
        .filter(|e| matches!(&e.lease.checkpoint, Checkpoint::Sequence(s) if s.sub_sequence > 0))
        .count();
    stats.singleton_runs = journal.singleton_runs.len();
    stats.periodic_runs = journal.periodic_runs.len();
    stats.sends = journal.sends.len();
    stats.sends_ok = journal.sends.iter().filter(|s| s.failed.is_none()).count();
    stats.handoffs = store_events
        .iter()
        .filter(|e| {
            e.operation == "take"
                && e.lease
                    .owner
                    .as_ref()
                    .is_some_and(|o| o.as_str() != e.client)
        })
        .count();
    let failover = config().failover_time;
    let shards: Vec<Shard> = fleet
        .stream
        .shards()
        .iter()
        .map(|s| fleet.keys.shard(s))
        .collect();
    let evidence = Evidence {
        journal: &journal,
        store: &store_events,
        shards: &shards,
        records,
        aged_out: &fleet.keys.keyed(aged_out.clone()),
        openings: &openings,
        start,
        failover,
        validity: failover - failover / 10,
        planned,
        parallel: fleet.parallel.is_some(),
        poison: fleet.poison.as_deref(),
        stalled_after: super::problems::STALLED_AFTER,
        max_leases: (fleet.config.max_leases != config().max_leases)
            .then_some(fleet.config.max_leases),
        max_unacknowledged: fleet.config.max_unacknowledged,
        max_in_flight: fleet.parallel,
        // Under fan-out a batch is one pushed event, which max_records does not bound.
        batch: match fleet.config.retrieval {
            kcl_core::Retrieval::Polling => fleet.config.max_records as usize,
            _ => usize::MAX,
        },
        quiet,
        // The holder and every standby may be gone when the faults stop: a slow candidate
        // then takes the last standby row within 4 failover times (two of its polls), and
        // each row ahead within the failover time and a poll.
        singleton_recovery: if fleet.standbys == 0 {
            failover
        } else {
            failover * 4 + (failover + config().taker_interval) * u32::from(fleet.standbys)
        },
        // The failover time plus a poll (the taker interval) and a little scheduling.
        restart_bound: (!fleet.health)
            .then(|| failover + config().taker_interval + Duration::from_millis(200)),
        // With standbys, the line is whole again within 6 failover times of a change (the
        // slow candidates refill its last row within 4).
        line_settle: if fleet.standbys == 0 {
            Duration::ZERO
        } else {
            failover * 6
        },
        standby_row: (fleet.standbys > 0)
            .then(|| ShardId::new(format!("{COORDINATION_PREFIX}sim/standby"))),
        poll: config().taker_interval,
        restart_grace: fleet.config.restart_grace,
        commits: &commits,
        transactional: fleet.outputs.is_some() && sink.is_none(),
        sink: sink.as_ref(),
    };
    stats.stall_windows = checks::stalls(&evidence).len();
    stats.again = checks::again(&evidence);
    stats.kept_judged = checks::kept_judged(&evidence);
    let (violations, sink_counts) = checks::check(&evidence);
    stats.sink_counts = sink_counts;
    violations
}

/// The counts of what the seed's commits of outputs went through.
fn output_stats(
    fleet: &Fleet,
    journal: &super::processor::Journal,
    sink: Option<&SinkEvidence>,
    stats: &mut Stats,
) {
    if let Some(sink) = sink {
        stats.sink_commits = sink.commits.len();
        stats.sink_fenced_off = sink.fenced_off;
        stats.sink_opens = sink.opens;
        // Rows the operator deleted that the shard sync made again.
        let store = fleet.store.journal();
        stats.sink_deletes = journal
            .sink_meddling
            .iter()
            .filter(|m| !m.reset)
            .filter(|m| {
                store
                    .iter()
                    .any(|ev| ev.seq > m.seq && ev.operation == "create" && ev.lease.key == m.shard)
            })
            .count();
        return;
    }
    if fleet.outputs.is_none() {
        return;
    }
    let counts = fleet.store.output_counts();
    let refused = fleet.store.refused_commits();
    let by_row = refused
        .iter()
        .filter(|r| r.reason == kcl_core::memory::Refusal::LeaseRow);
    stats.commits = counts.applied;
    stats.refused_by_row = by_row.clone().count();
    stats.refused_stragglers = by_row.filter(|r| !r.reported).count();
    stats.conflicts = counts.conflicts;
    stats.replays = counts.replays;
    stats.large_stretches = journal.large_stretches;
}

/// Writes the stream's past, sometimes resharding it, and chooses where the fleet starts.
async fn past(stream: &MemoryStream, rng: &mut StdRng, stats: &mut Stats) -> InitialPosition {
    let mut timestamps = Vec::new();
    for _ in 0..rng.random_range(1..=4) {
        for i in 0..rng.random_range(5..30) {
            stream.put(
                &format!("old-{}", rng.random_range(0..40)),
                format!("past-{i}"),
            );
        }
        timestamps.push(stream.now());
        if rng.random_bool(0.5) {
            reshard(stream, rng);
        }
        sleep(Duration::from_millis(rng.random_range(500..4000))).await;
    }
    match rng.random_range(0..10) {
        0..5 => InitialPosition::TrimHorizon,
        5..8 => {
            stats.latest += 1;
            InitialPosition::Latest
        }
        _ => {
            stats.at_timestamp += 1;
            InitialPosition::AtTimestamp(timestamps[rng.random_range(0..timestamps.len())])
        }
    }
}

fn records(stream: &MemoryStream) -> BTreeMap<ShardId, Vec<Record>> {
    stream
        .shards()
        .into_iter()
        .map(|s| {
            let records = super::user_records(stream, &s.id);
            (s.id, records)
        })
        .collect()
}

/// By lease key: where the first iterator on each shard pointed, how and when each was first
/// leased, and which were born of a leased parent.
fn openings(fleet: &Fleet, records: &BTreeMap<ShardId, Vec<Record>>, start: &Start) -> Openings {
    // The stream counts Kinesis records; the checks, user records (aggregates split).
    let first_open = records
        .iter()
        .filter_map(|(k, users)| {
            let shard = fleet.keys.shard_of(k);
            let kinesis = fleet.stream.records(&shard);
            let i = fleet.stream.first_open(&shard)?;
            let user = match kinesis.get(i) {
                Some(at) => users.partition_point(|u| u.sequence_number < at.sequence_number),
                None => users.len(),
            };
            Some((k.clone(), user))
        })
        .collect();
    let mut first_lease = BTreeMap::new();
    for event in fleet
        .store
        .journal()
        .iter()
        .filter(|e| e.operation == "create")
    {
        let created = start.at + (event.at - start.instant);
        let lease = &event.lease;
        first_lease
            .entry(lease.key.clone())
            .or_insert((lease.checkpoint == Checkpoint::Latest, created));
    }
    let tracked = fleet
        .stream
        .shards()
        .iter()
        .map(|s| fleet.keys.shard(s))
        .filter(|s| {
            s.parent_shard_ids
                .iter()
                .any(|p| first_lease.contains_key(p))
        })
        .map(|s| s.id)
        .collect();
    let closed = fleet
        .stream
        .shards()
        .iter()
        .filter(|s| s.closed)
        .map(|s| fleet.keys.of(&s.id))
        .collect();
    Openings {
        first_open,
        first_lease,
        closed,
        tracked,
    }
}

/// Balance: every live worker holds floor(S/W) or ceil(S/W), for two taker cycles running.
/// Balancing by load, where counts may rightly differ: every ready lease held by a live
/// worker, and no lease changing hands, for two taker cycles running.
/// Returns the cycles it took and, if it never held, why.
async fn balance(fleet: &Fleet) -> (u32, Vec<String>) {
    let (mut cycles, mut since_change, mut streak) = (0, 0, 0);
    let mut last = Vec::new();
    let mut ready = BTreeSet::new();
    let by_load = fleet.config.balancing.by == BalanceBy::Load;
    let mut holdings = BTreeMap::new();
    while streak < 2 {
        if since_change == BALANCE_CYCLES || cycles == BALANCE_CYCLES * 6 {
            let mut v = vec![format!(
                "balance: not reached within {since_change} taker cycles of the last change in what is ready ({cycles} since the drain)"
            )];
            v.extend(last);
            return (cycles, v);
        }
        sleep(config().taker_interval).await;
        cycles += 1;
        since_change += 1;
        let now_ready;
        (now_ready, last) = if by_load {
            unplaced(fleet, &mut holdings).await
        } else {
            unbalanced(fleet).await
        };
        if now_ready != ready {
            // A shard ended and its children became ready: progress, not imbalance. Each
            // level of a lineage costs a leader the feed's lag, an assignment and the
            // follower's index lag before anyone holds it.
            ready = now_ready;
            since_change = 0;
        }
        streak = if last.is_empty() { streak + 1 } else { 0 };
    }
    (cycles, Vec::new())
}

/// The lease table, and the keys of its ready shard leases.
async fn ready(fleet: &Fleet) -> (Vec<Lease>, BTreeSet<ShardId>) {
    let leases = fleet.store.list().await.unwrap_or_default();
    let lineage = Lineage::new(&leases);
    let ready = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key) && lineage.is_ready(l))
        .map(|l| l.key.clone())
        .collect();
    (leases, ready)
}

/// Under balancing by load: the ready leases, and those no live worker holds, or a change
/// of hands since `holdings` (updated to what the live workers hold now).
async fn unplaced(
    fleet: &Fleet,
    holdings: &mut BTreeMap<ShardId, String>,
) -> (BTreeSet<ShardId>, Vec<String>) {
    let (_, ready) = ready(fleet).await;
    let now: BTreeMap<ShardId, String> = fleet
        .live
        .iter()
        .flat_map(|(id, m)| {
            let held = m.status.borrow().held.clone();
            held.into_iter().map(move |k| (k, id.clone()))
        })
        .collect();
    let mut violations = Vec::new();
    let missing: Vec<&ShardId> = ready.iter().filter(|k| !now.contains_key(*k)).collect();
    if !missing.is_empty() {
        violations.push(format!(
            "balance (by load): ready leases held by no live worker: {missing:?}"
        ));
    }
    if now != *holdings {
        violations.push(format!(
            "balance (by load): leases still changing hands: {now:?}"
        ));
    }
    *holdings = now;
    (ready, violations)
}

/// What is unbalanced now (empty if balanced).
/// The ready leases, and how the live workers' holdings miss floor(S/W)..=ceil(S/W).
async fn unbalanced(fleet: &Fleet) -> (BTreeSet<ShardId>, Vec<String>) {
    let mut violations = Vec::new();
    let (leases, ready_keys) = ready(fleet).await;
    let ready = ready_keys.len();
    let workers = fleet.live.len();
    let (lo, hi) = (ready / workers, ready.div_ceil(workers));
    let counts: BTreeMap<&String, usize> = fleet
        .live
        .iter()
        .map(|(id, m)| (id, m.status.borrow().held.len()))
        .collect();
    if counts.values().any(|c| !(lo..=hi).contains(c)) {
        violations.push(format!(
            "balance: {ready} ready leases over {workers} workers, held {counts:?}"
        ));
        for l in &leases {
            violations.push(format!(
                "  lease {} owner {:?} counter {} checkpoint {} parents {:?} handoff {:?} load {:?}",
                l.key, l.owner, l.counter, l.checkpoint, l.parent_shard_ids, l.handoff_to, l.load
            ));
        }
    }
    (ready_keys, violations)
}
