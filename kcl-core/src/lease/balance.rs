//! Balancing by load: which leases the leader asks to move, a pure function of the loads it
//! read (see [`load`](super::load) for what a load is, and [`Balancing`](crate::Balancing) for
//! the settings).
//!
//! Each worker's *level* is its load per unit of capacity; the fleet's *mean* is all load over
//! all capacity. While a worker that can give a lease is above the mean by more than the band
//! (absolute: a quiet fleet, whose levels are all near zero, never moves), the leader picks,
//! among its leases not moved lately and every worker with room, the single move that lowers
//! the pair's higher level the most, highest worker first, and makes it if that is more than
//! the band, up to the move budget; between moves that lower it alike (a lease the giver can
//! hand to several workers), the one after which, with the best next move, the highest
//! level is lowest, so that a lease does not take the room a hotter one needs. When no
//! single move is worth it (a hot lease that fits only on a worker whose own leases must make
//! room), a swap of two leases between two workers is, if it gains two bands: it counts as
//! two moves. A move must be worth the band because the figures are noisy, and a move that
//! fixes less may fix nothing and be undone by the next noise. So a lease carrying a band or
//! less never moves for load, and each move lowers the fleet's spread (the sum of
//! load² / capacity over workers) by at least the moved load × the band: at steady load
//! moves cannot go round in circles.
//!
//! A worker gives leases for load only once it has been above the band for a whole move
//! window: a burst shorter than that (a minute at the defaults, on top of the smoothing's
//! minute) moves nothing. It then goes on giving until it is down to half the band, so a
//! fleet balanced once sits half a band below where noise would start anything again.
//!
//! Only figures that hold still are acted on. A figure still climbing after a change of
//! load or in a burst, or decaying after one, is half a figure: a lease moved on it lands
//! where it does not fit, and stickiness then keeps it there. So a lease moves for load only
//! if its figure is *steady* (it did not move by half a band or more within the last move
//! window, see `weigh::Anchors`); a worker gives none while its leases' figures fell by half
//! a band or more in all within the window (it may be lower than it shows), and receives
//! none while they climbed as much (it may be higher). A change of load is acted on once the
//! smoothing has caught up with it; a burst, however long, moves nothing while it lasts.
//!
//! The small leases (under the band) are then spread by count, as
//! [`BalanceBy::Count`](crate::BalanceBy::Count) does, but only onto workers that have been
//! half a band below the mean (or, in a quiet fleet, within a quarter of a band of idle) for
//! a whole move window, and gave no lease for load within the stickiness window (nor since,
//! while any lease carries more than the band), never lifting one above half the band,
//! counting small leases only: an idle fleet, or one of many small leases, still gives
//! leases to a new worker; a worker holding one hot lease is not given cold ones that would
//! lift it over the band; a load move is not followed by count moves; noise at the edge
//! moves nothing. The two passes move different leases, so they
//! never undo each other.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

/// One worker as the balancer sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Level {
    /// The load of its leases (and of handoffs on their way to it), in units.
    pub(crate) load: f64,
    /// Its capacity, in units (1: a standard worker).
    pub(crate) capacity: f64,
    /// Its leases, counted as the load is.
    pub(crate) count: usize,
    /// It has been above the band for a whole move window already, and not yet down to half
    /// of it (see the module docs); only such a worker gives leases for load.
    pub(crate) sustained: bool,
    /// It has been low enough (see `low`) for a whole move window, and gave no lease for
    /// load within the stickiness window (nor since, while any lease carries more than the
    /// band): only such a worker receives small leases by count.
    pub(crate) may_take: bool,
    /// Its leases' figures may be climbing (they moved up by half a band or more in all
    /// within the last move window, or one is new): its level may be higher than it shows,
    /// so it receives no lease for load (see the module docs).
    pub(crate) rising: bool,
    /// Its leases' figures may be falling: its level may be lower than it shows, so it
    /// gives no lease for load.
    pub(crate) falling: bool,
}

