//! What the leader weighs leases by: the figures their rows carry, scaled to the totals
//! heartbeat rows carry, the workers' capacities, and what the leader remembers (moves,
//! triggers); see [`balance`](super::balance) for what it does with them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use super::balance::{Bounds, Level, Levels, Load, Movable};
use super::load::{LeaseLoad, milli};
use super::taker::{Candidate, Holder};
use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

/// What the leader weighs leases by this round (see [`Balancing`](crate::Balancing)).
pub(crate) struct Weighing<'a> {
    /// Loads, or counts only ([`BalanceBy`](crate::BalanceBy)).
    pub(crate) by_load: bool,
    /// The band, the moves left in this window, and `max_steal` for count moves.
    pub(crate) bounds: Bounds,
    /// Each lease's figure as its row carries it (rows without one are left out).
    pub(crate) figures: BTreeMap<ShardId, LeaseLoad>,
    /// Whether a lease is known not to have moved within the stickiness window.
    pub(crate) settled: &'a dyn Fn(&ShardId) -> bool,
    /// Whether a lease was seen moving within the stickiness window.
    pub(crate) recent: &'a dyn Fn(&ShardId) -> bool,
    /// Whether a lease's figure has held still for a move window, or which way it moved
    /// ([`Anchors`]).
    pub(crate) trend: &'a dyn Fn(&ShardId) -> Trend,
    /// Whether a lease's row was written by its holder since it arrived there: only then
    /// does the capacity it shows say the holder's ([`Composition`]).
    pub(crate) written: &'a dyn Fn(&ShardId) -> bool,
    /// The leader's own capacity (its rows may not show it yet).
    pub(crate) capacity: f64,
    /// Each worker's total as its heartbeat row carries it (under heartbeats).
    pub(crate) totals: BTreeMap<WorkerId, LeaseLoad>,
    /// Whether a worker has been above the band for a whole move window (and, while
    /// giving, not down to half of it since).
    pub(crate) sustained: &'a dyn Fn(&WorkerId) -> bool,
    /// Whether a worker gave a lease for load within the last move window: it goes on
    /// giving down to half the band.
    pub(crate) giving: &'a dyn Fn(&WorkerId) -> bool,
    /// Whether a worker has been low enough to receive small leases by count for a whole
    /// move window, and gave no lease for load lately (see `Level::may_take`).
    pub(crate) may_take: &'a dyn Fn(&WorkerId) -> bool,
    /// Whether a worker arrived lately (within a failover time): it is placed leases nobody
    /// holds, but not balanced onto yet (see `leader::assign_within`).
    pub(crate) arriving: &'a dyn Fn(&WorkerId) -> bool,
}

impl Weighing<'_> {
    /// Counts only.
    #[cfg(test)]
    pub(crate) fn counts(max_steal: usize) -> Self {
        Weighing {
            by_load: false,
            bounds: Bounds {
                band: 0.1,
                budget: 0,
                max_steal,
            },
            figures: BTreeMap::new(),
            settled: &|_| true,
            recent: &|_| false,
            trend: &|_| Trend::Steady,
            written: &|_| true,
            capacity: 1.0,
            totals: BTreeMap::new(),
            sustained: &|_| false,
            giving: &|_| false,
            may_take: &|_| true,
            arriving: &|_| false,
        }
    }

    /// Whether loads are weighed this round: asked for, and some lease carries a figure (else
    /// counts, so a fleet of workers that do not measure still converges).
    pub(super) fn by_load(&self) -> bool {
        self.by_load
            && !(self.figures.is_empty() && self.totals.is_empty())
            && !mutation::on(Mutation::LoadIgnored)
    }

    /// `worker`'s level before its leases are added: its capacity as its heartbeat row shows
    /// it (or this leader's own, or 1 until its rows show it), holding `count` leases.
    fn empty_level(&self, me: &WorkerId, worker: &WorkerId, count: usize) -> Level {
        let capacity = match self.totals.get(worker) {
            Some(total) => total.capacity(),
            None if worker == me => self.capacity,
            None => 1.0,
        };
        Level {
            load: 0.0,
            capacity,
            count,
            sustained: (self.sustained)(worker),
            may_take: (self.may_take)(worker),
            rising: false,
            falling: false,
        }
    }

    /// The load of `key` in units: its figure, or the mean figure for a lease without one.
    pub(super) fn load_of(&self, key: &ShardId, fallback: f64) -> f64 {
        self.figures.get(key).map_or(fallback, |f| f.units())
    }
}

