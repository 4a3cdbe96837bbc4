//! Operator actions on a lease table, safe while the fleet runs (the `kcl-admin` CLI).
//!
//! Each is a conditional write through the lease protocol, never a blind overwrite.
//!
//! **Reset** moves a shard's checkpoint (replay after a bug, or skip ahead) in one write
//! ([`LeaseStore::reset`]), conditional on the row's owner and counter as last seen: the
//! lease is taken for the placeholder owner [`RESET_OWNER`] and the new checkpoint written
//! (any pending one dropped) at once. The holder's next renewal or checkpoint fails its
//! condition (the owner changed, so no reconciliation after an uncertain write can mistake
//! the row for its own): it loses the lease, its processor gets `lease_lost`, and no
//! checkpoint of it can overwrite the reset. No reader ever sees the placeholder holding the
//! old checkpoint, and a failed write changes nothing.
//!
//! No worker counts the placeholder as one (the leader places nothing on it, asks nothing of
//! it): a leader reading the row sees a lease held, not a worker to load.
//! The placeholder never renews, so the lease expires a failover time later and a worker
//! takes it from the new checkpoint, as after a crash: by then the old holder's validity has
//! run out, so two workers never read the shard at once, and it delivers nothing more after
//! [`RESET_SETTLES_AFTER`] failover times: the CLI waits that long before it returns, so no
//! worker goes on from the old checkpoint after it did.
//!
//! Under `Liveness::Heartbeat` the holder renews its heartbeat row, not its leases, and its
//! validity is its heartbeat's: it would go on reading past the placeholder's expiry. A
//! lease held by a worker with a heartbeat row is refused (stop that worker first).
//!
//! A finished lease (`SHARD_END`) is refused: its children may have started, and lineage
//! forbids a parent behind its children.
//!
//! **Release** ([`release`]) drains a worker before maintenance, through the handoff
//! protocol and a drain row the leader and the worker honour; [`undo_release`] deletes the
//! row (the worker takes work again, or a row left by a worker that started again under
//! another id is gone).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::error::{BackendError, ErrorKind};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::singleton::{
    drain_key, drained_by, heartbeat_key, heartbeat_of, is_coordination_key, is_worker_row,
};
use crate::types::{Checkpoint, ShardId, WorkerId};

mod redrive;
pub use redrive::{RedrivePlan, plan_redrive, redrive_done, request_redrive};

/// How many failover times after a reset its shard's old holder may still deliver records.
pub const RESET_SETTLES_AFTER: u32 = 1;

pub use crate::lease::keys::RESET_OWNER;

/// Attempts of a reset whose row moves between the read and the take (a renewal).
const ATTEMPTS: usize = 5;

/// Where a reset moves a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetTo {
    /// The new checkpoint.
    pub checkpoint: Checkpoint,
    /// For `LATEST` and `AT_TIMESTAMP`: the moment reading starts at (the reset's own time
    /// for `LATEST`), pinned in the row as a new lease's start is.
    pub pin: Option<DateTime<Utc>>,
}

/// What a reset did: the row it replaced (its checkpoint is where to reset back to, to undo
/// it) and the row as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    /// The row as read before the reset's take.
    pub before: Lease,
    /// The row as the reset wrote it.
    pub after: Lease,
}

/// Moves the checkpoint of `key` to `to`, fenced through the lease (see the module docs).
/// Returns the row it replaced and the row as written.
///
/// # Errors
/// `NotFound` if there is no such lease, `Fatal` for a finished one; the store's error if
/// the write fails other than by the row moving meanwhile (then it reads again and retries;
/// a failed write changed nothing).
pub async fn reset<L: LeaseStore>(
    store: &L,
    key: &ShardId,
    to: &ResetTo,
) -> Result<Reset, BackendError> {
    let placeholder = WorkerId::from(RESET_OWNER);
    let mut done = None;
    for _ in 0..ATTEMPTS {
        let observed = store.get(key).await?.ok_or_else(|| {
            let text = format!("the lease table has no lease {key}");
            BackendError::new(ErrorKind::NotFound, "reset", text)
        })?;
        if let Some(owner) = &observed.owner
            && heartbeat_alive(store, owner).await?
        {
            let text = format!(
                "{key} is held by {owner}, which runs with liveness=heartbeat: it would not see \
                 the reset before its next checkpoint; stop it first (its leases move), or \
                 reset while it holds none"
            );
            return Err(BackendError::new(ErrorKind::Fatal, "reset", text));
        }
        if observed.is_finished() && !mutation::on(Mutation::ResetFinished) {
            let text = format!(
                "{key} is finished (SHARD_END): its children may have started; reset them instead"
            );
            return Err(BackendError::new(ErrorKind::Fatal, "reset", text));
        }
        // One write: the take for the placeholder and the new checkpoint (any pending one
        // dropped), conditional on the owner and counter just read.
        let update = CheckpointUpdate {
            checkpoint: to.checkpoint.clone(),
            pending: None,
            child_shard_ids: Vec::new(),
            start_timestamp: to.pin,
            endpoint: None,
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        };
        match store.reset(&observed, &placeholder, &update).await {
            Ok(row) => {
                done = Some((observed, row));
                break;
            }
            Err(e) if e.kind() == ErrorKind::Conflict => {}
            Err(e) => return Err(e),
        }
    }
    let (before, after) = done.ok_or_else(|| {
        let text = format!("{key} kept changing; try again");
        BackendError::new(ErrorKind::Conflict, "reset", text)
    })?;
    Ok(Reset { before, after })
}

