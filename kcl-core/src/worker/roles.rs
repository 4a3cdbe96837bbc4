//! A worker's role under [`Coordination::Leader`](crate::Coordination::Leader): leader,
//! standby or follower, each held through a [`Singleton`] on the lease table.
//!
//! Two singleton rows, `worker-leader` and `worker-standby`. A worker competes for the standby
//! row only while it is not the leader. The standby reads the leader row every taker
//! interval, so that it takes over within one interval of the leader's expiry (and, having
//! observed the whole table as the leader did, can take the old leader's leases at once).
//! Everyone else reads the standby row every two failover times and the leader row every
//! six: a follower matters only once the standby has moved up or gone (a new standby then
//! appears within two failover times), and the leader row only if the leader and the standby
//! are both gone. So the rows cost a read per worker every 15 s at the default timing, not
//! per interval.
//!
//! Roles decide who does the work of reading the table, not who may write: every take and
//! handoff stays conditional, so a stale role (a leader that has just lost its row) costs at
//! most a failed write. A role ends when its singleton task ends: when the row is at risk,
//! lost, or the worker shuts down (and the row is then released, so a successor takes over at
//! once).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::WorkerConfig;
use crate::lease::{Lease, LeaseStore};
use crate::singleton::{COORDINATION_PREFIX, RESERVED, Sighting, Singleton, SingletonConfig};
use crate::types::WorkerId;

/// What this worker does in the fleet's coordination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Reads the whole table, syncs shards, assigns and balances.
    Leader,
    /// Reads the whole table, ready to lead.
    Standby,
    /// Reads only its own rows.
    Follower,
}

/// The role this worker holds, kept current by two background tasks.
pub(super) struct Roles {
    leader: watch::Receiver<bool>,
    standby: watch::Receiver<bool>,
    /// The leader row as this worker's reads of the table show it, for its leader candidate.
    leader_row: Arc<Sighting>,
    /// Who holds the leader row, as last seen.
    holder: watch::Receiver<Option<WorkerId>>,
    stop: CancellationToken,
    /// Aborted when dropped: a worker that crashes (its future dropped) stops competing.
    tasks: Vec<AbortOnDropHandle<()>>,
}

/// Sets its flag while a singleton task runs, and clears it however the task ends (returns,
/// or is dropped at the lease's validity deadline).
struct Flag(watch::Sender<bool>);

