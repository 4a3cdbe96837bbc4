//! The leader hands the standby row on.
//!
//! Followers do not poll the standby row (a read each every two failover times was most of
//! what the roles cost a large fleet). The leader sees the row in its reads of the table, with
//! its carrier, and judges it as any candidate would (`singleton::carried`): when it is free
//! (the standby moved up, or stopped) or its holder's proof has stood still for the failover
//! time (confirmed by a consistent read of the carrier), it writes an active follower that
//! holds a lease as the row's owner, by a take conditional on the row's counter. That
//! follower sees the row in its next index query (every half failover time) and takes it
//! itself, naming its carrier; if it does not within the failover time, the row's proof
//! stands still again and it goes to another. A follower holding nothing reads the whole
//! table every few intervals and takes a free row from that; so does any worker while no
//! leader hands it on.

use std::time::Duration;

use tokio::time::Instant;

use super::Roles;
use crate::lease::{Lease, LeaseStore};
use crate::singleton::carried::Proof;
use crate::types::{Checkpoint, WorkerId};
use crate::worker::table::Table;

/// What the leader keeps of the standby row: the last sighting, its proof, and its last
/// handover.
#[derive(Debug, Default)]
pub(in crate::worker) struct Standby {
    seen: Option<(Lease, Option<Lease>)>,
    proof: Proof,
    /// When the leader last handed the row on.
    handed: Option<Instant>,
    /// The last read of the whole table did not show the row (deleted by hand): the leader
    /// creates it, unowned, to hand it on.
    gone: bool,
}

impl Standby {
    /// The leader read the whole table and the standby row was not in it.
    pub(super) fn missing(&mut self) {
        *self = Self {
            gone: true,
            ..Self::default()
        };
    }

    /// The leader read the standby row as `row` (and its carrier) at `at`.
    pub(super) fn saw(&mut self, row: Lease, carrier: Option<Lease>, at: Instant) {
        self.gone = false;
        self.proof.observe(&row, carrier.as_ref(), at);
        self.seen = Some((row, carrier));
    }

    /// The row to hand on, if it is free or its holder's proof stood still for `failover`
    /// (with `carrier` the carrier as a consistent read shows it, where one is needed); the
    /// carrier to read first otherwise, if that is what is missing.
    fn due(&mut self, me: &WorkerId, carrier: Option<Option<&Lease>>, failover: Duration) -> Due {
        let now = Instant::now();
        if self
            .handed
            .is_some_and(|at| now.saturating_duration_since(at) < failover)
        {
            return Due::No;
        }
        let Some((row, _)) = &self.seen else {
            return Due::No;
        };
        match &row.owner {
            None => return Due::Hand(Box::new(row.clone())),
            Some(owner) if owner == me => return Due::No,
            Some(_) => {}
        }
        let confirmed = match (self.proof.to_confirm(now, failover).cloned(), carrier) {
            (None, _) => false,
            (Some(key), None) => return Due::Confirm(key),
            (Some(_), Some(carrier)) => self.proof.confirm(row, carrier, now),
        };
        if self.proof.expired(now, failover, confirmed) {
            Due::Hand(Box::new(row.clone()))
        } else {
            Due::No
        }
    }
}

enum Due {
    No,
    Confirm(crate::types::ShardId),
    Hand(Box<Lease>),
}

impl Roles {
    /// As the leader: hands the standby row to an active follower holding a lease in
    /// `leases` (`eligible` says which workers are active), if it is due (see the module
    /// docs).
    pub(in crate::worker) async fn keep_standby<L: LeaseStore>(
        &self,
        table: &Table<L>,
        leases: &[Lease],
        eligible: impl Fn(&WorkerId) -> bool,
    ) {
        let failover = table.config.failover_time;
        if self.keeper_lock().gone {
            // Created unowned; the next read sees it free and hands it on.
            let row = Lease::new(
                super::role_key(crate::singleton::RESERVED[1]),
                Checkpoint::TrimHorizon,
            );
            match table.call("create", table.store.create(&row)).await {
                Ok(_) => self.keeper_lock().gone = false,
                Err(error) => tracing::debug!(%error, "creating the standby row failed"),
            }
            return;
        }
        let due = self.keeper_lock().due(&table.me, None, failover);
        let row = match due {
            Due::No => return,
            Due::Hand(row) => row,
            Due::Confirm(key) => {
                let read = table.call("get", table.store.get(&key)).await;
                let Ok(carrier) = read else {
                    return;
                };
                match self
                    .keeper_lock()
                    .due(&table.me, Some(carrier.as_ref()), failover)
                {
                    Due::Hand(row) => row,
                    Due::No | Due::Confirm(_) => return,
                }
            }
        };
        let Some(to) = successor(&table.me, row.owner.as_ref(), leases, eligible) else {
            return;
        };
        match table.call("take", table.store.take(&row, &to)).await {
            Ok(_) => {
                tracing::info!(from = ?row.owner, %to, "standby row handed to a follower");
                self.keeper_lock().handed = Some(Instant::now());
            }
            Err(error) => tracing::debug!(%error, "handing the standby row on failed"),
        }
    }
}

/// The follower to hand the standby row to: an eligible worker holding leases in `leases`,
/// neither this one nor the row's `holder`, the one holding fewest (it has the most room for
/// the standby's reads), by id among equals.
fn successor(
    me: &WorkerId,
    holder: Option<&WorkerId>,
    leases: &[Lease],
    eligible: impl Fn(&WorkerId) -> bool,
) -> Option<WorkerId> {
    let mut held: std::collections::BTreeMap<&WorkerId, usize> = std::collections::BTreeMap::new();
    for owner in leases.iter().filter_map(|l| l.owner.as_ref()) {
        *held.entry(owner).or_default() += 1;
    }
    held.into_iter()
        .filter(|(w, _)| *w != me && Some(*w) != holder && eligible(w))
        .min_by_key(|(w, n)| (*n, *w))
        .map(|(w, _)| w.clone())
}