impl Level {
    fn level(&self) -> f64 {
        self.load / self.capacity
    }
}

/// A lease the balancer may move.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Movable<'a> {
    pub(crate) holder: &'a WorkerId,
    pub(crate) key: &'a ShardId,
    /// Its load, in units.
    pub(crate) load: f64,
    /// Known not to have moved within the stickiness window (the leader watched it that
    /// long): only such a lease moves for load.
    pub(crate) settled: bool,
    /// Seen moving within the stickiness window: not spread by count either.
    pub(crate) recent: bool,
    /// Its figure has not moved by half a band or more within the last move window.
    pub(crate) steady: bool,
}

/// The bounds of one round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Units of load per unit of capacity above the mean that a worker may carry.
    pub(crate) band: f64,
    /// Load moves left in the current window.
    pub(crate) budget: usize,
    /// Most count moves one worker receives in a round.
    pub(crate) max_steal: usize,
}

/// Leases by worker.
pub(crate) type Load<'a> = BTreeMap<&'a WorkerId, usize>;

/// The fleet as the balancer sees it, by worker.
pub(crate) type Levels<'a> = BTreeMap<&'a WorkerId, Level>;

/// A lease and the worker it is to go to.
pub(crate) type Move = (ShardId, WorkerId);

/// Plans the handoffs that balance `levels` within `bounds` (see the module docs); `room`
/// says whether a worker holding `n` leases may receive one. Updates `levels` and `movable`
/// as if the moves were made; returns the moves for load, then those spreading leases that
/// cost nothing.
pub(crate) fn plan<'a>(
    levels: &mut Levels<'a>,
    movable: &mut Vec<Movable<'a>>,
    bounds: Bounds,
    room: &impl Fn(&WorkerId, usize) -> bool,
) -> (Vec<Move>, Vec<Move>) {
    let mut moves = Vec::new();
    let budget = if mutation::on(Mutation::NoMoveBudget) {
        usize::MAX
    } else {
        bounds.budget
    };
    while moves.len() < budget {
        let swaps = budget - moves.len() >= 2;
        let Some((.., step)) = best_step(levels, movable, bounds.band, room, swaps, true) else {
            break;
        };
        moves.extend(make(levels, movable, step));
    }
    let spread = spread_counts(levels, movable, bounds, room);
    (moves, spread)
}

/// The workers above the band now, or, while they are giving leases for load (`giving`: one
/// within the last move window), still above half of it: the leader notes since when, so
/// that only a worker above it for a whole move window gives leases ([`Level::sustained`]),
/// and goes on giving until it is down to half the band. Noise then has half a band to cross before it starts anything again.
pub(crate) fn above<'a>(
    levels: &Levels<'a>,
    band: f64,
    giving: impl Fn(&WorkerId) -> bool,
) -> Vec<&'a WorkerId> {
    let mean = mean(levels);
    let limit = limit(mean, band);
    levels
        .iter()
        .filter(|(w, l)| l.level() > limit || (giving(w) && l.level() > mean + band / 2.0))
        .map(|(w, _)| *w)
        .collect()
}

/// Whether a worker at `level` is low enough to receive small leases by count: half a band
/// below the mean, or (in a quiet fleet) within a quarter of a band of idle. Not merely at
/// the mean: a worker that just gave a lease for load lands near it, and small leases
/// following it would be moves that balance nothing.
fn low(level: f64, mean: f64, band: f64) -> bool {
    level <= (mean - band / 2.0).max(band / 4.0)
}

/// The workers low enough to receive small leases by count (see [`spread_counts`]): the
/// leader notes since when ([`Level::may_take`]).
pub(crate) fn takers<'a>(levels: &Levels<'a>, band: f64) -> Vec<&'a WorkerId> {
    let mean = mean(levels);
    levels
        .iter()
        .filter(|(_, l)| low(l.level(), mean, band))
        .map(|(w, _)| *w)
        .collect()
}

