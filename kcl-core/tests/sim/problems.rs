//! What the workers report (`Status::problems`), sampled as it changes, and the fleet's room
//! for leases (`max_leases`), capped in some seeds: the evidence of the `stall-reported`,
//! `no-false-stall` and `unowned` invariants (`checks/problems.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kcl_core::lease::Lineage;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Phase, ProblemKind, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use super::fleet::Fleet;
use super::processor::Log;
use super::scenario::config;

/// The fleet's `stalled_after`: short enough that a processor that checkpoints only when it
/// stops, or a handler stuck for 15 to 40 s, is reported within a run.
pub const STALLED_AFTER: Duration = Duration::from_secs(8);

/// How long after the faults stop a capped fleet short of room is given to report the
/// leases it has no room for, before workers are added.
pub const UNOWNED_WITHIN: Duration = Duration::from_secs(40);

/// How long after workers were added (room for every lease) a report of a lease unowned
/// may stand.
pub const UNOWNED_CLEARS: Duration = Duration::from_secs(15);

/// One problem a worker reported, from when it appeared in its `Status` until it was gone
/// (`None`: still there when the run ended).
#[derive(Debug, Clone)]
pub struct Report {
    pub worker: String,
    pub kind: ProblemKind,
    /// The lease key.
    pub key: String,
    pub from: Instant,
    pub until: Option<Instant>,
}

/// When a worker was running (`Phase::Running`): it takes leases, runs cycles and publishes
/// its problems every cycle. Before, and once it shuts down, it does not.
#[derive(Debug, Clone)]
pub struct Running {
    pub worker: String,
    pub from: Instant,
    pub until: Option<Instant>,
}

/// In a capped seed, a look at the fleet while it is left alone after the faults: which
/// leases were ready to be processed, which live worker held each, and how many live workers
/// there were.
#[derive(Debug, Clone)]
pub struct Room {
    pub at: Instant,
    pub ready: BTreeSet<String>,
    /// Ready leases held by a live worker, and by whom.
    pub held: BTreeMap<String, String>,
    pub workers: usize,
}

/// Everything sampled; part of the journal.
#[derive(Debug, Default)]
pub struct Sampled {
    pub reports: Vec<Report>,
    pub running: Vec<Running>,
    /// When each worker led the fleet (`Status::leading`), in the same form.
    pub leading: Vec<Running>,
    /// Capped seeds: the fleet left alone, short of room or not, until workers were added.
    pub rooms: Vec<Room>,
    /// Capped seeds: when the fleet had room for every lease (workers added as needed).
    pub room_from: Option<Instant>,
}

/// Follows a worker's `Status` until the worker is gone: every problem as it appears and
/// goes, and when the worker runs. A stopped worker reports nothing any more (its last
/// `Status` may still list problems).
pub fn sample(worker: &str, mut status: watch::Receiver<Status>, log: Log) {
    let worker = worker.to_owned();
    tokio::spawn(async move {
        let mut open: BTreeMap<(ProblemKind, String), usize> = BTreeMap::new();
        let (mut running, mut leading): (Option<usize>, Option<usize>) = (None, None);
        loop {
            let (phase, now, leads): (Phase, BTreeSet<(ProblemKind, String)>, bool) = {
                let s = status.borrow_and_update();
                let problems = s.problems.iter().map(|p| (p.kind, p.key.clone()));
                (s.phase, problems.collect(), s.leading)
            };
            let live = !matches!(phase, Phase::Stopped);
            note(
                &log,
                &worker,
                &mut open,
                if live { now } else { BTreeSet::new() },
            );
            note_running(&log, &worker, &mut running, phase == Phase::Running);
            // A worker shutting down runs no more cycles, and has handed its role back (or
            // is handing it back) for a successor to lead: it leads nothing, whatever its
            // last cycle's `Status::leading` still says.
            let cycling = live && phase != Phase::ShuttingDown;
            note_leading(&log, &worker, &mut leading, cycling && leads);
            if !live || status.changed().await.is_err() {
                note(&log, &worker, &mut open, BTreeSet::new());
                note_running(&log, &worker, &mut running, false);
                note_leading(&log, &worker, &mut leading, false);
                return;
            }
        }
    });
}

/// Lets every sampler see the last change of its worker's `Status` (a worker that just
/// stopped), so that the journal has its reports closed.
pub async fn settle() {
    sleep(Duration::from_millis(1)).await;
}

/// Opens the reports that appeared and closes those that are gone.
fn note(
    log: &Log,
    worker: &str,
    open: &mut BTreeMap<(ProblemKind, String), usize>,
    now: BTreeSet<(ProblemKind, String)>,
) {
    let at = Instant::now();
    let mut j = log.lock();
    let reports = &mut j.problems.reports;
    open.retain(|problem, i| {
        let keep = now.contains(problem);
        if !keep {
            reports[*i].until = Some(at);
        }
        keep
    });
    for (kind, key) in now {
        open.entry((kind, key.clone())).or_insert_with(|| {
            reports.push(Report {
                worker: worker.to_owned(),
                kind,
                key,
                from: at,
                until: None,
            });
            reports.len() - 1
        });
    }
}

