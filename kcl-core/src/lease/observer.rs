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
//! worker shutting down does with every row it holds; not a finished lease, nor one it gave
//! back for want of room, naming itself) is *leaving*: not active, whatever else of its rows
//! moved in the same read or moves afterwards (its other processors' last checkpoints come
//! after the first releases), until it takes a lease again or a failover time has passed.
//! A worker seen keeping a row for its restart ([`Lease::restart_grace`]) is leaving in the
//! same way, until it resumes one (the mark gone, the owner the same) or takes a lease.
//! Nor is a worker one of whose leases expired active, until a row of its moves again.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

#[derive(Debug, Default)]
pub(crate) struct Observer {
    seen: BTreeMap<ShardId, Seen>,
    active: BTreeMap<WorkerId, Instant>,
    /// Workers seen releasing a row, and when (see the module docs).
    leaving: BTreeMap<WorkerId, Instant>,
    /// Handoff requests this worker wrote on others' behalf: not a sign of their life.
    requested: BTreeMap<ShardId, WorkerId>,
    /// When this observer first read the table.
    watching_since: Option<Instant>,
    /// When each worker was first and last seen active (see
    /// [`arrived_within`](Self::arrived_within)); unlike `active`, kept through the moments
    /// a worker is not active (a release, a lapse) until it is forgotten.
    arrived: BTreeMap<WorkerId, (Instant, Instant)>,
}

#[derive(Debug)]
struct Seen {
    counter: u64,
    since: Instant,
    owner: Option<WorkerId>,
    handoff_to: Option<WorkerId>,
    /// When this worker first saw the row.
    first: Instant,
    /// When it last saw the row pass from one owner to another (a handoff or a failover).
    moved: Option<Instant>,
    /// Kept through its owner's restart.
    kept: bool,
}

