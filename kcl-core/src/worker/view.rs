//! Reading the lease table, and what the last read showed: the leases, how long each has
//! stood still ([`Observer`]), the heartbeat rows and the workers asked to drain.
//!
//! Expiry is judged here, by observation only: a lease (and its owner's heartbeat row, if it
//! has one) whose counter has not changed for the failover time on this worker's monotonic
//! clock — plus the grace its owner wrote in it when it kept it for its restart
//! ([`Lease::restart_grace`]), a duration, never a time. No wall clock of another machine is
//! ever compared.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::liveness::Heartbeats;
use super::problems::{ProblemKind, Problems};
use super::report::Report;
use super::roles::Roles;
use super::shards::Shards;
use super::table::Table;
use crate::error::{BackendError, Error};
use crate::lease::feed::{FeedRead, Mirror};
use crate::lease::observer::Observer;
use crate::lease::sync::Lineage;
use crate::lease::taker::{Candidate, Holder};
use crate::lease::{Lease, LeaseStore};
use crate::mutation::{self, Mutation};
use crate::singleton::{drained_by, is_coordination_key};
use crate::types::{ShardId, WorkerId};

/// What this worker last read of the lease table, and what it decided from it.
#[derive(Default)]
pub(super) struct View {
    /// How long each row has stood still, as observed here.
    pub(super) observer: Observer,
    /// The table as the feed shows it, while this worker observes for the fleet.
    mirror: Mirror,
    /// The heartbeat rows in the last read, by worker.
    pub(super) heartbeats: Heartbeats,
    /// Workers asked to drain (`kcl-admin release`) in the last read of the whole table:
    /// they are given nothing, and take nothing.
    pub(super) drained: BTreeSet<WorkerId>,
}