/// The fleet's mean level: all load over all capacity.
pub(crate) fn mean(levels: &Levels<'_>) -> f64 {
    let (load, capacity) = levels
        .values()
        .fold((0.0, 0.0), |(l, c), w| (l + w.load, c + w.capacity));
    if capacity > 0.0 { load / capacity } else { 0.0 }
}

/// How far above the mean a worker may be: the band, absolute (a relative band, as KCL
/// Java's, is a mutation: at a low mean it is noise).
fn limit(mean: f64, band: f64) -> f64 {
    if mutation::on(Mutation::RelativeBand) {
        mean * 1.1
    } else {
        mean + band
    }
}

/// What a move must lower the pair's higher level by: the band (relative to the level, as
/// KCL Java's, under the mutation).
fn worth(level: f64, band: f64) -> f64 {
    if mutation::on(Mutation::RelativeBand) {
        level * 0.05
    } else {
        band + 1e-9
    }
}

/// What the balancer does next: a move, or a swap of two leases between two workers (when
/// no single move is worth it, as when a hot lease fits only on a worker whose own leases
/// must make room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    /// `movable[i]` goes to the worker.
    Move(usize, &'a WorkerId),
    /// `movable[i]` goes to the holder of `movable[j]`, which goes to the holder of `i`.
    Swap(usize, usize),
}

/// A step, what it lowers the pair's higher level by per lease moved, the level it leaves
/// the target at, and a tie-break.
type Scored<'a> = (f64, f64, u64, Step<'a>);

/// Which of two steps is better: the larger gain (to a thousandth), then the target left
/// lower (between two moves that fix the source alike, the one that leaves more room), then
/// the tie-break.
fn order(a: &Scored<'_>, b: &Scored<'_>) -> std::cmp::Ordering {
    let ((ga, la, ta, _), (gb, lb, tb, _)) = (a, b);
    if (ga - gb).abs() > 1e-3 {
        gb.total_cmp(ga)
    } else if (la - lb).abs() > 1e-9 {
        la.total_cmp(lb)
    } else {
        ta.cmp(tb)
    }
}

/// Keeps the better of `best` and `candidate` (see [`order`]).
fn keep<'a>(best: &mut Option<Scored<'a>>, candidate: Scored<'a>) {
    if best.is_none_or(|b| order(&candidate, &b).is_lt()) {
        *best = Some(candidate);
    }
}

/// The step that lowers the highest level most per lease moved: from the highest worker above
/// the band that has one worth making (see the module docs); swaps only if `swaps`; between
/// steps that lower it alike, the one [`ahead`] prefers if `look_ahead`.
fn best_step<'a>(
    levels: &Levels<'a>,
    movable: &[Movable<'a>],
    band: f64,
    room: &impl Fn(&WorkerId, usize) -> bool,
    swaps: bool,
    look_ahead: bool,
) -> Option<Scored<'a>> {
    let mean = mean(levels);
    // The next step [`ahead`] weighs is on the figures as they are.
    let flux_ignored = mutation::on(Mutation::FluxIgnored) || !look_ahead;
    let mut sources: Vec<(&WorkerId, &Level)> = levels
        .iter()
        .filter(|(_, l)| l.sustained && (!l.falling || flux_ignored))
        .filter(|(_, l)| l.level() > mean + band / 2.0)
        .map(|(w, l)| (*w, l))
        .collect();
    sources.sort_by(|a, b| b.1.level().total_cmp(&a.1.level()).then(a.0.cmp(b.0)));
    sources.into_iter().find_map(|(from, source)| {
        let found = best_from(
            from,
            source,
            levels,
            movable,
            band,
            room,
            (swaps, flux_ignored),
        );
        if !look_ahead || found.len() < 2 || mutation::on(Mutation::NoLookAhead) {
            return found.into_iter().next();
        }
        ahead(levels, movable, band, room, found)
    })
}

