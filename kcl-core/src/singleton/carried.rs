//! Role rows carried by rows their holders renew anyway: the worker's leader and standby rows
//! (`worker/roles`), which every fleet under a leader pays for, whatever its size.
//!
//! A row its holder renews costs a write every half failover time, forever. The holder already
//! renews other rows: its leases (per-lease renewals, every third of the failover time) or its
//! heartbeat row. So a role row *names* one of them, its carrier ([`Lease::carrier`]), and is
//! not written while the carrier's renewals go on.
//!
//! **The holder** ([`keep`]) writes the role row when it takes it, naming a carrier. From then
//! on every renewal and checkpoint of the carrier (writes that keep it the holder's) proves the
//! role too, but only while the proof is unbroken: a carrier's write answered after the role's
//! validity ran out proves nothing (`lease::tenure`), so a role that lapsed stays lapsed. When
//! the carrier ends (handed over, released, finished, lost) or stops proving, the holder writes
//! the role row again, naming another carrier, or the row itself when it has none, and then
//! renews it as any singleton row. The link to an old carrier is dropped before that write is
//! sent, so the holder never counts a write its observers ignore.
//!
//! **Everyone else** ([`Proof`]) judges the role row by the rule of leases, on the pair: it is
//! expired once neither the row's counter nor, while the carrier is the holder's, the
//! carrier's counter has changed for the failover time as observed here. What they see may be
//! stale (a read of the table, its feed, an eventually consistent `GetItem`), so before acting
//! on an expiry a candidate reads the carrier consistently. If its counter is still the one
//! that stood still, no write of the carrier landed since it was first seen: the holder's last
//! proof started before that, its validity ended within 0.9 × the failover time, and a proof
//! answered later came after the role lapsed and did not count. A carrier that no longer shows
//! the holder as owner proves nothing from the moment a consistent read shows so (the
//! holder's tenure of it ended before then); from then on the row is judged by its own
//! counter. The take of the role row is conditional on that counter, as every take is.
//!
//! So no two workers ever hold a role with their proof unbroken, as with a renewed row, and
//! a holder writes nothing beyond what it writes anyway; a stale view costs a consistent read
//! or a failed conditional write, never two holders.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};

use crate::lease::tenure::{Carry, Tenure, TenureError};
use crate::lease::{CheckpointUpdate, Lease};
use crate::mutation::{self, Mutation};
use crate::types::{ShardId, WorkerId};

/// The rows this worker renews anyway that may carry its roles: the tenures of the leases it
/// holds (per-lease renewals), or of its heartbeat row.
#[derive(Debug, Default)]
pub(crate) struct Carriers(Mutex<Vec<Weak<Tenure>>>);

impl Carriers {
    /// `tenure` may carry roles while it is valid. A tenure derived from a heartbeat never
    /// does: nothing renews it.
    pub(crate) fn offer(&self, tenure: &Arc<Tenure>) {
        if tenure.is_derived() {
            return;
        }
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|t| t.upgrade().is_some_and(|t| !t.is_lost()));
        all.push(Arc::downgrade(tenure));
    }

    /// A valid carrier, the longest offered first (the least likely to move soon).
    pub(crate) fn pick(&self) -> Option<Arc<Tenure>> {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|t| t.upgrade().is_some_and(|t| !t.is_lost()));
        all.iter().filter_map(Weak::upgrade).find(|t| t.is_valid())
    }
}

/// What proves a role row's holder alive, as seen.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// The row names no carrier (or itself): its own counter.
    Alone,
    /// Its carrier, its holder's, at this counter.
    Carried(ShardId, u64),
    /// Its carrier, not its holder's as a read that may be stale shows it (or missing).
    Unlinked(ShardId),
    /// Its carrier, not its holder's as a consistent read showed it.
    Confirmed(ShardId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    counter: u64,
    owner: Option<WorkerId>,
    link: Link,
}

impl State {
    /// `row` with `carrier` as read (consistently, or not).
    fn of(row: &Lease, carrier: Option<&Lease>, consistent: bool) -> Self {
        let link = match &row.carrier {
            Some(key) if *key != row.key && !mutation::on(Mutation::RoleCarrierIgnored) => {
                match carrier {
                    Some(c) if &c.key == key && row.owner.is_some() && c.owner == row.owner => {
                        Link::Carried(key.clone(), c.counter)
                    }
                    _ if consistent => Link::Confirmed(key.clone()),
                    _ => Link::Unlinked(key.clone()),
                }
            }
            _ => Link::Alone,
        };
        Self {
            counter: row.counter,
            owner: row.owner.clone(),
            link,
        }
    }
}

