//! A worker's role under [`Coordination::Leader`](crate::Coordination::Leader): leader,
//! standby or follower, each held through a [`Singleton`] on the lease table.
//!
//! Two singleton rows, `worker-leader` and `worker-standby`, each *carried* (see
//! `singleton::carried`): it names a row its holder renews anyway (one of its leases, or its
//! heartbeat row) and is written only when that carrier changes, or, by a holder with nothing
//! to carry it, every half failover time. So the roles cost no write of their own.
//!
//! A worker competes for the standby row only while it is not the leader. The standby reads
//! the whole table every taker interval (through the feed), leader row and carrier included,
//! so that it takes over within one interval of the leader's expiry (and, having observed the
//! whole table as the leader did, can take the old leader's leases at once). The leader sees
//! the standby row the same way, and hands it to a follower holding a lease (`standby`) when
//! it is free, or expired by the same rule: the follower finds it in its next index query
//! (every half failover time) and takes it. Followers read nothing else but the leader row and
//! its carrier, every failover time, in case the leader and the standby are both gone (a
//! follower holding nothing reads the whole table every few intervals, and takes a free row
//! from that): a follower sees the row stand still for the failover time within two of them,
//! so a fleet that loses its leader and standby together leads again within about two
//! failover times and a taker interval (at 10 s, a follower's twelve eventually consistent
//! reads a minute, six read units: the row and its carrier).
//!
//! A holder steps down when its row is taken, deleted, or deleted and created again (by
//! hand, by `kcl-admin`): the leader and the standby read the whole table every taker
//! interval, and a read that does not show the row as theirs is checked with a consistent
//! read of it (`Singleton::saw_held`, `saw_missing`). So two workers lead at once for at
//! most a taker interval and a read after a row is deleted under them.
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

mod standby;

pub(super) use self::standby::Standby;

use crate::WorkerConfig;
use crate::lease::{Lease, LeaseStore};
use crate::singleton::{
    COORDINATION_PREFIX, Carriers, RESERVED, Sighting, Singleton, SingletonConfig,
};
use crate::types::{ShardId, WorkerId};

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
    me: WorkerId,
    leader: watch::Receiver<bool>,
    standby: watch::Receiver<bool>,
    /// The leader row as this worker's reads of the table show it, for its leader candidate.
    leader_row: Arc<Sighting>,
    /// The standby row as this worker's reads of the table show it, for its standby
    /// candidate.
    standby_row: Arc<Sighting>,
    /// The two candidates, to tell them what this worker's reads showed.
    candidates: Vec<Arc<dyn Candidate>>,
    /// Who holds the leader row, as last seen.
    holder: watch::Receiver<Option<WorkerId>>,
    /// What the leader keeps to hand the standby row on.
    pub(super) keeper: std::sync::Mutex<Standby>,
    stop: CancellationToken,
    /// Aborted when dropped: a worker that crashes (its future dropped) stops competing.
    tasks: Vec<AbortOnDropHandle<()>>,
}

/// What the worker tells a role candidate, whatever its store.
trait Candidate: Send + Sync {
    /// This worker read the candidate's row as `row`.
    fn saw(&self, row: &Lease);
    /// This worker read the whole table, and the candidate's row was not in it.
    fn saw_missing(&self);
    /// Poll at once.
    fn poke(&self);
}

impl<L: LeaseStore> Candidate for Singleton<L> {
    fn saw(&self, row: &Lease) {
        self.saw_held(row);
    }

    fn saw_missing(&self) {
        Singleton::saw_missing(self);
    }

    fn poke(&self) {
        Singleton::poke(self);
    }
}

/// The key of role row `name`.
fn role_key(name: &str) -> ShardId {
    ShardId::new(format!("{COORDINATION_PREFIX}{name}"))
}

