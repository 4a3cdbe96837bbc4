//! Shards to leases, and the lineage rule: parents finish before children start.
//!
//! Pure functions. `plan` decides which leases to create (parents before children, so a child
//! never exists without the parents it must wait for) and which finished leases to delete
//! (once every child has started, the parent's row has no more use). A shard whose child
//! already has a lease is not created again: it was finished and cleaned up.

use std::collections::{BTreeMap, BTreeSet};

use super::Lease;
use crate::source::Shard;
use crate::types::{Checkpoint, InitialPosition, ShardId};

/// What a shard sync should write.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncPlan {
    /// Leases to create, parents first.
    pub(crate) create: Vec<Lease>,
    /// Finished leases whose children have all started.
    pub(crate) delete: Vec<Lease>,
}

pub(crate) fn plan(shards: &[Shard], leases: &[Lease], initial: &InitialPosition) -> SyncPlan {
    let by_key: BTreeMap<&ShardId, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
    let listed: BTreeMap<&ShardId, &Shard> = shards.iter().map(|s| (&s.id, s)).collect();
    let mut children: BTreeMap<&ShardId, Vec<&ShardId>> = BTreeMap::new();
    for s in shards {
        for p in &s.parent_shard_ids {
            children.entry(p).or_default().push(&s.id);
        }
    }

    // Topological order: a shard comes after every listed parent.
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

    let mut create = Vec::new();
    let mut will_exist: BTreeSet<&ShardId> = by_key.keys().copied().collect();
    for s in ordered {
        if by_key.contains_key(&s.id) {
            continue;
        }
        if has_descendant_lease(&s.id, &children, &by_key) {
            continue;
        }
        // A child of a shard we track starts at its beginning whatever the initial position,
        // or the records written between the parent's end and now would be skipped.
        let checkpoint = if s.parent_shard_ids.iter().any(|p| will_exist.contains(p)) {
            Checkpoint::TrimHorizon
        } else {
            Checkpoint::initial(initial)
        };
        let mut lease = Lease::new(s.id.clone(), checkpoint);
        lease.parent_shard_ids = s.parent_shard_ids.clone();
        lease.hash_key_range = Some(s.hash_key_range);
        will_exist.insert(&s.id);
        create.push(lease);
    }

    let delete = leases
        .iter()
        .filter(|l| {
            l.is_finished()
                && !l.child_shard_ids.is_empty()
                && l.child_shard_ids.iter().all(|c| {
                    by_key
                        .get(c)
                        .is_some_and(|child| child.checkpoint.has_progress())
                })
        })
        .cloned()
        .collect();
    SyncPlan { create, delete }
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

/// True if a lease may be processed now: not finished, and every parent either finished or
/// gone (cleaned up, or aged out of the stream before we tracked it).
pub(crate) fn is_ready(lease: &Lease, by_key: &BTreeMap<&ShardId, &Lease>) -> bool {
    !lease.is_finished()
        && lease
            .parent_shard_ids
            .iter()
            .all(|p| by_key.get(p).is_none_or(|parent| parent.is_finished()))
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
        let by_key = all.iter().map(|l| (&l.key, l)).collect();
        assert!(!is_ready(&c, &by_key));
        let all = [a, c.clone()];
        let by_key = all.iter().map(|l| (&l.key, l)).collect();
        assert!(is_ready(&c, &by_key), "a parent without a lease is done");
        assert!(
            !is_ready(&all[0], &by_key),
            "finished leases are not processed"
        );
    }
}