/// A candidate's observation of a role row and its carrier (see the module docs): since when
/// the proof of its holder's life has stood still, on the local clock.
#[derive(Debug, Default)]
pub(crate) struct Proof {
    seen: Option<(State, Instant)>,
}

impl Proof {
    /// `row` and the row its `carrier` names (`None` if absent from the read) were read at
    /// `at`.
    pub(crate) fn observe(&mut self, row: &Lease, carrier: Option<&Lease>, at: Instant) {
        self.update(State::of(row, carrier, false), at);
    }

    fn update(&mut self, state: State, at: Instant) {
        if let Some((seen, _)) = &self.seen {
            let still_confirmed = matches!(&seen.link, Link::Confirmed(k) if state.link == Link::Unlinked(k.clone()))
                && seen.counter == state.counter
                && seen.owner == state.owner;
            if *seen == state || still_confirmed {
                return;
            }
        }
        self.seen = Some((state, at));
    }

    /// How long the proof has stood still, as observed here.
    pub(crate) fn idle(&self, now: Instant) -> Duration {
        self.seen.as_ref().map_or(Duration::ZERO, |(_, since)| {
            now.saturating_duration_since(*since)
        })
    }

    /// The carrier to read consistently now, if any: one a read that may be stale shows gone
    /// from the holder (its end counts only from a consistent read), or one that stood still
    /// with the row for `failover` (before the row may be judged expired).
    pub(crate) fn to_confirm(&self, now: Instant, failover: Duration) -> Option<&ShardId> {
        match &self.seen.as_ref()?.0.link {
            Link::Unlinked(key) => Some(key),
            Link::Carried(key, _) if self.idle(now) >= failover => Some(key),
            Link::Carried(..) | Link::Alone | Link::Confirmed(_) => None,
        }
    }

    /// `row`'s carrier (as [`to_confirm`](Self::to_confirm) named it) as a consistent read
    /// shows it now: true if that agrees with what was observed; otherwise the observation
    /// starts again from `now` with what it shows.
    pub(crate) fn confirm(&mut self, row: &Lease, carrier: Option<&Lease>, now: Instant) -> bool {
        let consistent = State::of(row, carrier, true);
        if self
            .seen
            .as_ref()
            .is_some_and(|(seen, _)| *seen == consistent)
        {
            return true;
        }
        self.seen = Some((consistent, now));
        false
    }

    /// Whether the row is expired: its proof stood still for `failover`, and a carrier that
    /// still counted was `confirmed` to agree just now.
    pub(crate) fn expired(&self, now: Instant, failover: Duration, confirmed: bool) -> bool {
        let Some((seen, _)) = &self.seen else {
            return false;
        };
        self.idle(now) >= failover
            && match &seen.link {
                Link::Alone | Link::Confirmed(_) => true,
                Link::Carried(..) => confirmed,
                Link::Unlinked(_) => false,
            }
    }
}

/// How long before a carried role's validity runs out its holder writes the row itself, when
/// the carrier has not proved it since: a quarter of the failover time, a write and a retry.
const OVERDUE: u32 = 4;