/// How a read of the whole table is made.
#[derive(Clone, Copy)]
pub(super) enum Read<'a> {
    /// Consistently, every time; what it sees of the role rows goes to their candidates, if
    /// this worker has roles.
    Whole(Option<&'a Roles>),
    /// Through the change feed, for a worker that observes for the fleet (the leader and the
    /// standby); what it sees of the leader row goes to its candidate for that row.
    Feed(&'a Roles),
}

impl View {
    /// True if the last read asked `worker` to drain.
    pub(super) fn is_drained(&self, worker: &WorkerId) -> bool {
        self.drained.contains(worker)
    }

    /// Reads the lease table as `how` says and records what it saw (and the rows it
    /// cannot read in `problems`). Returns the shard leases; `None` if the read failed in a
    /// way worth retrying next cycle.
    pub(super) async fn list<L: LeaseStore>(
        &mut self,
        table: &Table<L>,
        report: &Report,
        problems: &mut Problems,
        how: Read<'_>,
    ) -> Result<Option<Vec<Lease>>, Error> {
        let read = match how {
            Read::Feed(_) => observe(table, &mut self.mirror).await,
            Read::Whole(_) => {
                self.mirror.clear();
                table.call("list", table.store.list()).await
            }
        };
        let mut leases = match read {
            Ok(leases) => leases,
            Err(error) if error.kind().is_permanent() => return Err(Error::Store(error)),
            Err(error) => {
                report.problem("reading the lease table failed", &error);
                report.reachable(false);
                return Ok(None);
            }
        };
        report.reachable(true);
        report.solved();
        let unreadable = table.store.unreadable().into_iter().map(|row| {
            let key = row.key.unwrap_or_else(|| "<no key>".to_owned());
            (key, row.reason)
        });
        problems.replace(ProblemKind::UnreadableRow, unreadable.collect());
        self.drained = leases.iter().filter_map(|l| drained_by(&l.key)).collect();
        let now = Instant::now();
        if let Read::Feed(roles) | Read::Whole(Some(roles)) = how {
            roles.saw(&leases, now);
        }
        // The observer watches coordination rows too: heartbeats decide expiry.
        self.observer.update(&leases, now);
        self.heartbeats.saw(&leases, now);
        leases.retain(|l| !is_coordination_key(&l.key));
        Ok(Some(leases))
    }

    /// The ready leases as candidates for planning, and every lease by key.
    pub(super) fn candidates<'a, L>(
        &self,
        table: &Table<L>,
        shards: &Shards,
        leases: &'a [Lease],
    ) -> (BTreeMap<&'a ShardId, &'a Lease>, Vec<Candidate>) {
        let now = Instant::now();
        let by_key: BTreeMap<&ShardId, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        let lineage = Lineage::new(leases);
        let candidates: Vec<Candidate> = leases
            .iter()
            .filter(|l| lineage.is_ready(l))
            .map(|l| Candidate {
                key: l.key.clone(),
                holder: self.holder(table, l, shards, now),
                handoff_to: l.handoff_to.clone(),
            })
            .collect();
        (by_key, candidates)
    }

    /// Who holds `lease`, as this worker sees it: itself, nobody, or another worker whose
    /// lease has (or has not yet) expired by observation.
    fn holder<L>(&self, table: &Table<L>, lease: &Lease, shards: &Shards, now: Instant) -> Holder {
        if shards.holds(&lease.key) {
            return Holder::Me;
        }
        match &lease.owner {
            None if lease.counter == 0 => Holder::Unowned,
            None => Holder::Released,
            Some(owner) if owner == &table.me => Holder::Adoptable,
            Some(owner) => {
                let mut idle = self.observer.idle(lease, now);
                // An owner with a heartbeat is alive while either moves.
                if let Some(heartbeat) = self.heartbeats.live(owner) {
                    idle = idle.min(self.observer.idle(heartbeat, now));
                } else if let Some(absent) = self.heartbeats.absent_for(owner, now) {
                    idle = idle.min(absent);
                }
                let mut expiry = if mutation::on(Mutation::TakeAtHalfFailover) {
                    table.config.failover_time / 2
                } else {
                    table.config.failover_time
                };
                // Kept through its owner's restart: the owner asked for this much longer.
                if let Some(grace) = lease.restart_grace
                    && !mutation::on(Mutation::RestartGraceIgnored)
                {
                    expiry += grace.min(crate::config::MAX_DURATION);
                }
                if idle >= expiry {
                    Holder::Expired {
                        idle,
                        owner: owner.clone(),
                    }
                } else {
                    Holder::Other(owner.clone())
                }
            }
        }
    }
}

/// The whole table as the change feed shows it (see [`crate::lease::feed`]): the changes
/// since the last read applied to `mirror`, or, first, when the feed cannot go on, and
/// every resync interval, an eventually consistent read of the whole table. A table
/// without a feed is read whole every time.
async fn observe<L: LeaseStore>(
    table: &Table<L>,
    mirror: &mut Mirror,
) -> Result<Vec<Lease>, BackendError> {
    let now = Instant::now();
    let from = mirror.position(now).cloned();
    let read = table
        .call("read_changes", table.store.changes(from.as_ref()))
        .await;
    let restart = match read {
        Ok(FeedRead::Changes(changes, to)) => {
            mirror.apply(changes, to);
            return Ok(mirror.leases());
        }
        Ok(FeedRead::Restart(to)) => Some(to),
        Ok(FeedRead::Unavailable) => None,
        // The table stays usable without its feed (a missing permission, a stream being
        // replaced): read it whole meanwhile, and say so once until the feed works again.
        Err(error) => {
            if mirror.feed_failed() {
                tracing::debug!(%error, "reading the lease table's changes failed again");
            } else {
                tracing::warn!(%error, "reading the lease table's changes failed; reading the whole table until it works");
            }
            mirror.set_feed_failed();
            None
        }
    };
    mirror.clear();
    let leases = table.call("snapshot", table.store.snapshot()).await?;
    if let Some(to) = restart {
        mirror.reset(to, leases.clone(), now);
    }
    Ok(leases)
}
