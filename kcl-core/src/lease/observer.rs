//! Expiry by observation, on the local monotonic clock.
//!
//! A lease is expired when its counter has not changed for the failover time *as seen from
//! here*: we remember when we first saw each counter value. No wall clock of any machine is
//! compared with another's, so clock skew cannot make a live lease look dead. A lease seen for
//! the first time counts as just renewed, which is why a fleet migrating from KCL Java (whose
//! rows keep their owner after shutdown) waits one failover time before taking them.
//!
//! It also tells which workers are *active*: a worker is seen active when a lease it owns
//! moves while still naming it (its own renewal, checkpoint or adoption: nobody else writes a
//! row that keeps its owner and bumps its counter), or when it asks for a lease (a new
//! handoff request naming it). A leader gives work only to active workers, so a worker that
//! died is not handed leases it would never process. A worker seen releasing a row (what a
//! worker shutting down does with every row it holds) is not active until a row of its moves
//! again, so a leaving worker is not handed leases either; nor is a worker one of whose
//! leases expired, until a row of its moves again.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::types::{ShardId, WorkerId};

#[derive(Debug, Default)]
pub(crate) struct Observer {
    seen: BTreeMap<ShardId, Seen>,
    active: BTreeMap<WorkerId, Instant>,
    /// Handoff requests this worker wrote on others' behalf: not a sign of their life.
    requested: BTreeMap<ShardId, WorkerId>,
}

#[derive(Debug)]
struct Seen {
    counter: u64,
    since: Instant,
    owner: Option<WorkerId>,
    handoff_to: Option<WorkerId>,
}

impl Observer {
    /// Records the counters in `leases`, observed at `now`, and forgets leases no longer listed.
    pub(crate) fn update(&mut self, leases: &[Lease], now: Instant) {
        let mut next = BTreeMap::new();
        for lease in leases {
            let before = self.seen.get(&lease.key);
            let since = match before {
                Some(seen) if seen.counter == lease.counter => seen.since,
                _ => now,
            };
            if let Some(seen) = before {
                if seen.counter != lease.counter
                    && seen.owner == lease.owner
                    && let Some(owner) = &lease.owner
                {
                    self.active.insert(owner.clone(), now);
                }
                if seen.counter != lease.counter
                    && lease.owner.is_none()
                    && let Some(owner) = &seen.owner
                {
                    self.active.remove(owner);
                }
                if let Some(to) = &lease.handoff_to
                    && seen.handoff_to.as_ref() != Some(to)
                    && self.requested.get(&lease.key) != Some(to)
                {
                    self.active.insert(to.clone(), now);
                }
            }
            next.insert(
                lease.key.clone(),
                Seen {
                    counter: lease.counter,
                    since,
                    owner: lease.owner.clone(),
                    handoff_to: lease.handoff_to.clone(),
                },
            );
        }
        self.seen = next;
        self.requested.clear();
    }

    /// Notes that this worker asked for `key` to go to `to` (so that the request, seen in the
    /// next read, is not taken for `to` asking).
    pub(crate) fn requested_for(&mut self, key: &ShardId, to: &WorkerId) {
        self.requested.insert(key.clone(), to.clone());
    }

    /// A lease of `worker` expired: it is not active until a row of its moves again. Its
    /// other leases may not have expired yet (they were renewed at other moments), and
    /// without this a dead worker would look active until the last of them did, and be
    /// handed leases it would never process.
    pub(crate) fn lapsed(&mut self, worker: &WorkerId) {
        self.active.remove(worker);
    }

    /// Whether `worker` was seen active (see the module docs) within `within` of `now`.
    pub(crate) fn is_active(&self, worker: &WorkerId, now: Instant, within: Duration) -> bool {
        self.active
            .get(worker)
            .is_some_and(|at| now.saturating_duration_since(*at) < within)
    }

    /// Forgets workers not seen active for `after` (workers that left).
    pub(crate) fn forget_inactive(&mut self, now: Instant, after: Duration) {
        self.active
            .retain(|_, at| now.saturating_duration_since(*at) < after);
    }

    /// How long the lease's counter has stood still, as observed here.
    pub(crate) fn idle(&self, lease: &Lease, now: Instant) -> Duration {
        match self.seen.get(&lease.key) {
            Some(seen) if seen.counter == lease.counter => {
                now.saturating_duration_since(seen.since)
            }
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Checkpoint;

    #[tokio::test(start_paused = true)]
    async fn a_lease_expires_only_after_its_counter_stood_still() {
        let mut lease = Lease::new(ShardId::new("s"), Checkpoint::TrimHorizon);
        lease.owner = Some(WorkerId::new("a"));
        let mut o = Observer::default();
        o.update(std::slice::from_ref(&lease), Instant::now());
        tokio::time::advance(Duration::from_secs(8)).await;
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert_eq!(o.idle(&lease, Instant::now()), Duration::from_secs(8));
        lease.counter += 1;
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert_eq!(o.idle(&lease, Instant::now()), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(o.idle(&lease, Instant::now()), Duration::from_secs(3));
        o.update(&[], Instant::now());
        assert_eq!(o.idle(&lease, Instant::now()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_lease_lapsed_is_inactive_until_a_row_of_its_moves() {
        let failover = Duration::from_secs(10);
        let a = WorkerId::new("a");
        let mut lease = Lease::new(ShardId::new("s"), Checkpoint::TrimHorizon);
        lease.owner = Some(a.clone());
        let mut o = Observer::default();
        o.update(std::slice::from_ref(&lease), Instant::now());
        lease.counter += 1;
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(o.is_active(&a, Instant::now(), failover));
        o.lapsed(&a); // another of a's leases expired
        assert!(!o.is_active(&a, Instant::now(), failover));
        lease.counter += 1; // a renews after all: alive
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(o.is_active(&a, Instant::now(), failover));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_is_active_when_its_own_rows_move_or_it_asks() {
        let failover = Duration::from_secs(10);
        let (a, b, c) = (WorkerId::new("a"), WorkerId::new("b"), WorkerId::new("c"));
        let mut lease = Lease::new(ShardId::new("s"), Checkpoint::TrimHorizon);
        lease.owner = Some(a.clone());
        let mut o = Observer::default();
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(
            !o.is_active(&a, Instant::now(), failover),
            "first sight says nothing"
        );
        lease.counter += 1; // a renews
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(o.is_active(&a, Instant::now(), failover));
        lease.owner = Some(b.clone()); // someone writes b as the owner
        lease.counter += 1;
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(
            !o.is_active(&b, Instant::now(), failover),
            "b has not written yet"
        );
        lease.handoff_to = Some(c.clone()); // c asks
        o.update(std::slice::from_ref(&lease), Instant::now());
        assert!(o.is_active(&c, Instant::now(), failover));
        let mut other = Lease::new(ShardId::new("t"), Checkpoint::TrimHorizon);
        other.owner = Some(c.clone());
        o.update(&[lease.clone(), other.clone()], Instant::now());
        other.owner = None; // c releases: it is leaving
        other.counter += 1;
        o.update(&[lease.clone(), other], Instant::now());
        assert!(
            !o.is_active(&c, Instant::now(), failover),
            "c released a row"
        );
        tokio::time::advance(failover).await;
        assert!(
            !o.is_active(&a, Instant::now(), failover),
            "not since the failover time"
        );
        o.forget_inactive(Instant::now(), failover);
        assert!(o.active.is_empty());
    }
}
