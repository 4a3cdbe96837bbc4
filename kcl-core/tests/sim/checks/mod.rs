//! The invariants every simulated run must keep, each named in the summary line.

mod acks;
mod leading;
mod leases;
mod outputs;
mod parallel;
mod poison;
mod positions;
mod problems;
mod records;
mod restarts;
mod singletons;

pub use acks::{Again, again};
pub use positions::{SinkCounts, SinkEvidence, unsettled};
pub use problems::stalls;
pub use records::{Openings, undelivered};
pub use restarts::kept_judged;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kcl_core::memory::{AppliedCommit, StoreEvent};
use kcl_core::{InitialPosition, Record, Shard, ShardId};

use super::processor::Journal;

/// The invariants, in the order they are checked.
pub const INVARIANTS: &[&str] = &[
    "no-loss",
    "no-history",
    "order",
    "checkpoints",
    "fencing",
    "expiry",
    "roles",
    "validity",
    "exclusive",
    "lineage",
    "singleton",
    "fencing-token",
    "periodic",
    "sends",
    "singleton-restart",
    "no-duplicates",
    "reset",
    "key-order",
    "watermark",
    "held-bound",
    "start-order",
    "standby-takeover",
    "stall-reported",
    "no-false-stall",
    "unowned",
    "dead-letter-early",
    "parked-key-order",
    "bisect-bound",
    "outage-bound",
    "redrive-order",
    "restart-kept",
    "one-leader",
    "leaderless",
    "output-once",
    "output-in-step",
    "acked-skipped",
    "sink-fenced",
    "sink-resume",
    "lease-trails-sink",
];

/// How the fleet started reading.
#[derive(Debug, Clone)]
pub struct Start {
    pub position: InitialPosition,
    /// The stream's clock when the first worker started.
    pub at: DateTime<Utc>,
    /// The same instant on tokio's clock.
    pub instant: tokio::time::Instant,
    /// The configured margin of `LATEST` pins.
    pub skew: Duration,
    /// The shards that existed when the fleet started, and whether each was closed.
    pub shards: BTreeMap<ShardId, bool>,
}

pub struct Evidence<'a> {
    pub journal: &'a Journal,
    pub store: &'a [StoreEvent],
    /// The stream's shards at the end (aged-out ones are gone).
    pub shards: &'a [Shard],
    /// Every record of every shard still in the stream, in order.
    pub records: &'a BTreeMap<ShardId, Vec<Record>>,
    /// Records of shards that aged out during the run: not owed, but still dated.
    pub aged_out: &'a BTreeMap<ShardId, Vec<Record>>,
    /// Where the fleet first read each shard, and how it first leased it.
    pub openings: &'a Openings,
    pub start: &'a Start,
    /// The failover time.
    pub failover: Duration,
    /// Validity of a successful lease write: 0.9 × the failover time.
    pub validity: Duration,
    /// Only planned changes happened (no crashes, pauses, faults or failing processors).
    pub planned: bool,
    /// The fleet processed with `Parallel` (or acknowledged later from tasks of its own).
    pub parallel: bool,
    /// The seed's failing records and policy, if it has them.
    pub poison: Option<&'a crate::sim::poison::Poison>,
    /// The workers' `stalled_after`.
    pub stalled_after: Duration,
    /// The workers' `max_leases`, where capped.
    pub max_leases: Option<usize>,
    /// How many user records a processor instance may hold from its oldest unfinished one on
    /// before reading pauses.
    pub max_unacknowledged: usize,
    /// The most stream records in one batch.
    pub batch: usize,
    /// Records of a shard in flight at once under `Parallel`.
    pub max_in_flight: Option<usize>,
    /// From when every fault had stopped, until the fleet was stopped.
    pub quiet: (tokio::time::Instant, tokio::time::Instant),
    /// How soon after the faults stop a singleton must be held again.
    pub singleton_recovery: Duration,
    /// How soon after its holder crashed (nothing else disturbed) the singleton must start
    /// elsewhere; `None` where the seed's modes allow longer.
    pub restart_bound: Option<Duration>,
    /// How long before such a crash no other worker may have crashed or left for the bound
    /// to hold (the line of standbys was whole).
    pub line_settle: Duration,
    /// The singleton's first standby row, when it has standbys.
    pub standby_row: Option<ShardId>,
    /// How often candidates holding a row read the row ahead (the taker interval here).
    pub poll: Duration,
    /// The workers' `restart_grace`, in the seeds that have one.
    pub restart_grace: Option<Duration>,
    /// The commits of outputs the store applied, in order (each journaled as a
    /// `checkpoint` under its `seq`, the counter unchanged).
    pub commits: &'a [AppliedCommit],
    /// The processors committed outputs with their checkpoints (`sim/outputs.rs`) into the
    /// lease table.
    pub transactional: bool,
    /// The sink that keeps each shard's position, in the seeds whose outputs go there
    /// (`sim/positions.rs`).
    pub sink: Option<&'a SinkEvidence>,
}

impl Evidence<'_> {
    /// The shards that had a lease at some point.
    fn leased(&self) -> BTreeSet<&ShardId> {
        self.store.iter().map(|e| &e.lease.key).collect()
    }
}

/// Every violation, each prefixed with its invariant's name; with the counts of what the
/// sink seeds went through.
pub fn check(e: &Evidence<'_>) -> (Vec<String>, SinkCounts) {
    let mut v = Vec::new();
    records::no_loss(e, &mut v);
    records::no_history(e, &mut v);
    records::order(e, &mut v);
    leases::checkpoints(e, &mut v);
    leases::fencing(e, &mut v);
    leases::expiry(e, &mut v);
    leases::roles(e, &mut v);
    leases::validity(e, &mut v);
    leases::exclusive(e, &mut v);
    leases::lineage(e, &mut v);
    leases::singleton(e, &mut v);
    singletons::tokens(e, &mut v);
    singletons::periodic(e, &mut v);
    singletons::sends(e, &mut v);
    singletons::restarts(e, &mut v);
    singletons::standby_takeovers(e, &mut v);
    if e.planned {
        records::no_duplicates(e, &mut v);
    }
    leases::reset(e, &mut v);
    if e.parallel {
        parallel::key_order(e, &mut v);
        parallel::watermark(e, &mut v);
        parallel::held_bound(e, &mut v);
        parallel::start_order(e, &mut v);
    }
    problems::stall_reported(e, &mut v);
    problems::no_false_stall(e, &mut v);
    problems::unowned(e, &mut v);
    if let Some(poison) = e.poison {
        poison::dead_letter_early(e, poison, &mut v);
        poison::parked_key_order(e, &mut v);
        poison::outage_bound(e, poison, &mut v);
        poison::redrive_order(e, &mut v);
        v.extend(e.journal.over_delivered.iter().cloned());
    }
    restarts::kept(e, &mut v);
    leading::one_leader(e, &mut v);
    leading::leaderless(e, &mut v);
    if e.transactional {
        outputs::outputs(e, &mut v);
    }
    acks::acked_skipped(e, &mut v);
    let counts = e
        .sink
        .map(|s| positions::sink(e, s, &mut v))
        .unwrap_or_default();
    (v, counts)
}