impl Flag {
    fn raise(sender: &watch::Sender<bool>) -> Self {
        sender.send_replace(true);
        Self(sender.clone())
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Roles {
    /// No roles: a worker that cannot compete follows only.
    fn none() -> Self {
        Self {
            leader: watch::Sender::new(false).subscribe(),
            standby: watch::Sender::new(false).subscribe(),
            leader_row: Arc::default(),
            holder: watch::Sender::new(None).subscribe(),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// Starts competing for the leader and standby rows.
    pub(super) fn start<L: LeaseStore>(
        me: &WorkerId,
        store: Arc<L>,
        config: &WorkerConfig,
    ) -> Self {
        let (leader_tx, leader) = watch::channel(false);
        let (standby_tx, standby) = watch::channel(false);
        let stop = CancellationToken::new();
        let leader_row = Arc::new(Sighting::default());
        let singleton_config = role_config(config);
        let candidates = (
            Singleton::named(
                RESERVED[0],
                me.clone(),
                store.clone(),
                singleton_config.clone(),
            )
            .map(|s| s.with_sighting(leader_row.clone())),
            Singleton::named(RESERVED[1], me.clone(), store, singleton_config),
        );
        let (lead, stand_by) = match candidates {
            (Ok(lead), Ok(stand_by)) => (Arc::new(lead), Arc::new(stand_by)),
            (Err(error), _) | (_, Err(error)) => {
                // The worker's own timing was validated the same way; this cannot happen.
                tracing::error!(%error, "cannot compete for the leader: following only");
                return Self::none();
            }
        };
        let pace = Pace {
            fast: config.taker_interval,
            slow: config.failover_time * 6,
        };
        let holder = lead.holder();
        let settled = settle(lead.holder(), config.failover_time);
        let (stopped, leading) = (stop.clone(), leader.clone());
        let tasks = vec![
            spawn(pace_leader_candidate(
                lead.clone(),
                standby.clone(),
                pace,
                stop.clone(),
            )),
            spawn(lead_loop(lead, stop.clone(), leader_tx)),
            spawn(async move {
                // Not before the leader row is settled: a worker that is about to lead would
                // otherwise take the standby row first and give it back a moment later, and
                // the others would find it free only at their next (slow) poll.
                settled.await;
                stand_by_loop(stand_by, leading, stopped, standby_tx).await;
            }),
        ];
        Self {
            leader,
            standby,
            leader_row,
            holder,
            stop,
            tasks,
        }
    }

    /// This worker read the whole table at `at`: its leader candidate, polling every taker
    /// interval while this worker stands by, takes the leader row from it instead of reading
    /// the row again.
    pub(super) fn saw(&self, leases: &[Lease], at: Instant) {
        let leader_row =
            |l: &&Lease| l.key.as_str().strip_prefix(COORDINATION_PREFIX) == Some(RESERVED[0]);
        if let Some(row) = leases.iter().find(leader_row) {
            self.leader_row.saw(row.clone(), at);
        }
    }

    /// Resolves when this worker becomes the leader (never, without roles), so that it acts
    /// on what it observed as the standby at once rather than at its next cycle.
    pub(super) async fn promoted(&mut self) {
        if self.tasks.is_empty() {
            return std::future::pending().await;
        }
        loop {
            if self.leader.changed().await.is_err() {
                return std::future::pending().await;
            }
            if *self.leader.borrow_and_update() {
                return;
            }
        }
    }

    /// The worker holding the leader row, as last seen.
    pub(super) fn leader(&self) -> Option<WorkerId> {
        self.holder.borrow().clone()
    }

    /// The role held now.
    pub(super) fn current(&self) -> Role {
        if *self.leader.borrow() {
            Role::Leader
        } else if *self.standby.borrow() {
            Role::Standby
        } else {
            Role::Follower
        }
    }

    /// Gives the rows back (so that successors take over at once) and ends the tasks, within
    /// `limit`.
    pub(super) async fn stop(self, limit: Duration) {
        self.stop.cancel();
        let tasks = join_all(self.tasks);
        if tokio::time::timeout(limit, tasks).await.is_err() {
            tracing::debug!("giving the coordination rows back took too long");
        }
    }
}

/// How often the leader candidate reads the leader row: `fast` while this worker stands by
/// (it takes over within a taker interval), `slow` otherwise.
#[derive(Clone, Copy)]
struct Pace {
    fast: Duration,
    slow: Duration,
}

/// The singleton settings of the two role rows.
fn role_config(config: &WorkerConfig) -> SingletonConfig {
    let mut singleton_config = SingletonConfig::default()
        .failover_time(config.failover_time)
        .poll_interval(config.failover_time * 2)
        // The roles stand in line themselves (see `stand_by_loop`).
        .standbys(0);
    // Renewed every half failover time, as heartbeats are (four attempts, a failed one
    // retried every eighth, before the row's validity runs out): a third fewer writes for
    // two rows every fleet pays for, whatever its size.
    singleton_config.renew_interval = config.failover_time / 2;
    singleton_config
}

fn spawn(task: impl Future<Output = ()> + Send + 'static) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(crate::task::spawn(task))
}

/// Keeps the leader candidate's poll fast only while this worker is the standby.
async fn pace_leader_candidate<L: LeaseStore>(
    lead: Arc<Singleton<L>>,
    mut is_standby: watch::Receiver<bool>,
    pace: Pace,
    stopped: CancellationToken,
) {
    loop {
        let interval = if *is_standby.borrow_and_update() {
            pace.fast
        } else {
            pace.slow
        };
        lead.set_poll_interval(interval);
        tokio::select! {
            biased;
            () = stopped.cancelled() => return,
            changed = is_standby.changed() => if changed.is_err() { return },
        }
    }
}

/// Competes for the leader row; the flag is up while this worker leads.
async fn lead_loop<L: LeaseStore>(
    lead: Arc<Singleton<L>>,
    stopped: CancellationToken,
    tx: watch::Sender<bool>,
) {
    let result = lead
        .run(stopped, |lost| {
            let flag = Flag::raise(&tx);
            async move {
                tracing::info!("leading the fleet's coordination");
                lost.cancelled().await;
                drop(flag);
            }
        })
        .await;
    if let Err(error) = result {
        tracing::error!(%error, "competing for the leader failed");
    }
}

async fn join_all(tasks: Vec<AbortOnDropHandle<()>>) {
    for task in tasks {
        let _ = task.await;
    }
}

/// Returns once the leader row has been seen held (by anyone), or after `limit`.
async fn settle(mut holder: watch::Receiver<Option<crate::types::WorkerId>>, limit: Duration) {
    let held = holder.wait_for(Option::is_some);
    let _ = tokio::time::timeout(limit, held).await;
}

/// Competes for the standby row whenever this worker is not the leader.
async fn stand_by_loop<L: LeaseStore>(
    singleton: Arc<Singleton<L>>,
    mut leader: watch::Receiver<bool>,
    stop: CancellationToken,
    flag: watch::Sender<bool>,
) {
    loop {
        while *leader.borrow_and_update() {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                changed = leader.changed() => if changed.is_err() { return },
            }
        }
        if stop.is_cancelled() {
            return;
        }
        let quit = stop.child_token();
        let run = async {
            let result = singleton
                .run(quit.clone(), |lost| {
                    let raised = Flag::raise(&flag);
                    async move {
                        lost.cancelled().await;
                        drop(raised);
                    }
                })
                .await;
            quit.cancel();
            result
        };
        let watch_leader = async {
            loop {
                tokio::select! {
                    biased;
                    () = quit.cancelled() => return,
                    changed = leader.changed() => {
                        if changed.is_err() || *leader.borrow_and_update() {
                            quit.cancel();
                            return;
                        }
                    }
                }
            }
        };
        let (result, ()) = tokio::join!(run, watch_leader);
        if let Err(error) = result {
            tracing::error!(%error, "competing for the standby failed");
            return;
        }
    }
}
