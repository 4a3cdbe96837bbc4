//! Shard sync: list the stream's shards and create or clean up leases to match. The leader's
//! work under `Coordination::Leader`, every worker's under `EveryWorker`; any worker syncs a
//! table without leases, so that a new fleet starts from the moment its first worker does.
//!
//! Creating a lease from an old view could bring back a parent that was processed and
//! cleaned up meanwhile, so creation stops once the view of the lease table is older than
//! half the failover time, and a finished parent is deleted only after it stood still for
//! `lease_cleanup_delay`, far longer than that.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::Wiring;
use crate::error::Error;
use crate::lease::observer::Observer;
use crate::lease::sync::{self, Lineage};
use crate::lease::{Lease, LeaseStore};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::ShardId;
use crate::worker::problems::{ProblemKind, Problems};
use crate::worker::table::Table;
use crate::worker::view::{Read, View};

/// When shards are next synced, and what the last read that synced showed ended.
pub(in crate::worker) struct ShardSync {
    next: Instant,
    /// Leases at `SHARD_END` in the last read that synced: one newly there (its shard's
    /// worker may be a follower, which never syncs) makes a sync due at once, so the
    /// children's leases exist a cycle later rather than a `shard_sync_interval` later.
    ended: BTreeSet<ShardId>,
}

impl Default for ShardSync {
    fn default() -> Self {
        Self {
            next: Instant::now(),
            ended: BTreeSet::new(),
        }
    }
}

impl ShardSync {
    /// A shard ended here: its children may be ready, sync at the next cycle.
    pub(in crate::worker) fn now(&mut self) {
        self.next = Instant::now();
    }

    fn is_due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// Makes a sync due at once if `leases` shows a lease newly at `SHARD_END`.
    fn saw(&mut self, leases: &[Lease]) {
        let ended: BTreeSet<ShardId> = leases
            .iter()
            .filter(|l| l.is_finished())
            .map(|l| l.key.clone())
            .collect();
        if !ended.is_subset(&self.ended) {
            self.now();
        }
        self.ended = ended;
    }

    /// Reads the whole table (as `how` says) and, if `sync` (or the table has no leases yet)
    /// and it is due, syncs shards (reading the table again if that changed it). `None` if the
    /// read failed in a way worth retrying next cycle.
    pub(super) async fn list_and_sync<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        view: &mut View,
        problems: &mut Problems,
        how: Read<'_>,
        sync: bool,
    ) -> Result<Option<Vec<Lease>>, Error> {
        let (table, config) = (w.table, &w.table.config);
        let listed_at = Instant::now();
        let listed = view.list(table, w.report, problems, how);
        let Some(mut leases) = listed.await? else {
            return Ok(None);
        };
        if sync {
            self.saw(&leases);
        } else if !leases.is_empty() {
            // Only the worker that syncs compares the stream with the table.
            problems.replace(ProblemKind::Unleased, BTreeMap::new());
        }
        if !(sync || leases.is_empty()) || !self.is_due() {
            return Ok(Some(leases));
        }
        let source = &*w.ctx.source;
        match sync_shards(table, source, &leases, listed_at, &view.observer).await {
            Ok(synced) => {
                // An interrupted sync resumes next cycle: a shard without a lease is a shard
                // nobody reads, and at LATEST what it receives meanwhile is owed.
                let next = if synced.complete {
                    config.shard_sync_interval
                } else {
                    config.taker_interval
                };
                self.next = Instant::now() + next;
                let refused = !synced.refused.is_empty();
                if synced.changed || refused {
                    let listed = view.list(table, w.report, problems, how);
                    if let Some(fresh) = listed.await? {
                        leases = fresh;
                    }
                }
                if synced.complete {
                    let unleased = unleased(table, &leases, synced.refused);
                    problems.replace(ProblemKind::Unleased, unleased);
                }
            }
            Err(error) => {
                let permanent = matches!(
                    &error,
                    Error::Source(e) | Error::Store(e) if e.kind().is_permanent()
                );
                if permanent {
                    return Err(error);
                }
                w.report
                    .problem("listing the stream's shards failed", &error);
                self.next = Instant::now() + config.taker_interval;
            }
        }
        view.heartbeats.clean(table, &view.observer).await;
        Ok(Some(leases))
    }
}