/// Of steps that lower the source alike (`found`, the best first), the one after which, with
/// the best next step, the highest level is lowest. A lease put where it fits alike may take
/// the room the next one needs: a big worker filled with what a small one had room for. The
/// next step is weighed on the figures as they are, moving or not: what it weighs is where
/// the room will be.
fn ahead<'a>(
    levels: &Levels<'a>,
    movable: &[Movable<'a>],
    band: f64,
    room: &impl Fn(&WorkerId, usize) -> bool,
    found: Vec<Scored<'a>>,
) -> Option<Scored<'a>> {
    let gain = found.first()?.0;
    let mut best: Option<Scored<'a>> = None;
    for (_, left, tie, step) in found {
        let (mut levels, mut movable) = (levels.clone(), movable.to_vec());
        make(&mut levels, &mut movable, step);
        if let Some((.., next)) = best_step(&levels, &movable, band, room, false, false) {
            make(&mut levels, &mut movable, next);
        }
        let highest = levels.values().map(Level::level).fold(0.0, f64::max);
        keep(&mut best, (-highest, left, tie, step));
    }
    best.map(|(_, left, tie, step)| (gain, left, tie, step))
}

/// Makes `step` in `levels` and `movable`: the moves it is.
fn make<'a>(levels: &mut Levels<'a>, movable: &mut Vec<Movable<'a>>, step: Step<'a>) -> Vec<Move> {
    match step {
        Step::Move(i, to) => vec![apply(levels, movable, i, to)],
        Step::Swap(i, j) => {
            let (a, b) = (movable[i].holder, movable[j].holder);
            // The later index first: `apply` swap-removes.
            let (first, second) = if i > j {
                ((i, b), (j, a))
            } else {
                ((j, a), (i, b))
            };
            let one = apply(levels, movable, first.0, first.1);
            vec![one, apply(levels, movable, second.0, second.1)]
        }
    }
}

/// The best steps from `from` worth making, the best first (see [`order`]): those within a
/// thousandth of the largest gain, of a lease not moved lately whose figure is steady, to a
/// worker with room whose figures are not climbing.
fn best_from<'a>(
    from: &WorkerId,
    source: &Level,
    levels: &Levels<'a>,
    movable: &[Movable<'a>],
    band: f64,
    room: &impl Fn(&WorkerId, usize) -> bool,
    (swaps, flux_ignored): (bool, bool),
) -> Vec<Scored<'a>> {
    let worth = worth(source.level(), band);
    let free = |m: &Movable<'_>| {
        (m.settled || mutation::on(Mutation::NoStickiness)) && (m.steady || flux_ignored)
    };
    let mut found: Vec<Scored<'a>> = Vec::new();
    for (i, lease) in movable.iter().enumerate() {
        if lease.holder != from || !free(lease) {
            continue;
        }
        let targets = levels
            .iter()
            .filter(|(to, l)| **to != from && (!l.rising || flux_ignored));
        for (to, target) in targets {
            let left = |given: f64| (target.load + lease.load - given) / target.capacity;
            let after = |given: f64| {
                ((source.load - lease.load + given) / source.capacity).max(left(given))
            };
            let gain = source.level() - after(0.0);
            if gain > worth && room(to, target.count) {
                let tie = crate::types::stable_hash((to, lease.key));
                found.push((gain, left(0.0), tie, Step::Move(i, to)));
            }
            if !swaps {
                continue;
            }
            for (j, other) in movable.iter().enumerate() {
                if other.holder != *to || !free(other) || other.load >= lease.load {
                    continue;
                }
                // Two leases move: each must be worth the band.
                let gain = source.level() - after(other.load);
                if gain > worth * 2.0 {
                    let tie = crate::types::stable_hash((lease.key, other.key));
                    let step = Step::Swap(i, j);
                    found.push((gain / 2.0, left(other.load), tie, step));
                }
            }
        }
    }
    let top = found.iter().map(|f| f.0).fold(f64::MIN, f64::max);
    found.retain(|f| top - f.0 <= 1e-3);
    // The best first (no sort: the orders to a thousandth are not total).
    if let Some(first) = (0..found.len()).min_by(|&a, &b| order(&found[a], &found[b])) {
        found.swap(0, first);
    }
    found
}