/// The levels of the workers in `load` and the loads of the `movable` leases, from the
/// figures in `weighing`: a lease without a figure counts the mean figure, a worker's
/// capacity is the one written on its rows (1 if none shows it). A worker whose heartbeat
/// row carries its total has its leases' figures scaled to that total: under heartbeats a
/// lease's figure moves only with its checkpoints, and a shard gone quiet checkpoints no more.
pub(super) fn weigh<'a>(
    me: &'a WorkerId,
    leases: &'a [Candidate],
    load: &Load<'a>,
    movable: Vec<(&'a WorkerId, &'a ShardId)>,
    weighing: &Weighing<'_>,
) -> (Levels<'a>, Vec<Movable<'a>>) {
    let figures = &weighing.figures;
    #[allow(clippy::cast_precision_loss)]
    let fallback = figures.values().map(|f| f.units()).sum::<f64>() / figures.len().max(1) as f64;
    let holder_of = |c: &'a Candidate| match &c.holder {
        Holder::Me => Some(me),
        Holder::Other(w) if w.as_str() != super::keys::RESET_OWNER => Some(w),
        _ => None,
    };
    // What each holder's leases add up to by their own figures, and how many they are.
    let mut sums: BTreeMap<&WorkerId, (f64, usize)> = BTreeMap::new();
    for c in leases {
        if let Some(holder) = holder_of(c) {
            let sum = sums.entry(holder).or_default();
            sum.0 += weighing.load_of(&c.key, fallback);
            sum.1 += 1;
        }
    }
    let scaled = |key: &ShardId, holder: &WorkerId| {
        let own = weighing.load_of(key, fallback);
        match (weighing.totals.get(holder), sums.get(holder)) {
            (Some(total), Some((sum, _))) if *sum > 0.0 => own * total.units() / sum,
            #[allow(clippy::cast_precision_loss)]
            (Some(total), Some((_, n))) => total.units() / (*n).max(1) as f64,
            _ => own,
        }
    };
    let mut levels: Levels<'a> = load
        .iter()
        .map(|(w, n)| (*w, weighing.empty_level(me, w, *n)))
        .collect();
    let mut drifts: BTreeMap<&WorkerId, (f64, bool)> = BTreeMap::new();
    for c in leases {
        let Some(holder) = holder_of(c) else {
            continue;
        };
        // A handoff under way counts at its target, as in `loads`.
        let at = c
            .handoff_to
            .as_ref()
            .filter(|to| *to != holder && levels.contains_key(to))
            .unwrap_or(holder);
        let Some(level) = levels.get_mut(at) else {
            continue;
        };
        level.load += scaled(&c.key, holder);
        let drift = drifts.entry(at).or_insert((0.0, false));
        match (weighing.trend)(&c.key) {
            Trend::Steady => {}
            Trend::Moving(by) => drift.0 += by,
            Trend::Unknown => drift.1 = true,
        }
        let shown = figures
            .get(&c.key)
            .filter(|_| at == holder && at != me)
            .filter(|_| (weighing.written)(&c.key) || mutation::on(Mutation::StaleTotals));
        if let Some(figure) = shown.filter(|_| !weighing.totals.contains_key(holder)) {
            level.capacity = figure.capacity();
        }
    }
    mark_drifts(&mut levels, drifts, weighing.bounds.band);
    let movable = movable
        .into_iter()
        .map(|(holder, key)| Movable {
            holder,
            key,
            load: scaled(key, holder),
            settled: (weighing.settled)(key),
            recent: (weighing.recent)(key),
            steady: (weighing.trend)(key) == Trend::Steady,
        })
        .collect();
    (levels, movable)
}

/// Marks a worker's level as possibly climbing (falling) while its leases' figures moved up
/// (down) by half a band or more in all within the last move window, or one was first seen.
fn mark_drifts(levels: &mut Levels<'_>, drifts: BTreeMap<&WorkerId, (f64, bool)>, band: f64) {
    for (w, (drift, unknown)) in drifts {
        if let Some(level) = levels.get_mut(w) {
            level.rising = unknown || drift >= band / 2.0;
            level.falling = unknown || drift <= -band / 2.0;
        }
    }
}

/// When each worker's set of leases last changed, as the leader saw it. A heartbeat row's
/// total is the worker's own sum of what it held when it wrote the row: until it writes
/// again after a lease came or went, that total is of another set of leases, and scaling
/// the figures by it would make a worker that just received a lease look as empty as
/// before (and one that just gave one look as full), so that the next move goes the same
/// way. Such a worker's own figures count, unscaled, until its row is written again.
///
/// The same goes for the capacity a row shows: a lease that moved carries its last holder's
/// figure and capacity until its new holder writes it (the leader's assignment and the
/// adoption keep them), and a worker taken for as big as the worker it received a lease from
/// would be given the next one too. A row's capacity counts only once its holder wrote it.
#[derive(Debug, Default)]
pub(crate) struct Composition {
    /// Each lease's owner, and the row's counter when it was seen arriving there (none:
    /// held since before this leader looked).
    owners: BTreeMap<ShardId, (WorkerId, Option<u64>)>,
    changed: BTreeMap<WorkerId, Instant>,
}

