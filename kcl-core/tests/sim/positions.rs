//! Exactly-once outputs into a sink that keeps each shard's position itself, in half the
//! seeds that commit outputs (`sim/outputs.rs`): `kcl_core::memory::MemoryPositionSink`, the
//! model of a Postgres database while the leases live in the lease table, sharing the
//! store's faults (errors, partitions, freezes, lost answers, stragglers), one handle per
//! worker given to `WorkerBuilder::positions` and committed into by its processors, each
//! commit taking a database's round trip (`outputs::RoundTrip`: a worker frozen meanwhile
//! comes back with a commit in flight, which the sink must refuse once another opened it).
//!
//! Every open of the sink is journaled as the worker saw it return ([`Opens`]): which tenure
//! the row names after it (an open whose answer was lost fenced all the same), and the
//! position it handed the worker. The sink journals its applied commits itself. The checks
//! (`checks/positions.rs`) replay both against the lease table's journal.
//!
//! In two thirds of the disturbed sink seeds the operator's hand ([`Hand`]) acts once to
//! three times: it resets a lease behind the sink's position (`kcl_core::admin::reset`, the
//! code `kcl-admin reset` runs: the shard must resume after the sink's position, not the
//! reset's), or deletes a lease row for the shard sync to make again, its counters started
//! over (the new tenure's fence is lower than the one the sink's row names: the sink must
//! let it in). It deletes only rows no running process could still be working under: unowned,
//! or owned by a worker that is gone, or frozen and renewing per lease (its validity runs out
//! while it is frozen); failing those, it kills a worker first, as an operator clearing a stuck
//! one would. A row it deletes is of an open shard, which the sync makes again at the initial
//! position — not at `LATEST`, where a shard that closes before the sync runs gets no lease
//! again (its records count as written before the start) and its children start without
//! waiting for it: the operator's doing, not the library's (seed 249 of 1,000 did so).

use std::time::Duration;

use kcl_core::admin::{self, RESET_OWNER, ResetTo};
use kcl_core::memory::{MemoryPositionSink, next_event_seq};
use kcl_core::outputs::Positions;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    BackendError, Checkpoint, ExtendedSequenceNumber, FencingToken, InitialPosition, Lease,
    LeaseStore as _, Liveness, ShardId, WorkerId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::fleet::Fleet;
use super::processor::Log;
use super::scenario::Stats;

/// One open of the sink, as the worker saw it return.
#[derive(Debug, Clone)]
pub struct SinkOpen {
    pub seq: u64,
    pub shard: ShardId,
    pub owner: String,
    pub fence: u64,
    /// The position it handed the worker; `None` if it failed.
    pub answered: Option<Option<Checkpoint>>,
    /// Whether the row names this tenure after it (answered or not, it fenced).
    pub fenced: bool,
}

/// A worker's handle on the sink, journaling every open.
pub struct Opens {
    sink: MemoryPositionSink,
    log: Log,
}

impl Opens {
    pub fn new(sink: MemoryPositionSink, log: Log) -> Self {
        Self { sink, log }
    }
}

impl Positions for Opens {
    async fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> Result<Option<Checkpoint>, BackendError> {
        let answer = self.sink.open(shard, owner, fence).await;
        // Nothing else ran since the sink's own step (one thread, no `.await` between): the
        // row as this open left it.
        let row = self.sink.rows().get(shard).cloned();
        let fenced = row.is_some_and(|r| &r.owner == owner && r.fence == fence);
        self.log.lock().sink_opens.push(SinkOpen {
            seq: next_event_seq(),
            shard: shard.clone(),
            owner: owner.to_string(),
            fence: fence.0,
            answered: answer.as_ref().ok().cloned(),
            fenced,
        });
        answer
    }
}

/// Something the operator's hand did to a lease of a sink seed.
#[derive(Debug, Clone)]
pub struct Meddling {
    pub seq: u64,
    pub shard: ShardId,
    /// A reset behind the sink's position, or a row deleted.
    pub reset: bool,
}

/// When the operator acts next on a sink seed, and how it draws what it does.
pub struct Hand {
    rng: StdRng,
    next: Option<Instant>,
    left: u32,
}

impl Hand {
    /// The hand of `fleet`'s seed: none unless its outputs go to the sink.
    pub fn new(fleet: &Fleet, planned: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(fleet.seed ^ 0x5e4d_0be7);
        let on = !planned && fleet.sink.is_some() && rng.random_ratio(2, 3);
        let left = if on { rng.random_range(1..=3) } else { 0 };
        let next =
            on.then(|| Instant::now() + Duration::from_millis(rng.random_range(3_000..15_000)));
        Self { rng, next, left }
    }

    /// Acts if it is time; true if it did. With nothing to act on, it tries again a second
    /// later.
    pub async fn act(&mut self, fleet: &mut Fleet, stats: &mut Stats, now: Instant) -> bool {
        if self.next.take_if(|at| *at <= now).is_none() {
            return false;
        }
        let acted = if self.rng.random_bool(0.5) {
            reset_behind(fleet, &mut self.rng).await
        } else {
            delete_row(fleet, &mut self.rng, stats).await
        };
        if acted {
            self.left -= 1;
        }
        if self.left > 0 {
            let pause = if acted {
                self.rng.random_range(5_000..15_000)
            } else {
                1_000
            };
            self.next = Some(now + Duration::from_millis(pause));
        }
        acted
    }
}

