//! Shards to leases, and the lineage rule: parents finish before children start.
//!
//! Pure functions. `plan` decides which leases to create (parents before children, so a child
//! never exists without the parents it must wait for) and which to delete (a finished parent
//! once every child has started: its row has no more use; a finished lease of a shard the
//! stream no longer lists). A shard with a descendant lease is not created again: it was
//! finished and cleaned up.
//!
//! Where a new lease starts (as KCL Java's shard syncer decides it):
//! - `TRIM_HORIZON`: every shard at its beginning.
//! - `AT_TIMESTAMP`: every shard at the timestamp, children of tracked shards included (their
//!   records before it are not wanted either), with the timestamp pinned in the row.
//! - `LATEST`: a shard descending from a tracked shard starts at its beginning, or the records
//!   written between its parent's end and now would be lost. Any other open shard starts at
//!   `LATEST`. Any other *closed* shard gets no lease at all: everything in it was written
//!   before the consumer started, and its children then count as untracked and start at
//!   `LATEST` too — so a consumer started at `LATEST` on a resharded stream delivers nothing
//!   written before it started.
//!
//! That check runs on a snapshot, and a worker that stalls between reading the table and
//! creating a lease can still bring a cleaned-up parent back. [`Lineage`] catches such a
//! *stale* lease: one whose child has already made progress, which lineage forbids for an
//! unfinished parent. It is never processed, and the next sync deletes it.

use std::collections::{BTreeMap, BTreeSet};

use super::Lease;
use crate::mutation::{self, Mutation};
use crate::source::Shard;
use crate::types::{Checkpoint, InitialPosition, ShardId};

/// What a shard sync should write.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncPlan {
    /// Leases to create, parents first.
    pub(crate) create: Vec<Lease>,
    /// Finished leases whose children have all started, and stale ones (see [`Lineage`]).
    pub(crate) delete: Vec<Lease>,
}

/// What a shard sync should write, given the stream's shards and the lease table.
#[cfg(test)]
pub(crate) fn plan(shards: &[Shard], leases: &[Lease], initial: &InitialPosition) -> SyncPlan {
    plan_for(shards, leases, &|_| *initial)
}

/// As `plan`, with each shard's new lease starting where `initial` says (the streams of a
/// [`MultiStreamSource`](crate::multi_stream::MultiStreamSource) each have their own).
pub(crate) fn plan_for(
    shards: &[Shard],
    leases: &[Lease],
    initial: &dyn Fn(&ShardId) -> InitialPosition,
) -> SyncPlan {
    let by_key: BTreeMap<&ShardId, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
    let listed: BTreeMap<&ShardId, &Shard> = shards.iter().map(|s| (&s.id, s)).collect();
    let mut children: BTreeMap<&ShardId, Vec<&ShardId>> = BTreeMap::new();
    for s in shards {
        for p in &s.parent_shard_ids {
            children.entry(p).or_default().push(&s.id);
        }
    }

    let mut create = Vec::new();
    let mut will_exist: BTreeSet<&ShardId> = by_key.keys().copied().collect();
    for s in parents_first(shards, &listed) {
        if by_key.contains_key(&s.id) {
            continue;
        }
        if has_descendant_lease(&s.id, &children, &by_key) {
            continue;
        }
        let tracked_parent = s.parent_shard_ids.iter().any(|p| will_exist.contains(p));
        let (checkpoint, start_timestamp) = match initial(&s.id) {
            InitialPosition::TrimHorizon => (Checkpoint::TrimHorizon, None),
            InitialPosition::AtTimestamp(t) => (Checkpoint::AtTimestamp, Some(t)),
            InitialPosition::Latest
                if tracked_parent && !mutation::on(Mutation::ChildrenAtLatest) =>
            {
                (Checkpoint::TrimHorizon, None)
            }
            InitialPosition::Latest
                if s.closed && !mutation::on(Mutation::ClosedShardsLeasedAtLatest) =>
            {
                continue;
            }
            InitialPosition::Latest => (Checkpoint::Latest, None),
        };
        let mut lease = Lease::new(s.id.clone(), checkpoint);
        lease.start_timestamp = start_timestamp;
        lease.parent_shard_ids = s.parent_shard_ids.clone();
        lease.hash_key_range = Some(s.hash_key_range);
        will_exist.insert(&s.id);
        create.push(lease);
    }

    let delete = to_delete(leases, &by_key, &listed);
    SyncPlan { create, delete }
}

