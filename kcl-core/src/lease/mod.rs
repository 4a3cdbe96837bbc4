//! Leases: one row per shard in a shared table, the only coordination between workers.
//!
//! A worker owns a shard while it owns the shard's lease. Ownership is proven by the lease
//! counter: every write is conditional on the counter (and owner) the writer last saw, and
//! bumps it. A worker that cannot renew loses the race to anyone who observed the counter
//! standing still for the failover time. The schema follows KCL Java's lease table so a fleet
//! can migrate without losing checkpoints.

pub(crate) mod balance;
mod extras;
pub mod feed;
mod held;
pub(crate) mod keys;
pub(crate) mod leader;
pub mod load;
pub(crate) mod observer;
pub(crate) mod positions;
pub(crate) mod renewer;
pub(crate) mod sync;
pub(crate) mod taker;
pub(crate) mod tenure;
pub(crate) mod transact;
pub mod usage;
mod validity;
pub(crate) mod weigh;

pub use self::extras::LeaseStoreExtras;
pub use self::load::LeaseLoad;
/// Which leases are ready to be processed (their parents done): what the simulation judges
/// balance by.
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub use self::sync::Lineage;

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::error::BackendError;
use crate::types::{Checkpoint, HashKeyRange, ShardId, WorkerId};

/// One lease row.
///
/// Non-exhaustive: KCL Java's schema grows, and so does this. Make one with [`Lease::new`]
/// and set the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The lease key: the shard id (`leaseKey`).
    pub key: ShardId,
    /// Who holds it (`leaseOwner`); `None` when released or never taken.
    pub owner: Option<WorkerId>,
    /// Bumped by every write; the fence of every conditional write (`leaseCounter`).
    pub counter: u64,
    /// Processing progress (`checkpoint` + `checkpointSubSequenceNumber`).
    pub checkpoint: Checkpoint,
    /// A prepared, not yet committed checkpoint (`pendingCheckpoint`).
    pub pending_checkpoint: Option<Checkpoint>,
    /// Owner changes since the last checkpoint (`ownerSwitchesSinceCheckpoint`).
    pub owner_switches_since_checkpoint: u64,
    /// Parents of the shard (`parentShardId`).
    pub parent_shard_ids: Vec<ShardId>,
    /// Children, written when the shard reaches its end (`childShardIds`).
    pub child_shard_ids: Vec<ShardId>,
    /// Hash keys served by the shard (`startingHashKey`, `endingHashKey`).
    pub hash_key_range: Option<HashKeyRange>,
    /// A worker that asked the owner to hand this lease over (kcl extension, `handoffTo`).
    pub handoff_to: Option<WorkerId>,
    /// Where reading starts while `checkpoint` is still `LATEST` or `AT_TIMESTAMP` (kcl
    /// extension, `startingTimestamp`): the configured timestamp, or for `LATEST` the time the
    /// shard was first opened (less [`max_clock_skew`](crate::WorkerConfig::max_clock_skew)).
    /// Whoever reopens the shard before its first checkpoint reads from here, so nothing
    /// written after the first open is skipped.
    pub start_timestamp: Option<DateTime<Utc>>,
    /// Where the holder of a singleton row takes messages for it (kcl extension,
    /// `kclEndpoint`; see [`singleton::messages`](crate::singleton::messages)).
    pub endpoint: Option<String>,
    /// Ordering keys parked behind a dead-lettered record (kcl extension, `parkedKeys`, a
    /// string set): `{key:016x}/{sequence}/{sub-sequence}` each. Under
    /// [`Parallel::park_keys`](crate::Parallel::park_keys) the shard's later records of these
    /// keys are dead-lettered unrun, by whichever worker holds it; redriving the record
    /// removes its entry.
    pub parked_keys: Vec<String>,
    /// What the lease costs its holder and the holder's capacity, as the holder last wrote
    /// them with a renewal or checkpoint (kcl extensions, `kclLoad` and `kclCapacity`; see
    /// [`load`]). The leader balances by it; `None` in rows written by KCL Java or by
    /// kcl workers that do not measure it.
    pub load: Option<LeaseLoad>,
    /// Kept through its owner's restart (kcl extension, `restartGraceMillis`): the owner
    /// stopped gracefully, expecting to come back under the same id, and asks others to wait
    /// this much longer than the failover time before they take the lease (see
    /// [`WorkerConfig::restart_grace`](crate::WorkerConfig::restart_grace)). Written by the
    /// owner's last write, so that the owner delivers nothing after it; removed by the next
    /// take or release. KCL Java ignores it: its workers take the lease after the failover
    /// time, and leave the attribute on the row.
    pub restart_grace: Option<std::time::Duration>,
    /// On a role row (the leader's, the standby's): the row whose renewals prove its holder
    /// alive, one the holder renews anyway (kcl extension, `kclCarrier`); the role row itself,
    /// or none, when the holder renews the role row (see `worker/roles`).
    pub carrier: Option<ShardId>,
    /// The fence of the tenure that took the row last (kcl extension, `kclFence`): the
    /// counter that take wrote. Written by every kcl take and reset, left alone by
    /// renewals and checkpoints (see [`FencingToken`](crate::FencingToken)). `None` in a row no kcl
    /// worker has taken yet.
    pub fence: Option<crate::types::FencingToken>,
    /// On the fleet-signals row only: the leader's [`FleetSignals`](crate::FleetSignals) as
    /// [`FleetSignals::encode`](crate::FleetSignals::encode) wrote them (kcl extension,
    /// `kclSignals`; see [`autoscale`](crate::autoscale)).
    pub signals: Option<String>,
    /// Records past `checkpoint` that finished already, as the last checkpoint write saw them
    /// (kcl extension, `kclAcked`, a string; see [`SparseAcks`](crate::ack::SparseAcks)):
    /// whoever opens the shard next skips them. Written with every checkpoint write, removed
    /// when none; read only with the checkpoint it was written with.
    pub acked: Option<String>,
}

