//! Deciding which leases to take: a pure function of what one worker observed.
//!
//! It follows KCL Java's taker: aim at `ceil(leases / workers)`, take available leases first
//! (our own unheld ones, then unowned, then the longest expired), and only when none is
//! available ask the most loaded worker for one. Unlike KCL Java, asking is a *handoff
//! request*: the owner lets its processor checkpoint, then hands the lease over directly, so
//! a rebalance repeats no record that was checkpointed.
//!
//! Workers are known from the owners of live leases and from pending handoff requests, so a
//! worker that holds nothing yet is seen by others as soon as it asks for something.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::types::{ShardId, WorkerId};

/// How one lease looks to the worker planning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// This worker holds it (a running shard consumer).
    Me,
    /// The row names this worker but it is not held here (a handoff to us, or a restart):
    /// adopt it first.
    Adoptable,
    /// No owner, and never had one (a new lease).
    Unowned,
    /// No owner any more: given back (a worker shut down, or gave up a lease it could not
    /// hold).
    Released,
    /// Owned by another worker whose counter has stood still for the failover time; `idle`
    /// is how long it has stood still.
    Expired {
        /// Time since the counter last moved.
        idle: Duration,
        /// The owner named in the row, which has stopped renewing it.
        owner: WorkerId,
    },
    /// Owned by a live worker.
    Other(WorkerId),
}

/// One lease that is ready to be processed (not finished, parents done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The lease key.
    pub(crate) key: ShardId,
    /// Who has it.
    pub(crate) holder: Holder,
    /// A worker that asked for it, if any.
    pub(crate) handoff_to: Option<WorkerId>,
}

/// Bounds on one planning round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most leases this worker may hold.
    pub(crate) max_leases: usize,
    /// Most handoffs requested in one round.
    pub(crate) max_steal: usize,
}

/// What to do this round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Leases to take now (conditional on the observed counter).
    pub(crate) take: Vec<ShardId>,
    /// Leases whose owners are asked to hand them over.
    pub(crate) request_handoff: Vec<ShardId>,
    /// The number of leases this worker aims to hold.
    pub(crate) target: usize,
}

/// The workers known from `leases`, including `me`: owners of live leases, and workers that
/// asked for a live lease (never a reset's placeholder owner, [`RESET_OWNER`](crate::admin::RESET_OWNER)). A request left on an expired lease is stale (its requester may be
/// gone too) and does not count.
pub(crate) fn workers<'a>(me: &'a WorkerId, leases: &'a [Candidate]) -> BTreeSet<&'a WorkerId> {
    let mut set = BTreeSet::from([me]);
    for c in leases {
        let live = match &c.holder {
            // A reset's placeholder owner is no worker: it never renews, reads nor grants.
            Holder::Other(w) if w.as_str() == super::keys::RESET_OWNER => false,
            Holder::Other(w) => {
                set.insert(w);
                true
            }
            Holder::Me => true,
            _ => false,
        };
        if let (true, Some(w)) = (live, &c.handoff_to) {
            set.insert(w);
        }
    }
    set
}

/// The fair share for `me`: `ceil(leases / workers)`, at most `max_leases`.
pub(crate) fn target(me: &WorkerId, leases: &[Candidate], max_leases: usize) -> usize {
    leases
        .len()
        .div_ceil(workers(me, leases).len())
        .min(max_leases)
}

/// Plans one round for `me`. See the module docs.
pub(crate) fn plan(me: &WorkerId, leases: &[Candidate], limits: Limits) -> Plan {
    let target = target(me, leases, limits.max_leases);
    let mine = leases.iter().filter(|c| c.holder == Holder::Me).count();
    let mut load: BTreeMap<&WorkerId, usize> = BTreeMap::new();
    for c in leases {
        if let Holder::Other(w) = &c.holder {
            *load.entry(w).or_default() += 1;
        }
    }
    // A request counts as incoming while its owner is above the lower fair share and so may
    // still grant it (see `handoffs_to_grant`); otherwise we look elsewhere.
    let floor = leases.len() / workers(me, leases).len();
    let incoming = leases
        .iter()
        .filter(|c| c.handoff_to.as_ref() == Some(me))
        .filter(
            |c| matches!(&c.holder, Holder::Other(w) if load.get(w).is_some_and(|n| *n > floor)),
        )
        .count();
    let mut plan = Plan {
        target,
        ..Plan::default()
    };
    let Some(need) = target.checked_sub(mine + incoming).filter(|n| *n > 0) else {
        return plan;
    };

    let mut available: Vec<&Candidate> = leases
        .iter()
        .filter(|c| {
            matches!(
                c.holder,
                Holder::Adoptable | Holder::Unowned | Holder::Released | Holder::Expired { .. }
            )
        })
        .collect();
    available.sort_by_key(|c| {
        let (rank, idle) = match c.holder {
            Holder::Adoptable => (0, Duration::ZERO),
            Holder::Unowned | Holder::Released => (1, Duration::ZERO),
            Holder::Expired { idle, .. } => (2, idle),
            _ => (3, Duration::ZERO),
        };
        (rank, Reverse(idle), spread(me, &c.key))
    });
    if !available.is_empty() {
        plan.take = available.iter().take(need).map(|c| c.key.clone()).collect();
        return plan;
    }

    // Most loaded first; ties broken by id so that every worker picks the same victim.
    let Some((victim, most)) = load.into_iter().max_by_key(|(w, n)| (*n, Reverse(*w))) else {
        return plan;
    };
    let steal = if most > target {
        need.min(most - target)
    } else if most == target && need >= 2 {
        1
    } else {
        0
    }
    .min(limits.max_steal);
    let mut theirs: Vec<&Candidate> = leases
        .iter()
        .filter(|c| c.holder == Holder::Other(victim.clone()) && c.handoff_to.as_ref() != Some(me))
        .collect();
    theirs.sort_by_key(|c| spread(me, &c.key));
    plan.request_handoff = theirs.iter().take(steal).map(|c| c.key.clone()).collect();
    plan
}

/// How many of the handoff requests on `me`'s leases to grant now: as many as keep `me` at or
/// above the lower fair share `floor(leases / workers)`, counting handoffs already under way.
pub(crate) fn handoffs_to_grant(me: &WorkerId, leases: &[Candidate], in_progress: usize) -> usize {
    let floor = leases.len() / workers(me, leases).len();
    let mine = leases.iter().filter(|c| c.holder == Holder::Me).count();
    mine.saturating_sub(in_progress).saturating_sub(floor)
}

/// A per-worker order over keys, so that workers racing for available leases mostly pick
/// different ones.
fn spread(me: &WorkerId, key: &ShardId) -> u64 {
    crate::types::stable_hash((me, key))
}

#[cfg(test)]
mod tests;
