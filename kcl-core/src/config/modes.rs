//! The modes a fleet chooses between: who reads the lease table ([`Coordination`]), what
//! proves a holder alive ([`Liveness`]) and how records are read ([`Retrieval`]). Each is a
//! cost and latency choice; none changes what a lease or a checkpoint guarantees.

use crate::lease::TableFeatures;

/// What proves that the owner of a lease is alive, and so what holding leases costs.
///
/// Either way a lease moves only by a conditional write, checkpoints stay fenced on owner and
/// counter, and a holder stops delivering once it could not prove itself alive within 0.9 ×
/// the failover time. Workers of both kinds can share a table: a lease is expired only when
/// its own counter *and* its owner's heartbeat row (if it has one) stood still for the
/// failover time. See `docs/design/coordination.md`, "Heartbeats".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(rename_all = "kebab-case", try_from = "String")
)]
#[non_exhaustive]
pub enum Liveness {
    /// The default, as KCL Java: each held lease is renewed (its counter bumped) every
    /// `renew_interval`, one write per lease.
    #[default]
    PerLease,
    /// One heartbeat row per worker (`kcl-coordination/worker/<id>`) is renewed every
    /// `renew_interval` (half the failover time, as the [`WorkerConfig::liveness`](crate::WorkerConfig::liveness) setter
    /// derives it); leases are written only when taken, checkpointed, handed off or
    /// released, so a worker costs one write per interval whatever it holds. Whoever takes
    /// the leases of a worker whose heartbeat stopped first releases that row, conditionally
    /// on the counter it watched stand still, so that the worker can never renew it again.
    /// Needs every worker sharing the table to be kcl (KCL Java judges a lease by its own
    /// counter only, and would take these leases from a live owner).
    Heartbeat,
}

/// Who in a fleet reads the whole lease table, and so what the table costs.
///
/// Safety does not depend on the choice: every take, handoff and checkpoint is a conditional
/// write whatever the mode, and workers of both modes can share a table (during a rolling
/// change, for example). See `docs/design/coordination.md` for the design and its costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(rename_all = "kebab-case", try_from = "String")
)]
#[non_exhaustive]
pub enum Coordination {
    /// Every worker reads the whole table each taker interval, takes available leases for
    /// itself and asks loaded workers for handoffs. Reads grow with workers × shards: 1.4×
    /// KCL Java 3.x's bill at 10 workers, 5.3× at 100 (`docs/benchmarks.md`).
    EveryWorker,
    /// The default. One elected worker, the leader, follows the whole table each taker
    /// interval (through the table's change feed, [`LeaseStoreExtras::changes`], where the store
    /// has one, with a full read every few minutes; else by reading it), syncs shards, takes
    /// leases that lost their owner, assigns new ones, and balances the fleet by asking
    /// owners for handoffs; a standby follows it too, so that it can act at once if the
    /// leader dies. The others read only which leases name them (`LeaseStore::owned_by`,
    /// every half failover time) and learn of handoff requests from their renewals. The
    /// leader's and the standby's rows are carried by a row their holders renew anyway (a
    /// lease, or the heartbeat row), so they cost no write of their own. Reads grow with
    /// shards, not workers × shards; the bill is KCL Java 3.x's or below from five workers
    /// on (`docs/benchmarks.md` says where it is above). Without
    /// a leader the fleet keeps processing what it holds; workers that hold nothing look for
    /// work themselves every few intervals.
    ///
    /// [`LeaseStoreExtras::changes`]: crate::LeaseStoreExtras::changes
    #[default]
    Leader,
}

impl Coordination {
    /// What this mode uses of the lease table beyond its rows: the leader mode's followers
    /// query the owner index and its observers follow the change feed; with every worker
    /// reading the table, neither is used.
    pub(crate) const fn table_features(self) -> TableFeatures {
        match self {
            Self::EveryWorker => TableFeatures::NONE,
            Self::Leader => TableFeatures::ALL,
        }
    }
}

/// How shard consumers read records. Leases, checkpoints and their guarantees do not depend
/// on it, and workers of both modes can share a lease table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case", tag = "mode"))]
#[non_exhaustive]
pub enum Retrieval {
    /// The default (KCL Java's before 2.0): `GetRecords` in a loop, pausing
    /// `idle_time_between_reads` after an empty answer. Shards share the stream's 2 MB/s
    /// per shard read limit with every other polling application.
    #[default]
    Polling,
    /// Enhanced fan-out (KCL Java's default since 2.0): the worker registers the stream
    /// consumer `consumer_name` (or finds it, registered by another worker), and each shard
    /// consumer reads with `SubscribeToShard`, which pushes records as they arrive, with a
    /// read limit of its own (2 MB/s per shard and consumer). Name the consumer after the
    /// application, as KCL Java does, so that a fleet shares one consumer; each consumer
    /// costs extra on AWS, and a stream has at most 20.
    FanOut {
        /// The stream consumer's name, e.g. the application (lease table) name.
        consumer_name: String,
    },
}