fn note_running(log: &Log, worker: &str, running: &mut Option<usize>, now: bool) {
    note_span(&mut log.lock().problems.running, worker, running, now);
}

fn note_leading(log: &Log, worker: &str, leading: &mut Option<usize>, now: bool) {
    note_span(&mut log.lock().problems.leading, worker, leading, now);
}

/// Opens a span of `worker` in `lives` when `now` turns true, closes it when false.
fn note_span(lives: &mut Vec<Running>, worker: &str, running: &mut Option<usize>, now: bool) {
    let at = Instant::now();
    match (running.as_ref(), now) {
        (None, true) => {
            lives.push(Running {
                worker: worker.to_owned(),
                from: at,
                until: None,
            });
            *running = Some(lives.len() - 1);
        }
        (Some(i), false) => {
            lives[*i].until = Some(at);
            *running = None;
        }
        _ => {}
    }
}

/// A quarter of the seeds cap `max_leases` at 2 to 4; drawn apart, so that the scenario's
/// own draws stay as they were.
pub fn cap(seed: u64) -> Option<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0ca9_1ea5);
    rng.random_ratio(1, 4).then(|| rng.random_range(2..=4usize))
}

/// A capped fleet, once the faults stopped and nothing changes it any more (no joins,
/// leaves, reshards): looks at it every taker interval (see [`Room`]) until it reports the
/// leases it has no room for, or for [`UNOWNED_WITHIN`]; then adds workers (as an operator
/// told "no worker has room" would) until every unfinished lease and every shard still to
/// be leased fits, so that the drain owes every record as in any other seed, and gives the
/// reports up to [`UNOWNED_CLEARS`] to go.
pub async fn make_room(fleet: &mut Fleet, cap: usize) {
    let deadline = Instant::now() + UNOWNED_WITHIN;
    while Instant::now() < deadline {
        sleep(config().taker_interval).await;
        let room = look(fleet);
        let short = room.ready.len().saturating_sub(room.workers * cap);
        let reported = unowned_now(fleet);
        let true_ones = reported
            .iter()
            .filter(|k| room.ready.contains(*k) && !room.held.contains_key(*k));
        let done = true_ones.count() >= short;
        fleet.log.lock().problems.rooms.push(room);
        if done {
            break;
        }
    }
    while fleet.live.len() * cap < needed(fleet) {
        fleet.join();
    }
    let room = Instant::now();
    fleet.log.lock().problems.room_from = Some(room);
    // Time for the reports to clear (`unowned` judges that they do).
    while Instant::now() < room + UNOWNED_CLEARS && !unowned_now(fleet).is_empty() {
        sleep(config().taker_interval).await;
    }
}

/// The leases the live workers report unowned now, as the journal has them (what `unowned`
/// judges).
fn unowned_now(fleet: &Fleet) -> BTreeSet<String> {
    let j = fleet.log.lock();
    let reports = j.problems.reports.iter();
    reports
        .filter(|r| r.kind == ProblemKind::Unowned && r.until.is_none())
        .filter(|r| fleet.live.contains_key(&r.worker))
        .map(|r| r.key.clone())
        .collect()
}

/// The ready leases now, and who of the live workers holds them.
fn look(fleet: &Fleet) -> Room {
    let leases: Vec<_> = fleet
        .store
        .leases()
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key))
        .collect();
    let lineage = Lineage::new(&leases);
    let ready: Vec<_> = leases.iter().filter(|l| lineage.is_ready(l)).collect();
    let held = ready.iter().filter_map(|l| {
        let owner = l.owner.as_ref()?.as_str();
        fleet
            .live
            .contains_key(owner)
            .then(|| (l.key.to_string(), owner.to_owned()))
    });
    Room {
        at: Instant::now(),
        ready: ready.iter().map(|l| l.key.to_string()).collect(),
        held: held.collect(),
        workers: fleet.live.len(),
    }
}

/// At most how many leases may be ready at once from now on: the unfinished ones, and the
/// stream's shards still to be leased (open, or closed with no child leased: a finished
/// parent's lease is deleted once its children started).
fn needed(fleet: &Fleet) -> usize {
    let leases = fleet.store.leases();
    let known: BTreeSet<_> = leases.iter().map(|l| l.key.clone()).collect();
    let unfinished = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key) && !l.is_finished())
        .count();
    let shards: Vec<_> = fleet
        .stream
        .shards()
        .iter()
        .map(|s| fleet.keys.shard(s))
        .collect();
    let unleased = shards.iter().filter(|s| {
        let child_leased = shards
            .iter()
            .any(|c| c.parent_shard_ids.contains(&s.id) && known.contains(&c.id));
        !known.contains(&s.id) && (!s.closed || !child_leased)
    });
    unfinished + unleased.count()
}