/// Whether `owner` has a heartbeat row naming it (`Liveness::Heartbeat`).
async fn heartbeat_alive<L: LeaseStore>(store: &L, owner: &WorkerId) -> Result<bool, BackendError> {
    let row = store.get(&heartbeat_key(owner)).await?;
    Ok(row.is_some_and(|r| r.is_owned_by(owner)))
}

/// Asks `worker` to hand its leases over and take no more until it starts again (before
/// maintenance; `kcl-admin release`): writes the row `kcl-coordination/drain/<worker>`,
/// which the leader and the worker itself honour (it is given nothing and takes nothing), and
/// asks the worker to hand each of its leases to the least loaded other worker, through the
/// handoff protocol (its processors checkpoint at `shutdown_requested`, nothing is read
/// twice). A worker that starts deletes its drain row. Returns the handoffs asked for.
///
/// # Errors
/// `NotFound` if `worker` shows nowhere in the table (no lease, no handoff to it, no
/// heartbeat row), naming the workers that do; `Fatal` if the worker holds leases and no other worker shows in the table (one holding
/// leases, or with a heartbeat row): nobody would take them (stop the worker instead: a
/// SIGTERM hands them back); the store's error otherwise.
pub async fn release<L: LeaseStore>(
    store: &L,
    worker: &WorkerId,
) -> Result<Vec<(ShardId, WorkerId)>, BackendError> {
    let leases = store.list().await?;
    let mine: Vec<&Lease> = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key) && l.is_owned_by(worker) && !l.is_finished())
        .collect();
    let mut load = others_by_load(&leases, worker);
    // A worker the table does not know (a typo, or one that never ran here): refused, and
    // no drain row written (it would wait for a worker of that name forever).
    let shows = leases.iter().any(|l| {
        l.is_owned_by(worker)
            || l.handoff_to.as_ref() == Some(worker)
            || heartbeat_of(&l.key).as_ref() == Some(worker)
    });
    if !shows {
        let drain_row = leases.iter().any(|l| l.key == drain_key(worker));
        return Err(unknown_worker(worker, &load, drain_row));
    }
    // Workers asked to drain already take nothing: not a place for these leases.
    let drained: Vec<WorkerId> = leases.iter().filter_map(|l| drained_by(&l.key)).collect();
    load.retain(|w, _| !drained.contains(w));
    if !mine.is_empty() && load.is_empty() {
        return Err(nobody_to_take(worker, mine.len(), &drained));
    }
    store
        .create(&Lease::new(drain_key(worker), Checkpoint::TrimHorizon))
        .await?;
    let mut asked = Vec::new();
    for lease in mine {
        let Some(to) = load
            .iter()
            .min_by_key(|(w, n)| (**n, *w))
            .map(|(w, _)| w.clone())
        else {
            break;
        };
        store.request_handoff(lease, Some(&to)).await?;
        *load.entry(to.clone()).or_default() += 1;
        asked.push((lease.key.clone(), to));
    }
    if let Some((_, to)) = asked.first() {
        flag_heartbeat(store, worker, to).await?;
    }
    Ok(asked)
}