impl Lease {
    /// A fresh, unowned lease for a shard.
    pub fn new(key: ShardId, checkpoint: Checkpoint) -> Self {
        Self {
            key,
            owner: None,
            counter: 0,
            checkpoint,
            pending_checkpoint: None,
            owner_switches_since_checkpoint: 0,
            parent_shard_ids: Vec::new(),
            child_shard_ids: Vec::new(),
            hash_key_range: None,
            handoff_to: None,
            start_timestamp: None,
            endpoint: None,
            parked_keys: Vec::new(),
            load: None,
            restart_grace: None,
            carrier: None,
            fence: None,
            signals: None,
            acked: None,
        }
    }

    /// True once the shard has been read to its end and checkpointed there.
    pub fn is_finished(&self) -> bool {
        self.checkpoint == Checkpoint::ShardEnd
    }

    /// True if `worker` owns the lease.
    pub fn is_owned_by(&self, worker: &WorkerId) -> bool {
        self.owner.as_ref() == Some(worker)
    }
}

/// The new checkpoint state written by [`LeaseStore::checkpoint`].
///
/// Non-exhaustive: make one with [`CheckpointUpdate::new`] and set the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointUpdate {
    /// The committed checkpoint.
    pub checkpoint: Checkpoint,
    /// The pending (prepared) checkpoint; `None` removes it.
    pub pending: Option<Checkpoint>,
    /// Child shards, written with `SHARD_END`; empty leaves the attribute as it is.
    pub child_shard_ids: Vec<ShardId>,
    /// Pins where a `LATEST` or `AT_TIMESTAMP` lease starts ([`Lease::start_timestamp`]);
    /// `None` leaves the attribute as it is.
    pub start_timestamp: Option<DateTime<Utc>>,
    /// Advertises where a singleton's holder takes messages ([`Lease::endpoint`]); `None`
    /// leaves the attribute as it is.
    pub endpoint: Option<String>,
    /// Entries added to [`Lease::parked_keys`] (the others stay); empty leaves it as it is.
    pub park: Vec<String>,
    /// Marks the lease kept through its owner's restart ([`Lease::restart_grace`]); `None`
    /// leaves the attribute as it is.
    pub restart_grace: Option<std::time::Duration>,
    /// Names the row that carries a role row ([`Lease::carrier`]); `None` leaves the
    /// attribute as it is.
    pub carrier: Option<ShardId>,
    /// Publishes the leader's figures ([`Lease::signals`]); `None` leaves the attribute as
    /// it is.
    pub signals: Option<String>,
    /// The records past `checkpoint` that finished ([`Lease::acked`]); `None` removes the
    /// attribute, for a value goes only with the checkpoint it was written with.
    pub acked: Option<String>,
}

