//! Invariants about workers restarted under the same id with a restart grace.

use kcl_core::admin::RESET_OWNER;
use kcl_core::memory::StoreEvent;
use tokio::time::Instant;

use super::Evidence;
use crate::sim::processor::Restart;

/// restart-kept: a worker that stopped gracefully for a restart and came back under the same
/// id within the grace moves none of its leases: each lease its last write marked kept is
/// next taken by that worker, resumed, and by nobody else before. Judged where nothing could
/// keep it from resuming in time: the fleet undisturbed (no store faults, freezes, partitions
/// or suspends) from the mark until a failover time after the return, the worker not crashed
/// or stopped again meanwhile, and no operator reset of the lease first.
pub(super) fn kept(e: &Evidence<'_>, v: &mut Vec<String>) {
    for (restart, back, mark) in judged(e) {
        let worker = restart.worker.as_str();
        let next = e.store.iter().find(|ev| {
            ev.seq > mark.seq
                && ev.lease.key == mark.lease.key
                && (ev.operation == "take" || ev.client == RESET_OWNER)
        });
        match next {
            Some(ev) if ev.client == RESET_OWNER => {}
            Some(ev)
                if ev.client == worker
                    && ev.lease.owner.as_ref().is_some_and(|o| o.as_str() == worker) => {}
            Some(ev) => v.push(format!(
                "restart-kept: {worker} came back {:?} after keeping {} for its restart, but {} took it for {:?} {:?} after the mark",
                back - mark.at,
                mark.lease.key,
                ev.client,
                ev.lease.owner,
                ev.at - mark.at
            )),
            None => v.push(format!(
                "restart-kept: {worker} came back {:?} after keeping {} for its restart, and never resumed it",
                back - mark.at,
                mark.lease.key
            )),
        }
    }
}

/// How many kept leases `restart-kept` judged.
pub fn kept_judged(e: &Evidence<'_>) -> usize {
    judged(e).len()
}

/// The leases kept through a restart that `restart-kept` judges: the restart, when the
/// worker came back, and the mark (the worker's last write of the lease before it).
fn judged<'a>(e: &'a Evidence<'_>) -> Vec<(&'a Restart, Instant, &'a StoreEvent)> {
    let Some(grace) = e.restart_grace else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for restart in &e.journal.restarts {
        let Some(back) = restart.back else {
            continue;
        };
        let until = back + e.failover;
        let calm = !e
            .journal
            .disturbed
            .iter()
            .any(|(from, to)| *from <= until && restart.stopped <= *to);
        let again = e
            .journal
            .crashes
            .iter()
            .chain(&e.journal.leaves)
            .any(|(w, at)| *w == restart.worker && back <= *at && *at <= until);
        if !calm || again || until > e.quiet.1 {
            continue;
        }
        let marks = e.store.iter().filter(|ev| {
            ev.operation == "checkpoint"
                && ev.client == restart.worker
                && ev.lease.restart_grace.is_some()
                && restart.stopped <= ev.at
                && ev.at <= restart.down
        });
        out.extend(
            marks
                .filter(|mark| back <= mark.at + grace)
                .map(|mark| (restart, back, mark)),
        );
    }
    out
}