/// What a shard sync did.
#[derive(Debug, Default)]
struct Synced {
    /// It created or deleted a lease.
    changed: bool,
    /// It got through every lease it meant to create.
    complete: bool,
    /// Leases it meant to create whose key a row already holds.
    refused: Vec<ShardId>,
}

/// Lists shards and creates or cleans up leases (see the module docs): what it wrote, and
/// whether every lease due was created. `leases` was read at `listed_at`.
async fn sync_shards<S: ShardSource, L: LeaseStore>(
    table: &Table<L>,
    source: &S,
    leases: &[Lease],
    listed_at: Instant,
    observer: &Observer,
) -> Result<Synced, Error> {
    let config = &table.config;
    let limit = config.call_timeout;
    let shards = bounded(limit, "list_shards", source.list_shards())
        .await
        .map_err(Error::Source)?;
    let configured = config.initial_position;
    let initial = |key: &ShardId| source.initial_position(key).unwrap_or(configured);
    let plan = sync::plan_for(&shards, leases, &initial);
    let mut synced = Synced::default();
    for lease in &plan.create {
        if listed_at.elapsed() > config.failover_time / 2 {
            tracing::debug!("shard sync took too long; creating the rest next cycle");
            return Ok(synced);
        }
        // In order, stopping at the first failure: a child never exists without its parents.
        let created = table.call("create", table.store.create(lease)).await;
        if created.map_err(Error::Store)? {
            tracing::info!(shard = %lease.key, checkpoint = %lease.checkpoint, "lease created");
            synced.changed = true;
        } else {
            synced.refused.push(lease.key.clone());
        }
    }
    let lineage = Lineage::new(leases);
    let now = Instant::now();
    let due = plan
        .delete
        .iter()
        .filter(|l| lineage.is_stale(l) || observer.idle(l, now) >= config.lease_cleanup_delay);
    for lease in due {
        if delete_lease(table, lease, "finished lease cleaned up").await {
            synced.changed = true;
        }
    }
    // Leases of streams no longer consumed (multi-stream): deleted, conditionally on the
    // counter seen, so a holder renewing meanwhile makes it fail until the next sync.
    for lease in leases.iter().filter(|l| source.is_retired(&l.key)) {
        if delete_lease(table, lease, "lease of a stream no longer consumed deleted").await {
            synced.changed = true;
        }
    }
    synced.complete = true;
    Ok(synced)
}

/// Deletes `lease` conditionally on the counter seen (a failure waits for the next
/// sync); logs `done` and returns true if it was deleted.
async fn delete_lease<L: LeaseStore>(table: &Table<L>, lease: &Lease, done: &str) -> bool {
    match table.call("delete", table.store.delete(lease)).await {
        Ok(()) => {
            tracing::info!(shard = %lease.key, "{done}");
            true
        }
        Err(error) => {
            tracing::debug!(shard = %lease.key, %error, "deleting failed; next sync");
            false
        }
    }
}

/// Reports the shards whose lease the sync could not create (a row holds the key) and
/// that `leases`, read after the sync, does not show either.
fn unleased<L: LeaseStore>(
    table: &Table<L>,
    leases: &[Lease],
    refused: Vec<ShardId>,
) -> BTreeMap<String, String> {
    let unreadable: BTreeSet<String> = table
        .store
        .unreadable()
        .into_iter()
        .filter_map(|row| row.key)
        .collect();
    let missing = refused
        .into_iter()
        .filter(|key| leases.iter().all(|l| &l.key != key))
        .map(|key| {
            let why = if unreadable.contains(key.as_str()) {
                "its lease row cannot be read, so nobody processes the shard"
            } else {
                "a row holds its key but no lease shows for it"
            };
            (key.to_string(), why.to_owned())
        });
    missing.collect()
}