/// `shards` in topological order: a shard comes after every listed parent.
fn parents_first<'a>(shards: &'a [Shard], listed: &BTreeMap<&ShardId, &Shard>) -> Vec<&'a Shard> {
    let mut ordered: Vec<&Shard> = Vec::with_capacity(shards.len());
    let mut placed: BTreeSet<&ShardId> = BTreeSet::new();
    while ordered.len() < shards.len() {
        let before = ordered.len();
        for s in shards {
            if !placed.contains(&s.id)
                && s.parent_shard_ids
                    .iter()
                    .all(|p| placed.contains(p) || !listed.contains_key(p))
            {
                placed.insert(&s.id);
                ordered.push(s);
            }
        }
        if ordered.len() == before {
            break; // a parent cycle cannot happen in Kinesis; never loop on bad input
        }
    }
    ordered
}

/// Leases whose shard is done with: finished with every child started, finished and gone
/// from the stream, or stale (see [`Lineage::is_stale`]).
fn to_delete(
    leases: &[Lease],
    by_key: &BTreeMap<&ShardId, &Lease>,
    listed: &BTreeMap<&ShardId, &Shard>,
) -> Vec<Lease> {
    let lineage = Lineage::new(leases);
    leases
        .iter()
        .filter(|l| {
            let done = l.is_finished()
                && !l.child_shard_ids.is_empty()
                && l.child_shard_ids.iter().all(|c| {
                    by_key
                        .get(c)
                        .is_some_and(|child| child.checkpoint.has_progress())
                });
            let vanished = l.is_finished() && !listed.contains_key(&l.key);
            done || vanished || lineage.is_stale(l)
        })
        .cloned()
        .collect()
}

/// True if any shard descending from `shard` has a lease: then `shard` was processed to its
/// end and cleaned up (its children only get leases once it exists), so it must not return.
fn has_descendant_lease(
    shard: &ShardId,
    children: &BTreeMap<&ShardId, Vec<&ShardId>>,
    by_key: &BTreeMap<&ShardId, &Lease>,
) -> bool {
    let mut stack: Vec<&ShardId> = children.get(shard).cloned().unwrap_or_default();
    let mut seen = BTreeSet::new();
    while let Some(s) = stack.pop() {
        if by_key.contains_key(s) {
            return true;
        }
        if seen.insert(s) {
            stack.extend(children.get(s).into_iter().flatten());
        }
    }
    false
}

/// The parent-child relations of a lease table snapshot.
#[derive(Debug)]
// Public for the simulation (re-exported as `lease::Lineage` with `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Lineage<'a> {
    by_key: BTreeMap<&'a ShardId, &'a Lease>,
    /// Shards that are the parent of a lease that has made progress.
    parents_of_started: BTreeSet<&'a ShardId>,
}

#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
impl<'a> Lineage<'a> {
    /// Indexes `leases`.
    pub fn new(leases: &'a [Lease]) -> Self {
        let by_key = leases.iter().map(|l| (&l.key, l)).collect();
        let parents_of_started = leases
            .iter()
            .filter(|l| l.checkpoint.has_progress())
            .flat_map(|l| &l.parent_shard_ids)
            .collect();
        Self {
            by_key,
            parents_of_started,
        }
    }