impl Observer {
    /// Records the counters in `leases`, observed at `now`, and forgets leases no longer listed.
    pub(crate) fn update(&mut self, leases: &[Lease], now: Instant) {
        self.watching_since.get_or_insert(now);
        let mut next = BTreeMap::new();
        let mut released = Vec::new();
        for lease in leases {
            let before = self.seen.get(&lease.key);
            // Unchanged only if neither the counter nor the owner moved: a row deleted and
            // made again can come round to a counter seen before under another owner.
            let since = match before {
                Some(seen) if seen.counter == lease.counter && seen.owner == lease.owner => {
                    seen.since
                }
                _ => now,
            };
            if let Some(seen) = before {
                if seen.counter != lease.counter
                    && seen.owner == lease.owner
                    && let Some(owner) = &lease.owner
                {
                    self.active.insert(owner.clone(), now);
                    let kept = lease.restart_grace.is_some();
                    if kept && !seen.kept {
                        // Its last write before a restart: as good as a release.
                        released.push(owner.clone());
                    } else if seen.kept && !kept {
                        // Resumed by the same worker, back from its restart.
                        self.leaving.remove(owner);
                    }
                }
                if seen.counter != lease.counter
                    && lease.owner.is_none()
                    && let Some(owner) = &seen.owner
                {
                    self.active.remove(owner);
                    let refusal = lease.handoff_to.as_ref() == Some(owner);
                    if !refusal && !lease.is_finished() {
                        released.push(owner.clone());
                    }
                }
                if let Some(owner) = lease
                    .owner
                    .as_ref()
                    .filter(|o| seen.owner.as_ref() != Some(*o))
                {
                    self.leaving.remove(owner);
                }
                if let Some(to) = &lease.handoff_to
                    && seen.handoff_to.as_ref() != Some(to)
                    && self.requested.get(&lease.key) != Some(to)
                {
                    self.active.insert(to.clone(), now);
                }
            }
            let moved = moved(before, lease, now);
            next.insert(
                lease.key.clone(),
                Seen {
                    counter: lease.counter,
                    since,
                    owner: lease.owner.clone(),
                    handoff_to: lease.handoff_to.clone(),
                    first: before.map_or(now, |seen| seen.first),
                    moved,
                    kept: lease.restart_grace.is_some(),
                },
            );
        }
        self.seen = next;
        self.requested.clear();
        for worker in self.active.keys() {
            self.arrived.entry(worker.clone()).or_insert((now, now)).1 = now;
        }
        if mutation::on(Mutation::ReleaseOutweighedByRenewals) {
            return;
        }
        for worker in released {
            self.active.remove(&worker);
            self.leaving.insert(worker, now);
        }
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

    /// The workers [`is_active`](Self::is_active) says are.
    pub(crate) fn active_workers(
        &self,
        now: Instant,
        within: Duration,
    ) -> impl Iterator<Item = &WorkerId> {
        self.active
            .keys()
            .filter(move |w| self.is_active(w, now, within))
    }

    /// Whether `worker` was seen active (see the module docs) within `within` of `now`.
    pub(crate) fn is_active(&self, worker: &WorkerId, now: Instant, within: Duration) -> bool {
        let leaving = self
            .leaving
            .get(worker)
            .is_some_and(|at| now.saturating_duration_since(*at) < within);
        !leaving
            && self
                .active
                .get(worker)
                .is_some_and(|at| now.saturating_duration_since(*at) < within)
    }

    /// Whether `worker` was first seen active within `within` of `now`, this observer having
    /// watched the table for `within` before (a worker already there when it began watching
    /// has not just arrived). In a rolling replace, such a worker is the surge pod whose
    /// predecessor is about to leave.
    pub(crate) fn arrived_within(&self, worker: &WorkerId, now: Instant, within: Duration) -> bool {
        let (Some(since), Some((at, _))) = (self.watching_since, self.arrived.get(worker)) else {
            return false;
        };
        at.saturating_duration_since(since) >= within && now.saturating_duration_since(*at) < within
    }

    /// Forgets workers not seen active for `after` (workers that left).
    pub(crate) fn forget_inactive(&mut self, now: Instant, after: Duration) {
        self.active
            .retain(|_, at| now.saturating_duration_since(*at) < after);
        self.arrived
            .retain(|_, (_, last)| now.saturating_duration_since(*last) < after);
        self.leaving
            .retain(|_, at| now.saturating_duration_since(*at) < after);
    }

    /// Whether `key` has not passed from one owner to another within `window` of `now`, as
    /// far as this worker can tell: it saw the row for the whole window and no such change
    /// in it. A row seen for less is not settled: it may have moved just before.
    pub(crate) fn settled(&self, key: &ShardId, now: Instant, window: Duration) -> bool {
        self.seen.get(key).is_some_and(|seen| {
            let long = |at: Instant| now.saturating_duration_since(at) >= window;
            long(seen.first) && seen.moved.is_none_or(long)
        })
    }

    /// Whether this worker saw `key` pass from one owner to another within `window` of `now`.
    pub(crate) fn moved_within(&self, key: &ShardId, now: Instant, window: Duration) -> bool {
        self.seen
            .get(key)
            .and_then(|seen| seen.moved)
            .is_some_and(|at| now.saturating_duration_since(at) < window)
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

/// When `lease` last passed from one owner to another, as seen: now if it just did (a new
/// owner, other than a new lease's first: a release and a take is a move), else as `before`.
fn moved(before: Option<&Seen>, lease: &Lease, now: Instant) -> Option<Instant> {
    match before {
        Some(seen)
            if lease.owner.is_some()
                && seen.owner != lease.owner
                && (seen.owner.is_some() || seen.counter > 0) =>
        {
            Some(now)
        }
        Some(seen) => seen.moved,
        None => None,
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

    /// A worker shutting down releases its leases while its other processors still write
    /// their last checkpoints: seen in one read (graceful-shutdown test under fan-out in CI:
    /// the leader handed three leases to a worker that had just stopped, and they waited a
    /// failover time), and in the reads after. It is leaving until it takes a lease again, or
    /// for a failover time; a refusal or a finished lease is not a departure.
    #[tokio::test(start_paused = true)]
    async fn a_worker_seen_releasing_is_leaving_whatever_else_of_its_rows_moves() {
        // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
        crate::mutation::set_from_env();
        let failover = Duration::from_secs(10);
        let b = WorkerId::new("b");
        let row = |key: &str, counter: u64, owner: Option<&WorkerId>| {
            let mut l = Lease::new(ShardId::new(key), Checkpoint::TrimHorizon);
            l.owner = owner.cloned();
            l.counter = counter;
            l
        };
        let mut o = Observer::default();
        o.update(
            &[row("s1", 1, Some(&b)), row("s2", 1, Some(&b))],
            Instant::now(),
        );
        o.update(
            &[row("s1", 2, Some(&b)), row("s2", 2, Some(&b))],
            Instant::now(),
        );
        assert!(o.is_active(&b, Instant::now(), failover));
        // One read: s1 released, s2 checkpointed (it comes later in key order, too).
        o.update(
            &[row("s1", 3, None), row("s2", 3, Some(&b))],
            Instant::now(),
        );
        assert!(!o.is_active(&b, Instant::now(), failover), "released s1");
        // The next read: s2's last checkpoint.
        o.update(
            &[row("s1", 3, None), row("s2", 4, Some(&b))],
            Instant::now(),
        );
        assert!(!o.is_active(&b, Instant::now(), failover), "still leaving");
        // It takes a lease again: back, once a row of its moves.
        o.update(
            &[row("s1", 4, Some(&b)), row("s2", 4, Some(&b))],
            Instant::now(),
        );
        o.update(
            &[row("s1", 5, Some(&b)), row("s2", 4, Some(&b))],
            Instant::now(),
        );
        assert!(
            o.is_active(&b, Instant::now(), failover),
            "took s1 and renewed it"
        );
        // A lease given back for want of room (naming itself) is no departure.
        let mut refused = row("s1", 6, None);
        refused.handoff_to = Some(b.clone());
        o.update(&[refused.clone(), row("s2", 5, Some(&b))], Instant::now());
        o.update(&[refused, row("s2", 6, Some(&b))], Instant::now());
        assert!(o.is_active(&b, Instant::now(), failover), "a refusal");
    }

    /// A worker stopping for a restart marks its rows kept (`restart_grace`) instead of
    /// releasing them: it is leaving (a leader gives it nothing, asks nothing of it) until it
    /// comes back and resumes one, whatever else of its rows moved meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_worker_keeping_its_rows_for_a_restart_is_leaving_until_it_resumes_one() {
        let failover = Duration::from_secs(10);
        let b = WorkerId::new("b");
        let row = |key: &str, counter: u64, kept: bool| {
            let mut l = Lease::new(ShardId::new(key), Checkpoint::TrimHorizon);
            l.owner = Some(b.clone());
            l.counter = counter;
            l.restart_grace = kept.then_some(Duration::from_secs(30));
            l
        };
        let mut o = Observer::default();
        o.update(&[row("s1", 1, false), row("s2", 1, false)], Instant::now());
        o.update(&[row("s1", 2, false), row("s2", 2, false)], Instant::now());
        assert!(o.is_active(&b, Instant::now(), failover));
        // s1 kept, s2's last checkpoint in the same read.
        o.update(&[row("s1", 3, true), row("s2", 3, false)], Instant::now());
        assert!(!o.is_active(&b, Instant::now(), failover), "kept s1");
        o.update(&[row("s1", 3, true), row("s2", 4, true)], Instant::now());
        assert!(!o.is_active(&b, Instant::now(), failover), "still leaving");
        // Back: it resumes s1 (the mark gone, the owner the same).
        o.update(&[row("s1", 4, false), row("s2", 4, true)], Instant::now());
        assert!(o.is_active(&b, Instant::now(), failover), "resumed s1");
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