/// Keeps the role row `tenure` holds alive until the tenure is lost: names a carrier from
/// `carriers` (or the row itself) in the row, again whenever the carrier ends or falls
/// silent, and renews the row every `renew_interval` while it has none. See the module docs.
pub(super) async fn keep(
    tenure: Arc<Tenure>,
    carriers: Arc<Carriers>,
    renew_interval: Duration,
    failover_time: Duration,
) {
    let role = tenure.validity();
    let overdue = failover_time / OVERDUE;
    let mut link: Option<(Arc<Tenure>, Carry)> = None;
    let mut next = Instant::now();
    loop {
        let carrier = link.as_ref().map(|(c, _)| c.clone());
        let due = match &carrier {
            Some(_) => role.until().checked_sub(overdue).unwrap_or(next),
            None => next,
        };
        tokio::select! {
            biased;
            () = tenure.lost_token().cancelled() => return,
            () = ended(carrier.as_deref()) => {}
            () = sleep_until(due) => {
                let proved = role.until().checked_sub(overdue).is_some_and(|d| d > Instant::now());
                if carrier.as_ref().is_some_and(|c| !c.is_lost()) && proved {
                    continue;
                }
            }
        }
        // Observers stop counting the old carrier once the row names another: so does this.
        link = None;
        let wanted = carriers.pick();
        let named = wanted
            .as_ref()
            .map_or(tenure.shard(), |c| c.shard())
            .clone();
        match timeout_at(role.until(), name(&tenure, &named)).await {
            Ok(Ok(())) => {
                link = wanted.map(|c| {
                    let carry = c.carry(&role);
                    (c, carry)
                });
                next = Instant::now() + renew_interval;
            }
            Ok(Err(TenureError::Lost)) => return,
            Ok(Err(TenureError::Store(error))) if tenure.is_valid() => {
                tracing::debug!(%error, row = %tenure.shard(), "writing the role row failed; retrying");
                next = Instant::now() + renew_interval / 4;
            }
            Ok(Err(TenureError::Store(_) | TenureError::Behind(_))) | Err(_) => {
                tracing::warn!(row = %tenure.shard(), "the role row could not be written before its validity ran out");
                tenure.mark_lost();
                return;
            }
        }
    }
}

/// Resolves once `carrier` is lost (never without one).
async fn ended(carrier: Option<&Tenure>) {
    match carrier {
        Some(c) => c.lost_token().cancelled().await,
        None => std::future::pending().await,
    }
}

