//! One taker cycle, as the coordination mode and this worker's role want it.
//!
//! What the coordinator loop owns between cycles is a [`Coordinator`]: the parts every mode
//! works on, each a type that owns its state and the behaviour on it ([`Shards`], [`View`],
//! [`ShardSync`], [`HeartbeatState`], [`Problems`]). A cycle borrows the worker's wiring
//! ([`Wiring`]) and hands each step only the parts it touches; only the orchestrators below
//! (a cycle by mode and role) take the whole `Coordinator`. What only one mode or role needs lives in that mode's type
//! ([`Mode`]): under [`Coordination::EveryWorker`] every worker plans for itself
//! (`every_worker`); under [`Coordination::Leader`] the worker's role, which two singletons
//! decide (see `roles`), picks the cycle: the leader's (`leader`), the standby's or a
//! follower's (`follower`).
//!
//! Every backend call here is bounded by the call timeout; a failure retrying cannot fix (the
//! table or the stream is gone, access is denied) ends the cycle with an error that stops the
//! worker, anything else is logged and retried next cycle.

mod every_worker;
mod follower;
mod leader;
mod scaling;
mod sync;
mod take;

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use self::every_worker::Scope;
use self::follower::Following;
use self::leader::Leading;
pub(super) use self::sync::ShardSync;
use super::liveness::HeartbeatState;
use super::problems::{ProblemKind, Problems};
use super::report::Report;
use super::roles::{Role, Roles};
use super::shard_consumer::ShardContext;
use super::shards::Shards;
use super::table::Table;
use super::view::{Read, View};
use crate::config::{Coordination, WorkerConfig};
use crate::error::Error;
use crate::lease::LeaseStore;
use crate::processor::ProcessorFactory;
use crate::singleton::Carriers;
use crate::source::ShardSource;
use crate::types::WorkerId;

/// What a cycle works through, borrowed from the worker: the lease table as this worker,
/// where it reports, and what its shard tasks share. The state it works on is the
/// [`Coordinator`]'s, passed part by part to what touches it.
pub(super) struct Wiring<'a, S, L, F> {
    pub(super) table: &'a Table<L>,
    pub(super) report: &'a Report,
    pub(super) ctx: &'a Arc<ShardContext<S, F>>,
}

/// What the coordinator loop owns, whatever the mode.
pub(super) struct Coordinator {
    /// The shard tasks this worker runs.
    pub(super) shards: Shards,
    /// What the last read of the lease table showed.
    pub(super) view: View,
    /// When shards are next synced.
    pub(super) sync: ShardSync,
    /// This worker's heartbeat, and leases to release again.
    pub(super) heartbeat: HeartbeatState,
    /// Shards read by nobody and rows nobody can read, as this worker last found them.
    pub(super) problems: Problems,
    /// The fleet's autoscaling signals, as worked out or read here.
    pub(super) scaling: scaling::Scaling,
}

impl Coordinator {
    /// Nothing held or seen yet; shard tasks stop gracefully when `graceful` is cancelled.
    /// The leases it takes and its heartbeat are offered to `carriers`, to carry its roles.
    pub(super) fn new(graceful: CancellationToken, carriers: Arc<Carriers>) -> Self {
        Self {
            shards: Shards::new(graceful, carriers.clone()),
            view: View::default(),
            sync: ShardSync::default(),
            heartbeat: HeartbeatState::new(carriers),
            problems: Problems::default(),
            scaling: scaling::Scaling::default(),
        }
    }

    /// The parts taking a lease touches.
    fn taking(&mut self) -> take::Taking<'_> {
        take::Taking {
            shards: &mut self.shards,
            view: &mut self.view,
            heartbeat: &mut self.heartbeat,
        }
    }

    /// Publishes what the shard tasks show (held leases, problems) in the status.
    pub(super) fn publish<L>(&mut self, table: &Table<L>, report: &Report) {
        let stalled_after = table.config.stalled_after;
        report.publish(&self.shards, &mut self.problems, stalled_after);
    }
}

/// The coordination mode, with what only it keeps.
pub(super) enum Mode {
    /// Every worker reads the whole table and plans for itself.
    EveryWorker,
    /// A leader plans for the fleet; see [`Led`] (boxed: the larger by far).
    Led(Box<Led>),
}

/// A worker under `Coordination::Leader`: its role, and what each role keeps.
pub(super) struct Led {
    roles: Roles,
    leading: Leading,
    following: Following,
}

impl Mode {
    /// The mode `config` asks for; under a leader, starts competing for the roles, which
    /// `carriers` carry.
    pub(super) fn start<L: LeaseStore>(
        me: &WorkerId,
        store: Arc<L>,
        config: &WorkerConfig,
        carriers: &Arc<Carriers>,
    ) -> Self {
        match config.coordination {
            Coordination::EveryWorker => Self::EveryWorker,
            Coordination::Leader => Self::Led(Box::new(Led {
                roles: Roles::start(me, store, config, carriers),
                leading: Leading::default(),
                following: Following::default(),
            })),
        }
    }

    /// Completes when this worker has just become the leader or the standby (never under
    /// `EveryWorker`): its next cycle is due at once.
    pub(super) async fn promoted(&mut self) {
        match self {
            Self::Led(led) => led.roles.promoted().await,
            Self::EveryWorker => std::future::pending().await,
        }
    }

    /// The fleet's leader as last seen (none under `EveryWorker`).
    pub(super) fn leader(&self) -> Option<WorkerId> {
        match self {
            Self::Led(led) => led.roles.leader(),
            Self::EveryWorker => None,
        }
    }

    /// Whether this worker leads now.
    pub(super) fn is_leading(&self) -> bool {
        matches!(self, Self::Led(led) if led.roles.current() == Role::Leader)
    }

    /// Gives up the roles, if any (within `limit`): a successor leads at once.
    pub(super) async fn stop(self, limit: std::time::Duration) {
        if let Self::Led(led) = self {
            led.roles.stop(limit).await;
        }
    }
}

/// One taker cycle, as the coordination mode and this worker's role want it.
pub(super) async fn cycle<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
    w: &Wiring<'_, S, L, F>,
    state: &mut Coordinator,
    mode: &mut Mode,
) -> Result<(), Error> {
    state.heartbeat.ensure(w.table).await;
    state.heartbeat.release_left(w.table, &state.shards).await;
    match mode {
        Mode::EveryWorker => {
            every_worker::plan_for_myself(w, state, Read::Whole(None), Scope::Fleet).await?;
        }
        Mode::Led(led) => led.cycle(w, state).await?,
    }
    state.publish(w.table, w.report);
    let drained = state.view.is_drained(&w.table.me);
    w.report
        .publish_roles(mode.leader(), mode.is_leading(), drained);
    Ok(())
}

impl Led {
    /// One cycle in this worker's current role.
    async fn cycle<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        w: &Wiring<'_, S, L, F>,
        state: &mut Coordinator,
    ) -> Result<(), Error> {
        let role = self.roles.current();
        if role != Role::Leader {
            // Only the leader sees the whole fleet's plan.
            state
                .problems
                .replace(ProblemKind::Unowned, BTreeMap::new());
        }
        match role {
            Role::Leader => return self.leading.cycle(w, state, &self.roles).await,
            Role::Standby => follower::stand_by(w, state, &self.roles).await?,
            Role::Follower => self.following.cycle(w, state, &self.roles).await?,
        }
        state.scaling.follow(w.table, w.report).await;
        Ok(())
    }
}