    /// True if `lease` may be processed now: not finished, not stale, and every parent either
    /// finished or gone (cleaned up, or aged out of the stream before we tracked it).
    pub fn is_ready(&self, lease: &Lease) -> bool {
        !lease.is_finished()
            && !self.is_stale(lease)
            && lease.parent_shard_ids.iter().all(|p| {
                mutation::on(Mutation::ForgetLineage)
                    || self
                        .by_key
                        .get(p)
                        .is_none_or(|parent| parent.is_finished() || self.is_stale(parent))
            })
    }

    /// True for an unfinished lease whose child has started: it was processed to its end and
    /// cleaned up before, then created again from a stale snapshot. See the module docs.
    pub fn is_stale(&self, lease: &Lease) -> bool {
        !lease.is_finished() && self.parents_of_started.contains(&lease.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::HashKeyRange;

    fn shard(id: &str, parents: &[&str]) -> Shard {
        Shard {
            id: ShardId::new(id),
            parent_shard_ids: parents.iter().map(|p| ShardId::new(*p)).collect(),
            hash_key_range: HashKeyRange::FULL,
            closed: false,
        }
    }

    #[test]
    fn creates_parents_before_children_and_children_from_their_start() {
        let shards = [
            shard("c", &["a", "b"]),
            shard("a", &[]),
            shard("b", &[]),
            shard("d", &["gone"]),
        ];
        let p = plan(&shards, &[], &InitialPosition::Latest);
        let keys: Vec<&str> = p.create.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "d", "c"]);
        assert_eq!(p.create[0].checkpoint, Checkpoint::Latest);
        assert_eq!(
            p.create[2].checkpoint,
            Checkpoint::Latest,
            "parent never tracked"
        );
        assert_eq!(p.create[3].checkpoint, Checkpoint::TrimHorizon);
    }

    #[test]
    fn cleans_up_finished_parents_once_children_started_and_never_recreates_them() {
        let shards = [shard("a", &[]), shard("c", &["a"])];
        let mut parent = Lease::new(ShardId::new("a"), Checkpoint::ShardEnd);
        parent.child_shard_ids = vec![ShardId::new("c")];
        let child = Lease::new(ShardId::new("c"), Checkpoint::TrimHorizon);
        let p = plan(
            &shards,
            &[parent.clone(), child.clone()],
            &InitialPosition::TrimHorizon,
        );
        assert!(p.delete.is_empty(), "child has not started");
        let started = Lease {
            checkpoint: Checkpoint::parse("5", 0).unwrap_or(Checkpoint::ShardEnd),
            ..child
        };
        let p = plan(
            &shards,
            &[parent, started.clone()],
            &InitialPosition::TrimHorizon,
        );
        assert_eq!(p.delete.len(), 1);
        let p = plan(&shards, &[started], &InitialPosition::TrimHorizon);
        assert!(
            p.create.is_empty(),
            "a cleaned-up parent must not come back"
        );
    }

    #[test]
    fn children_wait_for_every_parent() {
        let a = Lease::new(ShardId::new("a"), Checkpoint::ShardEnd);
        let b = Lease::new(ShardId::new("b"), Checkpoint::TrimHorizon);
        let mut c = Lease::new(ShardId::new("c"), Checkpoint::TrimHorizon);
        c.parent_shard_ids = vec![a.key.clone(), b.key.clone()];
        let all = [a.clone(), b, c.clone()];
        assert!(!Lineage::new(&all).is_ready(&c));
        let all = [a, c.clone()];
        let lineage = Lineage::new(&all);
        assert!(lineage.is_ready(&c), "a parent without a lease is done");
        assert!(
            !lineage.is_ready(&all[0]),
            "finished leases are not processed"
        );
    }