impl CheckpointUpdate {
    /// Commits `checkpoint`, removes any pending one, and leaves the other attributes as
    /// they are.
    pub fn new(checkpoint: Checkpoint) -> Self {
        Self {
            checkpoint,
            pending: None,
            child_shard_ids: Vec::new(),
            start_timestamp: None,
            endpoint: None,
            park: Vec::new(),
            restart_grace: None,
            carrier: None,
            signals: None,
            acked: None,
        }
    }

    /// Applies the update to `lease` as a checkpoint write does, the counter aside (the
    /// in-memory store's checkpoint, a transactional commit's effect on the row).
    pub(crate) fn apply_to(&self, lease: &mut Lease) {
        lease.owner_switches_since_checkpoint = 0;
        lease.checkpoint = self.checkpoint.clone();
        lease.pending_checkpoint = self.pending.clone();
        if !self.child_shard_ids.is_empty() {
            lease.child_shard_ids = self.child_shard_ids.clone();
        }
        if self.start_timestamp.is_some() {
            lease.start_timestamp = self.start_timestamp;
        }
        if self.endpoint.is_some() {
            lease.endpoint.clone_from(&self.endpoint);
        }
        if self.signals.is_some() {
            lease.signals.clone_from(&self.signals);
        }
        if self.carrier.is_some() {
            lease.carrier.clone_from(&self.carrier);
        }
        for entry in &self.park {
            if !lease.parked_keys.contains(entry) {
                lease.parked_keys.push(entry.clone());
            }
        }
        if self.restart_grace.is_some() {
            lease.restart_grace = self.restart_grace;
        }
        lease.acked.clone_from(&self.acked);
    }
}

/// A row of the lease table that the last read could not parse: kcl neither processes nor
/// writes it (see [`LeaseStoreExtras::unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct UnreadableRow {
    /// The row's `leaseKey`, if it has one that is a string.
    pub key: Option<String>,
    /// Why it cannot be parsed (an attribute missing or of the wrong type).
    pub reason: String,
}

impl UnreadableRow {
    /// A row with `key` (if it has one) that cannot be parsed because of `reason`.
    pub fn new(key: Option<String>, reason: impl Into<String>) -> Self {
        Self {
            key,
            reason: reason.into(),
        }
    }
}

/// What a worker's coordination uses of the lease table beyond its rows: asked for in
/// [`LeaseStore::ensure_table`], which answers with those it serves.
///
/// Neither is needed for correctness, only for cost: without an owner index,
/// [`owned_by`](LeaseStore::owned_by) reads the whole table; without a change feed, observers
/// read the whole table every interval instead of its changes.
/// [`Coordination::Leader`](crate::Coordination::Leader) uses both,
/// [`Coordination::EveryWorker`](crate::Coordination::EveryWorker) neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub struct TableFeatures {
    /// An index of leases by owner (DynamoDB: the `leaseOwner` index KCL Java 3.x adds).
    pub owner_index: bool,
    /// A feed of the table's changes (DynamoDB: the table's stream).
    pub change_feed: bool,
}

impl TableFeatures {
    /// Neither feature.
    pub const NONE: Self = Self {
        owner_index: false,
        change_feed: false,
    };

    /// Both features.
    pub const ALL: Self = Self {
        owner_index: true,
        change_feed: true,
    };

    /// With or without the owner index.
    #[must_use]
    pub const fn with_owner_index(mut self, on: bool) -> Self {
        self.owner_index = on;
        self
    }

    /// With or without the change feed.
    #[must_use]
    pub const fn with_change_feed(mut self, on: bool) -> Self {
        self.change_feed = on;
        self
    }

    /// The features of `self` that `other` has too.
    #[must_use]
    pub const fn and(self, other: Self) -> Self {
        Self {
            owner_index: self.owner_index && other.owner_index,
            change_feed: self.change_feed && other.change_feed,
        }
    }
}

impl std::fmt::Display for TableFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.owner_index, self.change_feed) {
            (true, true) => f.write_str("owner index, change feed"),
            (true, false) => f.write_str("owner index"),
            (false, true) => f.write_str("change feed"),
            (false, false) => f.write_str("none"),
        }
    }
}