impl Composition {
    /// Takes in the owners of `leases` read `now`.
    pub(crate) fn observe(&mut self, leases: &[Lease], now: Instant) {
        let mut owners = BTreeMap::new();
        for lease in leases {
            if super::keys::is_coordination_key(&lease.key) {
                continue;
            }
            let Some(owner) = lease.owner.clone() else {
                continue;
            };
            let arrived = match self.owners.remove(&lease.key) {
                Some((before, arrived)) if before == owner => arrived,
                before => {
                    self.changed.insert(owner.clone(), now);
                    before.map(|(before, _)| {
                        self.changed.insert(before, now);
                        lease.counter
                    })
                }
            };
            owners.insert(lease.key.clone(), (owner, arrived));
        }
        for (gone, _) in std::mem::replace(&mut self.owners, owners).into_values() {
            self.changed.insert(gone, now);
        }
        // A live worker writes its row every renew interval: a change this old is covered.
        self.changed
            .retain(|_, at| now.saturating_duration_since(*at) < COVERED_AFTER);
    }

    /// Whether a total `worker` wrote at `written` is of the leases it holds now.
    pub(crate) fn current(&self, worker: &WorkerId, written: Instant) -> bool {
        self.changed.get(worker).is_none_or(|at| written > *at)
    }

    /// Whether `lease`'s figure and capacity were written by its owner since it arrived:
    /// after the write that moved it, the owner's adoption (a take, which keeps the figure),
    /// then one of its renewals or checkpoints.
    pub(crate) fn written_by_owner(&self, lease: &Lease) -> bool {
        self.owners
            .get(&lease.key)
            .and_then(|(_, arrived)| *arrived)
            .is_none_or(|arrived| lease.counter >= arrived.saturating_add(2))
    }
}

/// How long after a change of its leases a worker's row is surely written again (a live
/// worker writes it every renew interval, a fraction of the failover time).
const COVERED_AFTER: Duration = Duration::from_secs(600);

/// Where each lease's figure stood when it last moved by half a band or more, and since
/// when: the leader's memory of which figures hold still (see
/// [`balance`](super::balance)). One entry a lease, updated from every read of the table.
#[derive(Debug, Default)]
pub(crate) struct Anchors {
    at: BTreeMap<ShardId, Anchor>,
}

#[derive(Debug, Clone, Copy)]
struct Anchor {
    /// When the figure last moved by half a band or more from `anchor`.
    since: Instant,
    anchor: u32,
    latest: u32,
    /// Where the figure stood before it started moving (none: first seen moving).
    origin: Option<u32>,
}

/// Whether a lease's figure holds still, as far as the leader can tell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trend {
    /// Within half a band of where it stood a move window ago.
    Steady,
    /// It moved by half a band or more within the last move window: by this much (units)
    /// since it started moving.
    Moving(f64),
    /// First seen within the last move window.
    Unknown,
}

impl Anchors {
    /// Takes in the figures of `leases` read `now`: a figure half a band or more from its
    /// anchor is anchored afresh (keeping where it started moving, if it was moving within
    /// `window`); leases gone from the table are forgotten.
    pub(crate) fn observe(&mut self, leases: &[Lease], band: f64, window: Duration, now: Instant) {
        let half = milli(band / 2.0);
        let mut seen = BTreeMap::new();
        for lease in leases {
            let Some(figure) = lease.load.map(|l| l.milli) else {
                continue;
            };
            let anchor = match self.at.remove(&lease.key) {
                Some(a) if a.anchor.abs_diff(figure) < half => Anchor {
                    latest: figure,
                    ..a
                },
                Some(a) => {
                    let was_steady = now.saturating_duration_since(a.since) >= window;
                    Anchor {
                        since: now,
                        anchor: figure,
                        latest: figure,
                        origin: if was_steady { Some(a.anchor) } else { a.origin },
                    }
                }
                None => Anchor {
                    since: now,
                    anchor: figure,
                    latest: figure,
                    origin: None,
                },
            };
            seen.insert(lease.key.clone(), anchor);
        }
        self.at = seen;
    }