    #[test]
    fn a_parent_brought_back_by_a_stale_sync_is_never_processed_and_is_deleted() {
        let shards = [shard("p", &[]), shard("c", &["p"])];
        let zombie = Lease::new(ShardId::new("p"), Checkpoint::TrimHorizon);
        let mut child = Lease::new(
            ShardId::new("c"),
            Checkpoint::parse("7", 0).unwrap_or(Checkpoint::ShardEnd),
        );
        child.parent_shard_ids = vec![ShardId::new("p")];
        let all = [zombie.clone(), child];
        let lineage = Lineage::new(&all);
        assert!(lineage.is_stale(&zombie) && !lineage.is_ready(&zombie));
        assert!(lineage.is_ready(&all[1]));
        let p = plan(&shards, &all, &InitialPosition::TrimHorizon);
        assert_eq!(p.delete, vec![zombie]);
    }

    fn closed(id: &str, parents: &[&str]) -> Shard {
        Shard {
            closed: true,
            ..shard(id, parents)
        }
    }

    #[test]
    fn latest_on_a_fresh_table_leases_only_what_is_open_and_replays_no_history() {
        // p split into a and b before the consumer started; b split again into c and d.
        let shards = [
            closed("p", &[]),
            shard("a", &["p"]),
            closed("b", &["p"]),
            shard("c", &["b"]),
            shard("d", &["b"]),
        ];
        let plan = plan(&shards, &[], &InitialPosition::Latest);
        let created: Vec<(&str, &Checkpoint)> = plan
            .create
            .iter()
            .map(|l| (l.key.as_str(), &l.checkpoint))
            .collect();
        assert_eq!(
            created,
            [
                ("a", &Checkpoint::Latest),
                ("c", &Checkpoint::Latest),
                ("d", &Checkpoint::Latest)
            ],
            "closed shards predate the start; their children are not descendants of a tracked shard"
        );
        let all: Vec<Lease> = plan.create;
        assert!(all.iter().all(|l| Lineage::new(&all).is_ready(l)));
        let again = super::plan(&shards, &all, &InitialPosition::Latest);
        assert!(
            again.create.is_empty(),
            "skipped parents are never created later"
        );
    }

    #[test]
    fn latest_children_of_tracked_shards_start_at_their_beginning() {
        let shards = [closed("p", &[]), shard("a", &["p"]), shard("b", &["p"])];
        let mut parent = Lease::new(ShardId::new("p"), Checkpoint::Latest);
        parent.start_timestamp = chrono::DateTime::from_timestamp(1_700_000_000, 0);
        let plan = plan(&shards, &[parent], &InitialPosition::Latest);
        assert!(
            plan.create
                .iter()
                .all(|l| l.checkpoint == Checkpoint::TrimHorizon)
        );
        assert_eq!(plan.create.len(), 2);
    }

    #[test]
    fn at_timestamp_pins_every_new_lease_children_included() {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        let shards = [closed("p", &[]), shard("a", &["p"]), shard("b", &["p"])];
        let plan = plan(&shards, &[], &InitialPosition::AtTimestamp(at));
        assert_eq!(plan.create.len(), 3);
        for lease in &plan.create {
            assert_eq!(lease.checkpoint, Checkpoint::AtTimestamp);
            assert_eq!(lease.start_timestamp, Some(at));
        }
    }

    #[test]
    fn a_finished_lease_of_a_shard_the_stream_no_longer_has_is_deleted() {
        let shards = [shard("a", &["gone"])];
        let mut vanished = Lease::new(ShardId::new("gone"), Checkpoint::ShardEnd);
        vanished.child_shard_ids = Vec::new(); // ended as vanished: no children known
        let unfinished = Lease::new(ShardId::new("also-gone"), Checkpoint::TrimHorizon);
        let child = Lease::new(ShardId::new("a"), Checkpoint::TrimHorizon);
        let plan = plan(
            &shards,
            &[vanished.clone(), unfinished, child],
            &InitialPosition::TrimHorizon,
        );
        assert_eq!(
            plan.delete,
            vec![vanished],
            "an unfinished one is first ended by its consumer"
        );
    }
}