/// The lease table.
///
/// Every write is conditional. A write whose condition fails returns an error of kind
/// [`Conflict`](crate::ErrorKind::Conflict) and changes nothing. Implementations must keep
/// attributes they do not know (other tools, KCL Java's extras) untouched.
///
/// What a store may offer beyond these operations (a change feed, request accounting, rows it
/// could not parse) is [`LeaseStoreExtras`], whose defaults are true of a store without
/// them: implement it empty for such a store.
///
/// **Wrapping a store** (metrics, tracing, a cache): implement every method of both traits by
/// delegating to the inner store, as the `Arc<L>` implementations do. Only
/// [`owned_by`](Self::owned_by) has a default among the operations: a default of "read the
/// whole table" for [`snapshot`](Self::snapshot) would make a wrapper that forgot it
/// silently pay for a full read instead of a cheaper one. A wrapper that forgets `owned_by`
/// or an extra does the same (or hides its inner store's bill and unreadable rows).
#[doc(alias = "LeaseRefresher")]
pub trait LeaseStore: LeaseStoreExtras {
    /// Creates the lease table if it does not exist, provides what of `wanted` it can (a store
    /// may be told not to change a table managed elsewhere), and waits until the table is
    /// usable. Returns the features of `wanted` it serves; for one it does not, the method
    /// that would use it reads the whole table instead (see [`TableFeatures`]).
    fn ensure_table(
        &self,
        wanted: TableFeatures,
    ) -> impl Future<Output = Result<TableFeatures, BackendError>> + Send;

