//! Expiry by observation, on the local monotonic clock.
//!
//! A lease is expired when its counter has not changed for the failover time *as seen from
//! here*: we remember when we first saw each counter value. No wall clock of any machine is
//! compared with another's, so clock skew cannot make a live lease look dead. A lease seen for
//! the first time counts as just renewed, which is why a fleet migrating from KCL Java (whose
//! rows keep their owner after shutdown) waits one failover time before taking them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::types::ShardId;

#[derive(Debug, Default)]
pub(crate) struct Observer {
    seen: BTreeMap<ShardId, (u64, Instant)>,
}

impl Observer {
    /// Records the counters in `leases`, observed at `now`, and forgets leases no longer listed.
    pub(crate) fn update(&mut self, leases: &[Lease], now: Instant) {
        let mut next = BTreeMap::new();
        for lease in leases {
            let since = match self.seen.get(&lease.key) {
                Some((counter, since)) if *counter == lease.counter => *since,
                _ => now,
            };
            next.insert(lease.key.clone(), (lease.counter, since));
        }
        self.seen = next;
    }

    /// How long the lease's counter has stood still, as observed here.
    pub(crate) fn idle(&self, lease: &Lease, now: Instant) -> Duration {
        match self.seen.get(&lease.key) {
            Some((counter, since)) if *counter == lease.counter => {
                now.saturating_duration_since(*since)
            }
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Checkpoint, WorkerId};

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
}