/// The workers other than `worker` the table shows, by the shard leases each holds: owners
/// of shard leases, and of the rows a worker holds whether or not it has leases (its
/// heartbeat row, the leader's and the standby's rows).
fn others_by_load(leases: &[Lease], worker: &WorkerId) -> BTreeMap<WorkerId, usize> {
    let mut load: BTreeMap<WorkerId, usize> = BTreeMap::new();
    for lease in leases {
        let Some(owner) = lease.owner.as_ref().filter(|o| *o != worker) else {
            continue;
        };
        if !is_coordination_key(&lease.key) {
            if owner.as_str() != RESET_OWNER {
                *load.entry(owner.clone()).or_default() += 1;
            }
        } else if heartbeat_of(&lease.key).as_ref() == Some(owner) || is_worker_row(&lease.key) {
            load.entry(owner.clone()).or_default();
        }
    }
    load
}

/// `release` of a worker the table does not show, naming those it does (and its drain row,
/// if an earlier release left one).
fn unknown_worker(
    worker: &WorkerId,
    load: &BTreeMap<WorkerId, usize>,
    drain_row: bool,
) -> BackendError {
    let names: Vec<String> = load.keys().map(ToString::to_string).collect();
    let names = if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    };
    let text = if drain_row {
        format!(
            "{worker} holds no lease and has no heartbeat row: only its drain row {} is \
             left, from an earlier release (it has stopped, or started again under another \
             id); `kcl-admin release --worker {worker} --undo` deletes that row. The workers \
             the table shows: {names}",
            drain_key(worker)
        )
    } else {
        format!(
            "no worker {worker} shows in the table (it holds no lease and has no row); the \
             workers it shows: {names}"
        )
    };
    BackendError::new(ErrorKind::NotFound, "release", text)
}

/// The key of the row asking `worker` to drain (`kcl-coordination/drain/<worker>`), which
/// [`release`] writes and the worker deletes when it starts again.
pub fn drain_row(worker: &WorkerId) -> ShardId {
    drain_key(worker)
}

/// The worker a drain row asks to drain, if `key` is one.
pub fn drain_row_of(key: &ShardId) -> Option<WorkerId> {
    drained_by(key)
}

/// Undoes [`release`]: deletes the row asking `worker` to drain, conditionally on the
/// counter read. A running `worker` takes work again at its next read of the table; a drain
/// row left by a worker that started again under another id is gone. Returns whether there
/// was a row.
///
/// # Errors
/// The store's error (a `Conflict` if the row changed between the read and the delete).
pub async fn undo_release<L: LeaseStore>(
    store: &L,
    worker: &WorkerId,
) -> Result<bool, BackendError> {
    let Some(row) = store.get(&drain_key(worker)).await? else {
        return Ok(false);
    };
    store.delete(&row).await?;
    Ok(true)
}

/// `release` of a worker holding `held` leases when no other worker could take them.
fn nobody_to_take(worker: &WorkerId, held: usize, drained: &[WorkerId]) -> BackendError {
    let also = drained.iter().filter(|w| *w != worker);
    let also: Vec<String> = also.map(ToString::to_string).collect();
    let drained = if also.is_empty() {
        String::new()
    } else {
        format!(" ({} drained already)", also.join(", "))
    };
    let text = format!(
        "no other worker shows in the table to take {worker}'s {held} lease(s){drained}: start \
         one first, or stop {worker} (a SIGTERM hands its leases back)"
    );
    BackendError::new(ErrorKind::Fatal, "release", text)
}

/// Raises the flag on `worker`'s heartbeat row, if it has one (`Liveness::Heartbeat`): such a
/// worker reads its leases, and sees the handoff requests, only when it is flagged.
async fn flag_heartbeat<L: LeaseStore>(
    store: &L,
    worker: &WorkerId,
    to: &WorkerId,
) -> Result<(), BackendError> {
    match store.get(&heartbeat_key(worker)).await? {
        Some(row) if row.is_owned_by(worker) && row.handoff_to.is_none() => {
            store.request_handoff(&row, Some(to)).await
        }
        _ => Ok(()),
    }
}