    /// Whether `key`'s figure has held within half a band of its anchor for `window`, or
    /// how far it moved (a lease without a figure has nothing to wait for).
    pub(crate) fn trend(&self, key: &ShardId, now: Instant, window: Duration) -> Trend {
        match self.at.get(key) {
            None => Trend::Steady,
            Some(a) if now.saturating_duration_since(a.since) >= window => Trend::Steady,
            Some(Anchor {
                origin: Some(origin),
                latest,
                ..
            }) => Trend::Moving((f64::from(*latest) - f64::from(*origin)) / 1000.0),
            Some(_) => Trend::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::taker::{Candidate, Holder};

    fn lease(milli: u32) -> Lease {
        let mut lease = Lease::new(ShardId::new("s"), crate::Checkpoint::TrimHorizon);
        lease.load = Some(LeaseLoad::new(milli, 1000));
        lease
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_rows_capacity_is_its_new_holders_only_once_it_wrote_it() {
        crate::mutation::set_from_env();
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        // `b` (capacity 1) was just given a lease from `a` (capacity 2): the row still
        // carries `a`'s figure and capacity.
        let mut row = Lease::new(ShardId::new("s"), crate::Checkpoint::TrimHorizon);
        row.owner = Some(a.clone());
        row.counter = 5;
        row.load = Some(LeaseLoad::new(500, 2000));
        let mut composition = Composition::default();
        let now = Instant::now();
        composition.observe(std::slice::from_ref(&row), now);
        row.owner = Some(b.clone());
        row.counter = 6;
        composition.observe(std::slice::from_ref(&row), now);
        let candidates = [Candidate {
            key: row.key.clone(),
            holder: Holder::Other(b.clone()),
            handoff_to: None,
        }];
        let weighed = |composition: &Composition, row: &Lease| {
            let written = composition.written_by_owner(row);
            let mut weighing = Weighing::counts(1);
            weighing.figures = row.load.iter().map(|l| (row.key.clone(), *l)).collect();
            let written = move |_: &ShardId| written;
            weighing.written = &written;
            let load: Load<'_> = [(&b, 1)].into();
            let (levels, _) = weigh(&a, &candidates, &load, Vec::new(), &weighing);
            levels[&b].capacity
        };
        assert_eq!(weighed(&composition, &row), 1.0, "not a's capacity");
        // Adopted (a take keeps the row's figure), then renewed by `b` with its own.
        row.counter = 8;
        row.load = Some(LeaseLoad::new(500, 1000));
        composition.observe(std::slice::from_ref(&row), now);
        assert_eq!(weighed(&composition, &row), 1.0);
        row.load = Some(LeaseLoad::new(500, 3000));
        assert_eq!(
            weighed(&composition, &row),
            3.0,
            "once written, the row says"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_total_written_before_a_move_is_not_of_the_leases_held() {
        crate::mutation::set_from_env();
        let w = WorkerId::new("w");
        let mut row = Lease::new(ShardId::new("s"), crate::Checkpoint::TrimHorizon);
        row.owner = Some(WorkerId::new("v"));
        let mut composition = Composition::default();
        let before = Instant::now();
        composition.observe(std::slice::from_ref(&row), before);
        tokio::time::advance(Duration::from_secs(1)).await;
        row.owner = Some(w.clone());
        composition.observe(std::slice::from_ref(&row), Instant::now());
        assert!(
            !composition.current(&w, before),
            "written before the lease came"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(composition.current(&w, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_figure_is_steady_once_it_held_within_half_a_band_for_a_window() {
        let (key, window) = (ShardId::new("s"), Duration::from_secs(60));
        let mut anchors = Anchors::default();
        let mut observe = |milli, at| anchors.observe(&[lease(milli)], 0.1, window, at);
        let start = Instant::now();
        observe(300, start);
        // Noise within half a band keeps the anchor.
        observe(340, start + window / 2);
        // A figure climbing after a change moves it: a window more to wait, and how far it
        // climbed counts from where it stood before.
        let later = start + window * 2;
        observe(360, later);
        observe(420, later + window / 2);
        let moved = |a: &Anchors, at| a.trend(&key, at, window);
        assert_eq!(moved(&anchors, later + window / 2), Trend::Moving(0.12));
        assert_eq!(moved(&anchors, later + window * 2), Trend::Steady);
        anchors.observe(&[], 0.1, window, later);
        assert_eq!(
            moved(&anchors, later),
            Trend::Steady,
            "forgotten: nothing to wait for"
        );
        anchors.observe(&[lease(300)], 0.1, window, later);
        assert_eq!(moved(&anchors, later), Trend::Unknown, "first seen");
    }
}