/// Writes the role row naming `carrier` (renews it if it names it already).
async fn name(tenure: &Tenure, carrier: &ShardId) -> Result<(), TenureError> {
    let row = tenure.snapshot().await;
    if row.carrier.as_ref() == Some(carrier) {
        return tenure.renew().await.map(drop);
    }
    let mut update = CheckpointUpdate::new(row.checkpoint);
    update.pending = row.pending_checkpoint;
    update.carrier = Some(carrier.clone());
    tenure.checkpoint(&update).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Checkpoint;

    fn row(counter: u64, owner: &str, carrier: &str) -> Lease {
        let mut r = Lease::new(
            ShardId::new("kcl-coordination/worker-leader"),
            Checkpoint::TrimHorizon,
        );
        r.counter = counter;
        r.owner = Some(WorkerId::new(owner));
        r.carrier = Some(ShardId::new(carrier));
        r
    }

    fn lease(key: &str, counter: u64, owner: &str) -> Lease {
        let mut l = Lease::new(ShardId::new(key), Checkpoint::TrimHorizon);
        l.counter = counter;
        l.owner = Some(WorkerId::new(owner));
        l
    }

    const F: Duration = Duration::from_secs(10);

    /// Reads the carrier consistently if the proof asks for it; then whether it is expired.
    fn judge(proof: &mut Proof, row: &Lease, consistent: Option<&Lease>) -> bool {
        let now = Instant::now();
        let confirmed = match proof.to_confirm(now, F) {
            Some(_) => proof.confirm(row, consistent, now),
            None => false,
        };
        proof.expired(now, F, confirmed)
    }

    /// The row stands still; its carrier moves: alive. The carrier stands still too: expired
    /// once a consistent read of it agrees, not before.
    #[tokio::test(start_paused = true)]
    async fn a_carried_row_lives_while_its_carrier_moves() {
        let mut proof = Proof::default();
        let r = row(5, "a", "s1");
        for counter in 1..10 {
            proof.observe(&r, Some(&lease("s1", counter, "a")), Instant::now());
            tokio::time::advance(Duration::from_secs(3)).await;
        }
        assert_eq!(proof.to_confirm(Instant::now(), F), None, "moving 3 s ago");
        assert!(!proof.expired(Instant::now(), F, false));
        tokio::time::advance(F).await;
        proof.observe(&r, Some(&lease("s1", 9, "a")), Instant::now());
        assert_eq!(
            proof.to_confirm(Instant::now(), F),
            Some(&ShardId::new("s1"))
        );
        assert!(!proof.expired(Instant::now(), F, false), "unconfirmed");
        let moved = lease("s1", 10, "a");
        assert!(
            !judge(&mut proof, &r, Some(&moved)),
            "a stale view hid a renewal"
        );
        tokio::time::advance(F).await;
        assert!(judge(&mut proof, &r, Some(&moved)));
    }

    /// A carrier that a stale read shows as another worker's is read consistently at once;
    /// it proves nothing from that read on, and the row waits out the failover time from
    /// there.
    #[tokio::test(start_paused = true)]
    async fn a_carrier_gone_elsewhere_counts_from_the_consistent_read_that_shows_it() {
        let mut proof = Proof::default();
        let r = row(5, "a", "s1");
        proof.observe(&r, Some(&lease("s1", 3, "b")), Instant::now());
        assert_eq!(
            proof.to_confirm(Instant::now(), F),
            Some(&ShardId::new("s1"))
        );
        // The consistent read shows it the holder's after all: alive.
        assert!(!judge(&mut proof, &r, Some(&lease("s1", 4, "a"))));
        assert_eq!(proof.to_confirm(Instant::now(), F), None);
        proof.observe(&r, Some(&lease("s1", 5, "b")), Instant::now());
        assert!(!judge(&mut proof, &r, Some(&lease("s1", 7, "b"))));
        assert_eq!(proof.to_confirm(Instant::now(), F), None, "confirmed");
        // Stale reads that agree keep the confirmation, whatever the carrier's counter.
        tokio::time::advance(F / 2).await;
        proof.observe(&r, Some(&lease("s1", 9, "b")), Instant::now());
        assert!(!judge(&mut proof, &r, None));
        tokio::time::advance(F / 2).await;
        assert!(judge(&mut proof, &r, None));
        // The holder names another carrier: a new observation.
        let renamed = row(6, "a", "s2");
        proof.observe(&renamed, Some(&lease("s2", 1, "a")), Instant::now());
        assert_eq!(proof.idle(Instant::now()), Duration::ZERO);
    }

    /// A carrier's renewal answered after the role's validity ran out proves nothing: the
    /// role stays lapsed (observers may already have taken it), and one answered in time
    /// extends it from the renewal's start.
    #[cfg(feature = "test-util")]
    #[tokio::test(start_paused = true)]
    async fn a_carrier_answered_after_the_role_lapsed_proves_nothing() {
        // The mutation check runs this test with the mutation it catches (`Mutation::unit_test`).
        crate::mutation::set_from_env();
        use crate::lease::LeaseStore;
        use crate::lease::tenure::{Taken, Timing};
        let store = Arc::new(crate::memory::MemoryLeaseStore::new());
        let made = store.ensure_table(crate::lease::TableFeatures::NONE).await;
        assert!(made.is_ok());
        let a = WorkerId::new("a");
        let mut held = Vec::new();
        for key in ["kcl-coordination/worker-leader", "s1"] {
            let lease = Lease::new(ShardId::new(key), Checkpoint::TrimHorizon);
            assert!(store.create(&lease).await.is_ok_and(|created| created));
            let taken = store
                .take(&lease, &a)
                .await
                .unwrap_or_else(|e| unreachable!("{e}"));
            let timing = Timing {
                failover_time: F,
                call_timeout: F,
            };
            let taken = Taken {
                lease: taken,
                worker: a.clone(),
                store: store.clone(),
                started: Instant::now(),
            };
            held.push(Tenure::new(taken, timing));
        }
        let (role, carrier) = (&held[0], &held[1]);
        let _carry = carrier.carry(&role.validity());
        tokio::time::advance(Duration::from_secs(3)).await;
        let renewed = Instant::now();
        assert!(carrier.renew().await.is_ok());
        assert_eq!(role.valid_until(), renewed + F * 9 / 10, "proved in time");
        tokio::time::advance(F).await;
        assert!(
            carrier.renew().await.is_ok(),
            "the lease is still the worker's"
        );
        assert!(
            role.valid_until() < Instant::now(),
            "a lapsed role came back: valid {:?} past now",
            role.valid_until().saturating_duration_since(Instant::now())
        );
    }

    /// A row naming itself, or nothing, is judged by its own counter, as any singleton row.
    #[tokio::test(start_paused = true)]
    async fn a_row_without_a_carrier_is_judged_by_its_own_counter() {
        let mut proof = Proof::default();
        let alone = row(5, "a", "kcl-coordination/worker-leader");
        proof.observe(&alone, None, Instant::now());
        assert_eq!(proof.to_confirm(Instant::now(), F), None);
        tokio::time::advance(F).await;
        assert!(judge(&mut proof, &alone, None));
    }
}
