//! The operator's hand on the role rows, in half the seeds under `Coordination::Leader`:
//! once or twice a run, the leader or the standby row is deleted under the running fleet (by
//! hand, or `kcl-admin remove-kcl-rows` run against a live fleet), and then perhaps created
//! again, unowned or taken by a process that never renews it; or the leader and the standby
//! are killed together. Drawn apart from the scenario's own draws. What must hold is
//! `one-leader` and `leaderless` (`checks/leading.rs`).

use std::time::Duration;

use kcl_core::{Checkpoint, Coordination, Lease, LeaseStore as _, ShardId, WorkerId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::fleet::Fleet;
use super::scenario::Stats;

const LEADER: &str = "kcl-coordination/worker-leader";
const STANDBY: &str = "kcl-coordination/worker-standby";

/// When the operator acts next, and how it draws what it does.
pub struct Hand {
    rng: StdRng,
    next: Option<Instant>,
    left: u32,
}

impl Hand {
    /// The hand of `fleet`'s seed: none for planned seeds or every-worker fleets.
    pub fn new(fleet: &Fleet, planned: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(fleet.seed ^ 0x0be7_a70e);
        let on =
            !planned && fleet.config.coordination == Coordination::Leader && rng.random_ratio(1, 2);
        let left = if on { rng.random_range(1..=2) } else { 0 };
        let next =
            on.then(|| Instant::now() + Duration::from_millis(rng.random_range(4_000..20_000)));
        Self { rng, next, left }
    }

    /// Acts if it is time; true if it did.
    pub async fn act(&mut self, fleet: &mut Fleet, stats: &mut Stats, now: Instant) -> bool {
        if self.next.take_if(|at| *at <= now).is_none() {
            return false;
        }
        self.left -= 1;
        if self.left > 0 {
            self.next = Some(now + Duration::from_millis(self.rng.random_range(5_000..15_000)));
        }
        match self.rng.random_range(0..4) {
            0 => kill_both(fleet, stats).await,
            choice => {
                let key = if self.rng.random_ratio(2, 3) {
                    LEADER
                } else {
                    STANDBY
                };
                meddle(fleet, key, choice).await;
                stats.role_rows_meddled += 1;
            }
        }
        true
    }
}

/// Deletes `key`'s row (conditionally, on the row read), then for `again` 2 creates it again
/// unowned, for 3 creates it and takes it as a process that never renews it.
async fn meddle(fleet: &Fleet, key: &str, again: u32) {
    let store = fleet.store.client("operator");
    let key = ShardId::new(key);
    let Ok(Some(row)) = store.get(&key).await else {
        return;
    };
    if store.delete(&row).await.is_err() || again < 2 {
        return;
    }
    let fresh = Lease::new(key.clone(), Checkpoint::TrimHorizon);
    if !matches!(store.create(&fresh).await, Ok(true)) || again < 3 {
        return;
    }
    if let Ok(Some(fresh)) = store.get(&key).await {
        let _ = store.take(&fresh, &WorkerId::new("operator")).await;
    }
}

/// Kills the leader and the standby at once, if a third worker is left.
async fn kill_both(fleet: &mut Fleet, stats: &mut Stats) {
    if fleet.live.len() < 3 {
        return;
    }
    let holders: Vec<String> = [LEADER, STANDBY]
        .iter()
        .filter_map(|key| {
            let row = fleet
                .store
                .leases()
                .into_iter()
                .find(|l| l.key.as_str() == *key)?;
            row.owner.map(|o| o.to_string())
        })
        .filter(|id| fleet.live.contains_key(id))
        .collect();
    for id in holders {
        fleet.remove(&id, true).await;
        fleet.log.lock().crashes.push((id, Instant::now()));
        stats.crashes += 1;
    }
    stats.roles_killed += 1;
}