/// Makes the move of `movable[i]` to `to` in `levels`, and takes it out of `movable`.
fn apply<'a>(
    levels: &mut Levels<'a>,
    movable: &mut Vec<Movable<'a>>,
    i: usize,
    to: &'a WorkerId,
) -> Move {
    let lease = movable.swap_remove(i);
    if let Some(from) = levels.get_mut(lease.holder) {
        from.load -= lease.load;
        from.count = from.count.saturating_sub(1);
    }
    if let Some(to) = levels.get_mut(to) {
        to.load += lease.load;
        to.count += 1;
    }
    (lease.key.clone(), to.clone())
}

/// Spreads the small leases (under the band: no load move takes them) by count (see the
/// module docs): from the worker holding most of them to the one holding fewest among those
/// low enough (see `low`) for a move window, while they are two or more apart and
/// the lease leaves its target within half the band, each receiving at most `max_steal`. Only small leases are counted, so a load move
/// (of a large lease) is never followed by count moves. A lease seen moving lately stays
/// (a lease whose figure hovers at the band must not flip between the passes); one the
/// leader has not watched long enough to know is spread all the same, so that a new leader
/// spreads an idle fleet over a new worker at once.
fn spread_counts<'a>(
    levels: &mut Levels<'a>,
    movable: &mut Vec<Movable<'a>>,
    bounds: Bounds,
    room: &impl Fn(&WorkerId, usize) -> bool,
) -> Vec<Move> {
    let small = bounds.band;
    let mut held: BTreeMap<&WorkerId, usize> = levels.keys().map(|w| (*w, 0)).collect();
    for m in movable.iter().filter(|m| m.load < small) {
        *held.entry(m.holder).or_default() += 1;
    }
    let mut moves = Vec::new();
    let mut received: BTreeMap<&WorkerId, usize> = BTreeMap::new();
    loop {
        let mean = mean(levels);
        let takes = |w: &WorkerId| {
            levels.get(w).is_some_and(|l| {
                room(w, l.count)
                    && low(l.level(), mean, bounds.band)
                    && (l.may_take || mutation::on(Mutation::FluxIgnored))
            }) && received.get(w).copied().unwrap_or(0) < bounds.max_steal
        };
        let Some((to, low)) = held
            .iter()
            .filter(|(w, _)| takes(w))
            .min_by_key(|(w, n)| (**n, **w))
            .map(|(w, n)| (*w, *n))
        else {
            break;
        };
        let spare = |m: &Movable<'_>| m.load < small && !m.recent;
        let gives = |w: &WorkerId| movable.iter().any(|m| m.holder == w && spare(m));
        let Some((from, high)) = held
            .iter()
            .filter(|(w, _)| gives(w))
            .max_by_key(|(w, n)| (**n, Reverse(**w)))
            .map(|(w, n)| (*w, *n))
        else {
            break;
        };
        if high < low + 2 {
            break;
        }
        // Not lifting the target above half the band, where load moves would start.
        let fits = |m: &Movable<'_>| {
            levels
                .get(to)
                .is_some_and(|l| (l.load + m.load) / l.capacity <= mean + bounds.band / 2.0)
        };
        let pick = movable
            .iter()
            .enumerate()
            .filter(|(_, m)| m.holder == from && spare(m) && fits(m))
            .min_by_key(|(_, m)| crate::types::stable_hash((to, m.key)))
            .map(|(i, _)| i);
        let Some(i) = pick else { break };
        moves.push(apply(levels, movable, i, to));
        *received.entry(to).or_default() += 1;
        *held.entry(from).or_default() -= 1;
        *held.entry(to).or_default() += 1;
    }
    moves
}

#[cfg(test)]
mod tests;