/// Unparks the ordering key `parked_key` (`Parallel::park_keys`; a dead letter's
/// `parked_key`, 16 hex digits) in every lease row that parks it (the shard it was parked in
/// and the children that inherited it), for a redrive: whoever holds each shard sees it in its
/// next renewal (under heartbeats, at its next read of the row: every renewal interval
/// while it parks keys) and runs the key's records again. Put the records back only after that (a
/// renewal interval, a third of the failover time by default), or the holder parks them
/// again. Returns the rows changed.
pub async fn unpark<L: LeaseStore + crate::LeaseStoreExtras>(
    store: &L,
    parked_key: &str,
) -> Result<Vec<ShardId>, BackendError> {
    let prefix = format!("{parked_key}/");
    let mut changed = Vec::new();
    for lease in store.list().await? {
        let entries: Vec<String> = lease
            .parked_keys
            .iter()
            .filter(|e| e.starts_with(&prefix))
            .cloned()
            .collect();
        if entries.is_empty() {
            continue;
        }
        store.unpark(&lease.key, &entries).await?;
        changed.push(lease.key);
    }
    Ok(changed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::lease::LeaseStoreExtras;
    use crate::memory::MemoryLeaseStore;

    async fn held(store: &MemoryLeaseStore, key: &str, owner: &str) {
        let features = crate::lease::TableFeatures::default();
        store.ensure_table(features).await.unwrap();
        let lease = Lease::new(ShardId::from(key), Checkpoint::TrimHorizon);
        assert!(store.create(&lease).await.unwrap());
        let row = store.get(&lease.key).await.unwrap().unwrap();
        store.take(&row, &WorkerId::from(owner)).await.unwrap();
    }

    /// Issue 34, item 5: `release` of a worker the table does not know (a typo) is refused,
    /// naming the workers it knows, and writes no drain row.
    #[tokio::test]
    async fn releasing_an_unknown_worker_is_refused_naming_the_known_ones() {
        let store = MemoryLeaseStore::new();
        held(&store, "s0", "worker-a").await;
        held(&store, "s1", "worker-b").await;
        let err = release(&store, &WorkerId::from("worker-c"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("worker-a") && text.contains("worker-b"),
            "{text}"
        );
        let drain = store.get(&drain_key(&WorkerId::from("worker-c"))).await;
        assert!(drain.unwrap().is_none(), "a drain row was written");
    }

    /// Issue 34, item 7: a reset is one write (the take for the placeholder and the new
    /// checkpoint at once): no reader can see the placeholder holding the old checkpoint,
    /// and a failed write leaves nothing half done. The in-memory store journals its two
    /// effects (a `take`, then a `checkpoint` by the reset's client) at one instant.
    #[tokio::test]
    async fn a_reset_is_one_write() {
        use crate::lease::usage::Operation;
        let store = MemoryLeaseStore::new();
        held(&store, "s0", "worker-a").await;
        let to = ResetTo {
            checkpoint: Checkpoint::Latest,
            pin: None,
        };
        let admin = store.client(RESET_OWNER);
        reset(&admin, &ShardId::from("s0"), &to).await.unwrap();
        let usage = admin.usage().unwrap();
        let writes: Vec<(Operation, u64)> = usage
            .by_operation()
            .into_iter()
            .filter(|(op, t)| !op.is_read() && t.requests > 0)
            .map(|(op, t)| (op, t.requests))
            .collect();
        assert_eq!(writes, vec![(Operation::Reset, 1)], "one write");
        let events: Vec<_> = store
            .journal()
            .into_iter()
            .filter(|ev| ev.client == RESET_OWNER)
            .collect();
        let ops: Vec<&str> = events.iter().map(|ev| ev.operation).collect();
        assert_eq!(ops, ["take", "checkpoint"], "{events:?}");
        assert_eq!(events[0].at, events[1].at, "one instant");
        assert_eq!(events[1].seq, events[0].seq + 1);
        assert_eq!(events[0].lease.checkpoint, Checkpoint::TrimHorizon);
        assert!(events[1].lease.is_owned_by(&WorkerId::from(RESET_OWNER)));
        assert_eq!(events[1].lease.checkpoint, Checkpoint::Latest);
    }

    /// Issue 34, item 6: a reset returns the row it replaced, so that the CLI can print the
    /// checkpoint it moved from (and the reset can be undone).
    #[tokio::test]
    async fn a_reset_returns_the_checkpoint_it_replaced() {
        let store = MemoryLeaseStore::new();
        held(&store, "s0", "worker-a").await;
        let to = ResetTo {
            checkpoint: Checkpoint::Latest,
            pin: None,
        };
        let done = reset(&store, &ShardId::from("s0"), &to).await.unwrap();
        assert_eq!(done.before.checkpoint, Checkpoint::TrimHorizon);
        assert_eq!(done.after.checkpoint, Checkpoint::Latest);
    }
}