    /// Every lease, read consistently. Rows that cannot be parsed are skipped, and kept for
    /// [`unreadable`](LeaseStoreExtras::unreadable).
    fn list(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send;

    /// Every lease, read as cheaply as the store can (DynamoDB: an eventually consistent
    /// Scan, half the read units of [`list`](Self::list)), possibly a second or so stale.
    /// For observers, whose takes are conditional anyway (see [`feed`]). A store with no
    /// cheaper read returns [`list`](Self::list); a wrapper delegates.
    fn snapshot(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send;

    /// One lease, read consistently.
    fn get(
        &self,
        key: &ShardId,
    ) -> impl Future<Output = Result<Option<Lease>, BackendError>> + Send;

    /// One lease, read as cheaply as the store can (DynamoDB: an eventually consistent
    /// `GetItem`, half a unit), possibly a second or so stale. For candidates watching a
    /// role row now and then: what they act on is checked by a consistent read or a
    /// conditional write. By default [`get`](Self::get); a wrapper delegates.
    fn peek(
        &self,
        key: &ShardId,
    ) -> impl Future<Output = Result<Option<Lease>, BackendError>> + Send {
        self.get(key)
    }

    /// Creates `lease` unless a lease with its key exists. Returns whether it was created.
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Bumps the counter of a held lease, and writes `held.load` if it is set (the holder's
    /// measure of the lease rides on the renewal: [`load`]). Condition: owner and counter as
    /// in `held`. Returns the lease as stored after the write.
    fn renew(&self, held: &Lease) -> impl Future<Output = Result<Lease, BackendError>> + Send;

    /// Makes `new_owner` the owner. Condition: owner and counter as in `observed`. Bumps the
    /// counter. If the owner changes, counts an owner switch and clears any handoff request;
    /// an adoption (the row names `new_owner` already) keeps it, since the leader may have
    /// asked for the lease to move on before its target took it.
    fn take(
        &self,
        observed: &Lease,
        new_owner: &WorkerId,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send;

    /// Removes the owner so that any worker may take the lease at once. Condition: owner and
    /// counter as in `held`. Bumps the counter, clears any handoff request.
    fn release(&self, held: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Asks the owner to hand the lease over to `to`, or with `None` withdraws or declines
    /// the request. Condition: the owner as in `observed` (not the counter: the owner's own
    /// renewals and checkpoints move it all the time). Leaves the counter alone, so the owner's
    /// writes keep succeeding.
    fn request_handoff(
        &self,
        observed: &Lease,
        to: Option<&WorkerId>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Writes checkpoint state, and `held.load` if it is set (as [`renew`](Self::renew)
    /// does). Condition: owner, counter and checkpoint as in `held` (a transactional commit
    /// moves the checkpoint and leaves the counter alone, so the counter alone would let a
    /// write from before a commit, or a commit that landed late, move the row back behind
    /// the commit's outputs). Bumps the counter and resets the owner-switch count (as KCL
    /// Java does).
    fn checkpoint(
        &self,
        held: &Lease,
        update: &CheckpointUpdate,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send;

    /// An operator's reset ([`admin::reset`](crate::admin::reset)) in one write: makes
    /// `owner` the owner, as [`take`](Self::take) does (any handoff request cleared), and
    /// writes `update`, as [`checkpoint`](Self::checkpoint) does (any pending checkpoint
    /// dropped unless `update` has one). Condition: owner and counter as in `observed`. Bumps
    /// the counter once and resets the owner-switch count. Nobody can read the row between a
    /// take and a checkpoint, since there is none. Counted as a `checkpoint` (the in-memory
    /// store journals its two effects, a `take` then a `checkpoint`, at one instant). No
    /// default: two writes are what it replaces; a wrapper delegates.
    fn reset(
        &self,
        observed: &Lease,
        owner: &WorkerId,
        update: &CheckpointUpdate,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send;

    /// Deletes a lease nobody wrote since `observed` (a finished parent, or a stale lease).
    /// Condition: the counter as in `observed`.
    fn delete(&self, lease: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The keys of the leases whose owner is `owner`, read cheaply and possibly a little stale
    /// (DynamoDB: a query of the `leaseOwner` index). Used by workers that do not read the
    /// whole table every cycle ([`Coordination::Leader`](crate::Coordination::Leader)); what
    /// they do with a key is conditional, so a stale answer costs a failed write, never a
    /// second owner. By default every lease is read ([`list`](Self::list)) and filtered
    /// ([`keys_owned_by`]): a store without an index needs nothing more; a wrapper delegates.
    fn owned_by(
        &self,
        owner: &WorkerId,
    ) -> impl Future<Output = Result<Vec<ShardId>, BackendError>> + Send {
        async move { Ok(keys_owned_by(self.list().await?, owner)) }
    }
}

/// The keys of the leases in `leases` whose owner is `owner`: `owned_by` for a store that
/// can only read the whole table.
pub fn keys_owned_by(leases: Vec<Lease>, owner: &WorkerId) -> Vec<ShardId> {
    leases
        .into_iter()
        .filter(|l| l.is_owned_by(owner))
        .map(|l| l.key)
        .collect()
}

/// A shared store is a store: workers hand `Arc`s of theirs to the singletons they run.
impl<L: LeaseStore> LeaseStore for std::sync::Arc<L> {
    fn ensure_table(
        &self,
        wanted: TableFeatures,
    ) -> impl Future<Output = Result<TableFeatures, BackendError>> + Send {
        (**self).ensure_table(wanted)
    }

    fn list(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send {
        (**self).list()
    }

    fn snapshot(&self) -> impl Future<Output = Result<Vec<Lease>, BackendError>> + Send {
        (**self).snapshot()
    }

    fn get(
        &self,
        key: &ShardId,
    ) -> impl Future<Output = Result<Option<Lease>, BackendError>> + Send {
        (**self).get(key)
    }

    fn peek(
        &self,
        key: &ShardId,
    ) -> impl Future<Output = Result<Option<Lease>, BackendError>> + Send {
        (**self).peek(key)
    }

    fn create(&self, lease: &Lease) -> impl Future<Output = Result<bool, BackendError>> + Send {
        (**self).create(lease)
    }

    fn renew(&self, held: &Lease) -> impl Future<Output = Result<Lease, BackendError>> + Send {
        (**self).renew(held)
    }

    fn take(
        &self,
        observed: &Lease,
        new_owner: &WorkerId,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
        (**self).take(observed, new_owner)
    }

    fn release(&self, held: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send {
        (**self).release(held)
    }

    fn request_handoff(
        &self,
        observed: &Lease,
        to: Option<&WorkerId>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        (**self).request_handoff(observed, to)
    }

    fn checkpoint(
        &self,
        held: &Lease,
        update: &CheckpointUpdate,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
        (**self).checkpoint(held, update)
    }

    fn reset(
        &self,
        observed: &Lease,
        owner: &WorkerId,
        update: &CheckpointUpdate,
    ) -> impl Future<Output = Result<Lease, BackendError>> + Send {
        (**self).reset(observed, owner, update)
    }

    fn delete(&self, lease: &Lease) -> impl Future<Output = Result<(), BackendError>> + Send {
        (**self).delete(lease)
    }

    fn owned_by(
        &self,
        owner: &WorkerId,
    ) -> impl Future<Output = Result<Vec<ShardId>, BackendError>> + Send {
        (**self).owned_by(owner)
    }
}