/// The sink's position on `key`, if it has one past the initial positions.
fn sink_position(fleet: &Fleet, key: &ShardId) -> Option<ExtendedSequenceNumber> {
    let rows = fleet.sink.as_ref()?.rows();
    match rows.get(key)?.position.as_ref()? {
        Checkpoint::Sequence(s) => Some(s.clone()),
        _ => None,
    }
}

/// Resets an unfinished lease to a record before the sink's position; true if it did.
async fn reset_behind(fleet: &mut Fleet, rng: &mut StdRng) -> bool {
    let behind: Vec<(ShardId, ExtendedSequenceNumber)> = fleet
        .store
        .leases()
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key) && !l.is_finished())
        .filter_map(|l| Some((l.key.clone(), sink_position(fleet, &l.key)?)))
        .collect();
    if behind.is_empty() {
        return false;
    }
    let (key, at) = &behind[rng.random_range(0..behind.len())];
    let earlier: Vec<_> = fleet
        .stream
        .records(&fleet.keys.shard_of(key))
        .into_iter()
        .filter(|r| r.sequence_number < at.sequence)
        .collect();
    if earlier.is_empty() {
        return false;
    }
    let to = &earlier[rng.random_range(0..earlier.len())];
    let target = ResetTo {
        checkpoint: Checkpoint::Sequence(ExtendedSequenceNumber::new(to.sequence_number.clone())),
        pin: None,
    };
    let store = fleet.store.client(RESET_OWNER);
    if admin::reset(&store, key, &target).await.is_err() {
        return false;
    }
    fleet.log.lock().sink_meddling.push(Meddling {
        seq: next_event_seq(),
        shard: key.clone(),
        reset: true,
    });
    true
}

/// Whether no running process can still work under `lease` (see the module docs).
fn abandoned(fleet: &Fleet, lease: &Lease) -> bool {
    let Some(owner) = &lease.owner else {
        return true;
    };
    let owner = owner.as_str();
    let restarting = fleet
        .log
        .lock()
        .restarts
        .iter()
        .any(|r| r.worker == owner && r.back.is_none());
    if restarting {
        return false;
    }
    let number: usize = owner.trim_start_matches('w').parse().unwrap_or(0);
    let per_lease = fleet.config.liveness == Liveness::PerLease || fleet.mixed && number % 2 == 1;
    !fleet.live.contains_key(owner) || per_lease && fleet.faults.is_paused(owner)
}

/// The unfinished leases of open shards the operator may delete, and whether each is
/// abandoned already.
fn deletable(fleet: &Fleet) -> Vec<(Lease, bool)> {
    if fleet.config.initial_position == InitialPosition::Latest {
        return Vec::new();
    }
    let open = fleet.stream.open_shards();
    fleet
        .store
        .leases()
        .into_iter()
        .filter(|l| !is_coordination_key(&l.key) && !l.is_finished())
        .filter(|l| open.contains(&fleet.keys.shard_of(&l.key)))
        .filter(|l| {
            let rows = fleet.sink.as_ref().map(MemoryPositionSink::rows);
            rows.is_some_and(|r| r.contains_key(&l.key))
        })
        .map(|l| {
            let gone = abandoned(fleet, &l);
            (l, gone)
        })
        .collect()
}

/// Deletes a lease row no process works under any more (killing its holder first if there
/// is none such); true if it did.
async fn delete_row(fleet: &mut Fleet, rng: &mut StdRng, stats: &mut Stats) -> bool {
    let candidates = deletable(fleet);
    let gone: Vec<&Lease> = candidates
        .iter()
        .filter(|(_, g)| *g)
        .map(|(l, _)| l)
        .collect();
    let lease = if gone.is_empty() {
        let held: Vec<&Lease> = candidates
            .iter()
            .map(|(l, _)| l)
            .filter(|l| {
                l.owner
                    .as_ref()
                    .is_some_and(|o| fleet.live.contains_key(o.as_str()))
            })
            .collect();
        if held.is_empty() || fleet.live.len() < 2 {
            return false;
        }
        let lease = held[rng.random_range(0..held.len())].clone();
        let owner = lease
            .owner
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        fleet.remove(&owner, true).await;
        fleet.log.lock().crashes.push((owner, Instant::now()));
        stats.crashes += 1;
        lease
    } else {
        gone[rng.random_range(0..gone.len())].clone()
    };
    let store = fleet.store.client("operator");
    let Ok(Some(row)) = store.get(&lease.key).await else {
        return false;
    };
    if row.is_finished() || store.delete(&row).await.is_err() {
        return false;
    }
    fleet.log.lock().sink_meddling.push(Meddling {
        seq: next_event_seq(),
        shard: lease.key.clone(),
        reset: false,
    });
    true
}