/// Whether `key` is a role row's (the leader's, the standby's).
pub(in crate::worker) fn is_role_key(key: &ShardId) -> bool {
    RESERVED.iter().any(|name| role_key(name) == *key)
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
    fn none(me: &WorkerId) -> Self {
        Self {
            me: me.clone(),
            leader: watch::Sender::new(false).subscribe(),
            standby: watch::Sender::new(false).subscribe(),
            leader_row: Arc::default(),
            standby_row: Arc::default(),
            candidates: Vec::new(),
            holder: watch::Sender::new(None).subscribe(),
            keeper: std::sync::Mutex::default(),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// Starts competing for the leader and standby rows, carried by `carriers`.
    pub(super) fn start<L: LeaseStore>(
        me: &WorkerId,
        store: Arc<L>,
        config: &WorkerConfig,
        carriers: &Arc<Carriers>,
    ) -> Self {
        let (leader_tx, leader) = watch::channel(false);
        let (standby_tx, standby) = watch::channel(false);
        let stop = CancellationToken::new();
        let (leader_row, standby_row) =
            (Arc::new(Sighting::default()), Arc::new(Sighting::default()));
        let singleton_config = role_config(config);
        let candidates = (
            Singleton::named(
                RESERVED[0],
                me.clone(),
                store.clone(),
                singleton_config.clone(),
            )
            .map(|s| {
                s.with_sighting(leader_row.clone())
                    .with_carriers(carriers.clone())
            }),
            Singleton::named(RESERVED[1], me.clone(), store, singleton_config).map(|s| {
                s.with_sighting(standby_row.clone())
                    .with_carriers(carriers.clone())
            }),
        );
        let (lead, stand_by) = match candidates {
            (Ok(lead), Ok(stand_by)) => (Arc::new(lead), Arc::new(stand_by)),
            (Err(error), _) | (_, Err(error)) => {
                // The worker's own timing was validated the same way; this cannot happen.
                tracing::error!(%error, "cannot compete for the leader: following only");
                return Self::none(me);
            }
        };
        // The standby row is handed over by the leader, or seen free in a read of the table:
        // its candidates poll when told to, not on their own.
        stand_by.set_poll_interval(crate::config::MAX_DURATION);
        let pace = Pace {
            fast: config.taker_interval,
            slow: config.failover_time,
        };
        let holder = lead.holder();
        let told: Vec<Arc<dyn Candidate>> = vec![lead.clone(), stand_by.clone()];
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
            me: me.clone(),
            leader,
            standby,
            leader_row,
            standby_row,
            candidates: told,
            holder,
            keeper: std::sync::Mutex::default(),
            stop,
            tasks,
        }
    }

    /// This worker read the whole table at `at`: its candidates take the role rows (and
    /// their carriers) from it instead of reading them again; a holder learns from it that
    /// its row was taken; a candidate for a row seen free, or handed to this worker, polls
    /// at once.
    pub(super) fn saw(&self, leases: &[Lease], at: Instant) {
        let find = |key: &ShardId| leases.iter().find(|l| &l.key == key);
        let role = self.current();
        for (i, sighting) in [&self.leader_row, &self.standby_row]
            .into_iter()
            .enumerate()
        {
            let wanted = i == 0 && role != Role::Leader || i == 1 && role == Role::Follower;
            let Some(row) = find(&role_key(RESERVED[i])) else {
                // Deleted (by hand, `kcl-admin`): a holder steps down; a worker that wants
                // the row polls at once (its poll creates it); the leader creates a missing
                // standby row, to hand it on.
                if let Some(candidate) = self.candidates.get(i) {
                    candidate.saw_missing();
                    if wanted {
                        candidate.poke();
                    }
                }
                if i == 1 && role == Role::Leader {
                    self.keeper_lock().missing();
                }
                continue;
            };
            let carrier = row.carrier.as_ref().and_then(&find).cloned();
            sighting.saw(row.clone(), carrier.clone(), at);
            if i == 1 && role == Role::Leader {
                self.keeper_lock().saw(row.clone(), carrier, at);
            }
            let Some(candidate) = self.candidates.get(i) else {
                continue;
            };
            candidate.saw(row);
            // Free, or handed to this worker: the standby row only to a worker that is
            // neither leader nor standby.
            let mine = row.owner.is_none() || row.owner.as_ref() == Some(&self.me);
            if mine && wanted {
                candidate.poke();
            }
        }
    }

    /// The leader handed the standby row to this worker (its index query shows it).
    pub(super) fn assigned(&self, keys: &[ShardId]) {
        if self.current() != Role::Follower || !keys.contains(&role_key(RESERVED[1])) {
            return;
        }
        if let Some(candidate) = self.candidates.get(1) {
            candidate.poke();
        }
    }

    fn keeper_lock(&self) -> std::sync::MutexGuard<'_, Standby> {
        self.keeper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        .poll_interval(config.failover_time)
        // The roles stand in line themselves (see `stand_by_loop`).
        .standbys(0);
    // A holder with nothing to carry its row renews it every half failover time, as
    // heartbeats are (four attempts, a failed one retried every eighth, before the row's
    // validity runs out).
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
