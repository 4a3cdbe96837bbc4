//! The cycle of a worker that plans for itself: the whole cycle under
//! [`Coordination::EveryWorker`](crate::Coordination::EveryWorker), and under a leader what a
//! follower or standby holding nothing does to find work and make itself known.
//!
//! Read the whole table, sync shards when due (under `EveryWorker`), grant handoffs asked
//! of this worker, resume the leases it kept through its restart, take what its fair share
//! allows, ask loaded workers for the rest.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{Coordinator, Wiring, take};
use crate::config::{BalanceBy, Liveness, WorkerConfig};
use crate::error::Error;
use crate::lease::taker::{self, Candidate, Holder};
use crate::lease::{Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::types::ShardId;
use crate::worker::problems::ProblemKind;
use crate::worker::view::{Read, View};

/// Whom a worker that plans for itself also works for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// A worker of an `EveryWorker` fleet: it also syncs shards and reports unowned ones.
    Fleet,
    /// A follower or standby looking for work: nothing beyond its own plan.
    Itself,
}

/// One cycle of planning for itself; see the module docs.
pub(super) async fn plan_for_myself<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    w: &Wiring<'_, S, L, F>,
    state: &mut Coordinator,
    how: Read<'_>,
    scope: Scope,
) -> Result<(), Error> {
    let (table, me) = (w.table, &w.table.me);
    let sync = scope == Scope::Fleet;
    let Some(leases) = state
        .sync
        .list_and_sync(w, &mut state.view, &mut state.problems, how, sync)
        .await?
    else {
        return Ok(());
    };
    let (by_key, mut candidates) = state.view.candidates(table, &state.shards, &leases);
    let drained = state.view.is_drained(me);
    take::grant_handoffs(table, &state.shards, drained, &candidates, &by_key).await;
    if !drained {
        resume_kept(w, state.taking(), &mut candidates, &by_key).await;
    }

    let plan = taker::plan(
        me,
        &asked_of(table, scope, &candidates, &by_key),
        table.limits(drained),
    );
    let wanted: Vec<&Lease> = plan
        .take
        .iter()
        .filter_map(|k| by_key.get(k).copied())
        .collect();
    state.taking().take_all(w, &wanted).await;
    if scope == Scope::Fleet {
        // Not what this cycle took: the candidates were read before it took them.
        let waiting: Vec<Candidate> = candidates
            .iter()
            .filter(|c| !plan.take.contains(&c.key))
            .cloned()
            .collect();
        let unowned = unowned(
            &table.config,
            state.shards.len(),
            &state.view,
            &waiting,
            &by_key,
        );
        state.problems.replace(ProblemKind::Unowned, unowned);
        let view = &state.view;
        state
            .scaling
            .lead(table, view, &leases, w.report, false)
            .await;
    }
    if table.config.liveness == Liveness::Heartbeat {
        // Leases naming this worker that it will not take would never expire while its
        // heartbeat goes on: give them back.
        let unwanted = candidates
            .iter()
            .filter(|c| c.holder == Holder::Adoptable && !plan.take.contains(&c.key));
        state
            .heartbeat
            .release_later(unwanted.map(|c| c.key.clone()));
    }
    for key in &plan.request_handoff {
        let Some(observed) = by_key.get(key) else {
            continue;
        };
        if mutation::on(Mutation::StealWithoutHandoff) {
            state.taking().take(w, observed).await;
            continue;
        }
        take::ask_handoff(table, &state.view, observed, me).await;
    }
    w.report.cycle_done();
    Ok(())
}

/// What a worker planning for itself may plan with: everything, except that under a leader
/// balancing by load, a worker looking for work asks only for small leases (under the band):
/// the leader places the others by load, and a count-minded request for a hot lease would
/// undo its move (a worker left empty by a load move would ask it straight back).
fn asked_of(
    table: &crate::worker::table::Table<impl Sized>,
    scope: Scope,
    candidates: &[Candidate],
    by_key: &BTreeMap<&ShardId, &Lease>,
) -> Vec<Candidate> {
    let balancing = &table.config.balancing;
    let by_load = scope == Scope::Itself && balancing.by == BalanceBy::Load;
    let hot = |c: &Candidate| {
        let figure = by_key.get(&c.key).and_then(|l| l.load);
        matches!(c.holder, Holder::Other(_)) && figure.is_some_and(|f| f.units() >= balancing.band)
    };
    // Unless there is nothing else to ask for: a worker that asks for nothing stays unknown
    // to the leader, which then gives it nothing either.
    let small_held = candidates
        .iter()
        .any(|c| matches!(c.holder, Holder::Other(_)) && !hot(c));
    candidates
        .iter()
        .filter(|c| !(by_load && small_held && hot(c)))
        .cloned()
        .collect()
}

/// Resumes every lease this worker kept through its restart (the row names it and carries
/// the mark, see [`WorkerConfig::restart_grace`]), whatever its fair share, up to
/// `max_leases`: they were its own before the restart, and leaving any to expire would move
/// it. Those taken are `Me` in `candidates` from then on.
async fn resume_kept<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    w: &Wiring<'_, S, L, F>,
    mut taking: take::Taking<'_>,
    candidates: &mut [Candidate],
    by_key: &BTreeMap<&ShardId, &Lease>,
) {
    let room = w
        .table
        .config
        .max_leases
        .saturating_sub(taking.shards.len());
    let kept: Vec<&Lease> = candidates
        .iter()
        .filter(|c| c.holder == Holder::Adoptable)
        .filter_map(|c| by_key.get(&c.key).copied())
        .filter(|l| l.restart_grace.is_some())
        .take(room)
        .collect();
    if kept.is_empty() {
        return;
    }
    taking.take_all(w, &kept).await;
    for c in candidates.iter_mut() {
        if taking.shards.holds(&c.key) {
            c.holder = Holder::Me;
        }
    }
}

/// Under `EveryWorker` (no leader plans for the fleet): a worker at its `max_leases`
/// finds the leases that stayed available for two failover times — any worker with
/// room would have taken them within a cycle, so nobody has room.
fn unowned(
    config: &WorkerConfig,
    held: usize,
    view: &View,
    candidates: &[Candidate],
    by_key: &BTreeMap<&ShardId, &Lease>,
) -> BTreeMap<String, String> {
    let full = held >= config.max_leases;
    let (now, long) = (Instant::now(), config.failover_time * 2);
    let observer = &view.observer;
    let waiting = candidates.iter().filter(|c| {
        let available = matches!(
            c.holder,
            Holder::Unowned | Holder::Released | Holder::Expired { .. }
        );
        available
            && by_key
                .get(&c.key)
                .is_some_and(|l| observer.idle(l, now) >= long)
    });
    let report = full && !mutation::on(Mutation::UnownedNeverReported);
    let unowned = waiting.filter(|_| report).map(|c| {
        let why = "ready to be processed, but no worker took it (max_leases)";
        (c.key.to_string(), why.to_owned())
    });
    unowned.collect()
}
