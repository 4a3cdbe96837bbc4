//! What the leader weighs leases by: the figures their rows carry, scaled to the totals
//! heartbeat rows carry, the workers' capacities, and what the leader remembers (moves,
//! triggers); see [`balance`](super::balance) for what it does with them.

use std::collections::BTreeMap;

use super::balance::{Bounds, Level, Levels, Load, Movable};
use super::load::LeaseLoad;
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
    /// The leader's own capacity (its rows may not show it yet).
    pub(crate) capacity: f64,
    /// Each worker's total as its heartbeat row carries it (under heartbeats).
    pub(crate) totals: BTreeMap<WorkerId, LeaseLoad>,
    /// Whether a worker has been above the band for a whole move window (and not back down
    /// to half of it since).
    pub(crate) sustained: &'a dyn Fn(&WorkerId) -> bool,
    /// Whether a worker was above the band at the last round (or above half of it since).
    pub(crate) was_above: &'a dyn Fn(&WorkerId) -> bool,
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
            capacity: 1.0,
            totals: BTreeMap::new(),
            sustained: &|_| false,
            was_above: &|_| false,
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
        let shown = figures.get(&c.key).filter(|_| at == holder && at != me);
        if let Some(figure) = shown.filter(|_| !weighing.totals.contains_key(holder)) {
            level.capacity = figure.capacity();
        }
    }
    let movable = movable
        .into_iter()
        .map(|(holder, key)| Movable {
            holder,
            key,
            load: scaled(key, holder),
            settled: (weighing.settled)(key),
            recent: (weighing.recent)(key),
        })
        .collect();
    (levels, movable)
}
