//! One taker cycle: read the lease table, sync shards when due, grant handoffs, take, ask.
//! This is the whole cycle of [`Coordination::EveryWorker`]; under
//! [`Coordination::Leader`] the cycle depends on the worker's role (see `led.rs`).
//!
//! Every backend call here is bounded by the call timeout; a failure retrying cannot fix (the
//! table or the stream is gone, access is denied) ends the cycle with an error that stops the
//! worker, anything else is logged and retried next cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::StreamExt as _;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::Worker;
use super::liveness::Heartbeat;
use super::problems::{ProblemKind, Problems};
use super::roles::{Role, Roles};
use super::shard_consumer::{self, Control, Exit, ShardContext};
use crate::config::{Coordination, Liveness};
use crate::coordination::{drained_by, heartbeat_of, is_coordination_key};
use crate::error::{BackendError, Error, ErrorKind};
use crate::lease::feed::{FeedRead, Mirror};
use crate::lease::leader::Moves;
use crate::lease::observer::Observer;
use crate::lease::sync::{self, Lineage};
use crate::lease::taker::{self, Candidate, Holder, Limits};
use crate::lease::tenure::Tenure;
use crate::lease::{Lease, LeaseStore};
use crate::metrics;
use crate::mutation::{self, Mutation};
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::task::bounded;
use crate::types::{ShardId, WorkerId};

/// Takes of one cycle in flight at once (see `take_all`).
const CONCURRENT_TAKES: usize = 16;

/// What the coordinator loop owns.
pub(super) struct Coordinator {
    pub(super) held: BTreeMap<ShardId, Held>,
    pub(super) tasks: JoinSet<Exit>,
    task_keys: BTreeMap<tokio::task::Id, ShardId>,
    pub(super) observer: Observer,
    /// The table as the feed shows it, while this worker observes for the fleet.
    mirror: Mirror,
    /// The leader's moves its view may not show yet.
    pub(super) moves: Moves,
    pub(super) next_sync: Instant,
    /// Leases at `SHARD_END` in the last read that synced: one newly there (its shard's
    /// worker may be a follower, which never syncs) makes a sync due at once, so the
    /// children's leases exist a cycle later rather than a `shard_sync_interval` later.
    ended: BTreeSet<ShardId>,
    /// The worker's role under `Coordination::Leader`.
    pub(super) roles: Roles,
    /// When this worker last read the whole table as a follower looking for work.
    pub(super) looked_for_work: Option<Instant>,
    /// When this worker last asked which leases name it, as a follower.
    pub(super) owner_query_at: Option<Instant>,
    /// This worker's heartbeat, under `Liveness::Heartbeat`.
    pub(super) heartbeat: Option<Heartbeat>,
    /// The heartbeat rows in the last read of the table, by worker.
    pub(super) heartbeats: BTreeMap<WorkerId, Lease>,
    /// Whether each owner's leases may be taken, decided since the last read (see `fence`).
    pub(super) fenced: BTreeMap<WorkerId, bool>,
    /// Shards read by nobody and rows nobody can read, as this worker last found them.
    pub(super) problems: Problems,
    /// Workers asked to drain (`kcl-admin release`) in the last read of the whole table:
    /// they are given nothing, and take nothing.
    pub(super) drained: BTreeSet<WorkerId>,
    /// Leases whose shard task could not hand them back, to release again (under heartbeats
    /// nothing else would: their owner's heartbeat goes on).
    pub(super) unreleased: Vec<ShardId>,
}

/// One held lease: its writer, and how to steer its task.
pub(super) struct Held {
    pub(super) tenure: Arc<Tenure>,
    pub(super) control: Arc<Control>,
}

impl<S: ShardSource, L: LeaseStore, F: ProcessorFactory> Worker<S, L, F> {
    /// One taker cycle, as the coordination mode and this worker's role want it.
    pub(super) async fn cycle(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
    ) -> Result<(), Error> {
        self.ensure_heartbeat(state).await;
        self.release_left(state).await;
        match self.config.coordination {
            Coordination::EveryWorker => self.cycle_for_myself(state, ctx, true).await?,
            Coordination::Leader => self.led_cycle(state, ctx).await?,
        }
        self.publish(state);
        Ok(())
    }

    /// The cycle of a worker that coordinates for itself: reads the whole table, syncs shards
    /// when due (if `sync`), grants handoffs, takes and asks for what it needs.
    pub(super) async fn cycle_for_myself(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        sync: bool,
    ) -> Result<(), Error> {
        let Some(leases) = self.list_and_sync(state, sync).await? else {
            return Ok(());
        };
        let (by_key, candidates) = self.candidates(state, &leases);
        self.grant_handoffs(state, &candidates, &by_key).await;

        let limits = self.limits(state);
        let plan = taker::plan(&self.id, &candidates, limits);
        let wanted: Vec<&Lease> = plan
            .take
            .iter()
            .filter_map(|k| by_key.get(k).copied())
            .collect();
        self.take_all(state, ctx, &wanted).await;
        if self.config.coordination == Coordination::EveryWorker {
            self.report_unowned(state, &candidates, &by_key);
        }
        if self.config.liveness == Liveness::Heartbeat {
            // Leases naming this worker that it will not take would never expire while its
            // heartbeat goes on: give them back.
            let unwanted = candidates
                .iter()
                .filter(|c| c.holder == Holder::Adoptable && !plan.take.contains(&c.key));
            state.unreleased.extend(unwanted.map(|c| c.key.clone()));
        }
        for key in &plan.request_handoff {
            let Some(observed) = by_key.get(key) else {
                continue;
            };
            if mutation::on(Mutation::StealWithoutHandoff) {
                self.take(state, ctx, observed).await;
                continue;
            }
            self.ask_handoff(state, observed, &self.id).await;
        }
        self.cycle_done();
        Ok(())
    }

    /// Asks the owner of `observed` to hand it to `to`. Returns whether the request was
    /// written.
    pub(super) async fn ask_handoff(
        &self,
        state: &Coordinator,
        observed: &Lease,
        to: &WorkerId,
    ) -> bool {
        let key = &observed.key;
        let request = self.store.request_handoff(observed, Some(to));
        match bounded(self.config.call_timeout, "request_handoff", request).await {
            Ok(()) => {
                tracing::info!(shard = %key, from = %owner_name(observed), %to, "handoff requested");
                ::metrics::counter!(metrics::LEASES_STOLEN).increment(1);
                if let Some(owner) = &observed.owner {
                    self.flag_handoff(state, owner).await;
                }
                true
            }
            Err(error) => {
                tracing::debug!(shard = %key, %error, "handoff request failed");
                false
            }
        }
    }

    /// Under `EveryWorker` (no leader plans for the fleet): a worker at its `max_leases`
    /// reports the leases that stayed available for two failover times — any worker with
    /// room would have taken them within a cycle, so nobody has room.
    fn report_unowned(
        &self,
        state: &mut Coordinator,
        candidates: &[Candidate],
        by_key: &BTreeMap<&ShardId, &Lease>,
    ) {
        let full = state.held.len() >= self.config.max_leases;
        let (now, long) = (Instant::now(), self.config.failover_time * 2);
        let waiting = candidates.iter().filter(|c| {
            let available = matches!(
                c.holder,
                Holder::Unowned | Holder::Released | Holder::Expired { .. }
            );
            available
                && by_key
                    .get(&c.key)
                    .is_some_and(|l| state.observer.idle(l, now) >= long)
        });
        let unowned = waiting.filter(|_| full).map(|c| {
            let why = "ready to be processed, but no worker took it (max_leases)";
            (c.key.to_string(), why.to_owned())
        });
        let unowned = unowned.collect();
        state.problems.replace(ProblemKind::Unowned, unowned);
    }

    /// The bounds of this worker's plan: none to take while it is asked to drain.
    pub(super) fn limits(&self, state: &Coordinator) -> Limits {
        let drained = state.drained.contains(&self.id);
        Limits {
            max_leases: if drained { 0 } else { self.config.max_leases },
            max_steal: if drained {
                0
            } else {
                self.config.max_leases_to_steal
            },
        }
    }

    /// A cycle completed with a successful read: says so in `Status`.
    pub(super) fn cycle_done(&self) {
        self.status
            .send_modify(|s| s.last_cycle = Some(Instant::now()));
    }

    /// The ready leases as candidates for planning, and every lease by key.
    pub(super) fn candidates<'a>(
        &self,
        state: &Coordinator,
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
                holder: self.holder(l, state, now),
                handoff_to: l.handoff_to.clone(),
            })
            .collect();
        (by_key, candidates)
    }

    /// Reads the whole table and, if `sync` (or the table has no leases yet) and it is due,
    /// syncs shards (reading the table again if that changed it). `None` if the read failed in a way worth retrying next cycle.
    pub(super) async fn list_and_sync(
        &self,
        state: &mut Coordinator,
        sync: bool,
    ) -> Result<Option<Vec<Lease>>, Error> {
        let listed_at = Instant::now();
        let Some(mut leases) = self.list(state).await? else {
            return Ok(None);
        };
        // Any worker syncs a table without leases: a new fleet then starts from the moment
        // its first worker does, with or without a leader.
        if sync {
            let ended: BTreeSet<ShardId> = leases
                .iter()
                .filter(|l| l.is_finished())
                .map(|l| l.key.clone())
                .collect();
            if !ended.is_subset(&state.ended) {
                state.next_sync = Instant::now();
            }
            state.ended = ended;
        }
        if !sync && !leases.is_empty() {
            // Only the worker that syncs compares the stream with the table.
            state
                .problems
                .replace(ProblemKind::Unleased, BTreeMap::new());
        }
        if (sync || leases.is_empty()) && Instant::now() >= state.next_sync {
            match self.sync_shards(&leases, listed_at, &state.observer).await {
                Ok(synced) => {
                    // An interrupted sync resumes next cycle: a shard without a lease is a
                    // shard nobody reads, and at LATEST what it receives meanwhile is owed.
                    let next = if synced.complete {
                        self.config.shard_sync_interval
                    } else {
                        self.config.taker_interval
                    };
                    state.next_sync = Instant::now() + next;
                    let refused = !synced.refused.is_empty();
                    if (synced.changed || refused)
                        && let Some(fresh) = self.list(state).await?
                    {
                        leases = fresh;
                    }
                    if synced.complete {
                        self.unleased(state, &leases, synced.refused);
                    }
                }
                Err(error) => {
                    let permanent = matches!(
                        &error,
                        Error::Source(e) | Error::Store(e) if e.kind().is_permanent()
                    );
                    if permanent {
                        return Err(error);
                    }
                    self.problem("listing the stream's shards failed", &error);
                    state.next_sync = Instant::now() + self.config.taker_interval;
                }
            }
            self.clean_heartbeats(state).await;
        }

        Ok(Some(leases))
    }

    /// Reads the lease table and records what it saw: through the change feed while this
    /// worker observes for the fleet (the leader and the standby), else consistently. `None`
    /// if the read failed in a way worth retrying next cycle.
    pub(super) async fn list(&self, state: &mut Coordinator) -> Result<Option<Vec<Lease>>, Error> {
        let observing = self.config.coordination == Coordination::Leader
            && state.roles.current() != Role::Follower;
        let read = if observing {
            self.observe(&mut state.mirror).await
        } else {
            state.mirror.clear();
            bounded(self.config.call_timeout, "list", self.store.list()).await
        };
        match read {
            Ok(mut leases) => {
                self.status.send_modify(|s| s.store_reachable = true);
                self.solved();
                let unreadable = self.store.unreadable().into_iter().map(|row| {
                    let key = row.key.unwrap_or_else(|| "<no key>".to_owned());
                    (key, row.reason)
                });
                state
                    .problems
                    .replace(ProblemKind::UnreadableRow, unreadable.collect());
                state.drained = leases.iter().filter_map(|l| drained_by(&l.key)).collect();
                let now = Instant::now();
                if observing {
                    state.roles.saw(&leases, now);
                }
                // The observer watches coordination rows too: heartbeats decide expiry.
                state.observer.update(&leases, now);
                state.heartbeats = leases
                    .iter()
                    .filter_map(|l| heartbeat_of(&l.key).map(|w| (w, l.clone())))
                    .collect();
                state.fenced.clear();
                leases.retain(|l| !is_coordination_key(&l.key));
                Ok(Some(leases))
            }
            Err(error) if error.kind().is_permanent() => Err(Error::Store(error)),
            Err(error) => {
                self.problem("reading the lease table failed", &error);
                self.status.send_modify(|s| s.store_reachable = false);
                Ok(None)
            }
        }
    }

    /// The whole table as the change feed shows it (see [`crate::lease::feed`]): the changes
    /// since the last read applied to `mirror`, or, first, when the feed cannot go on, and
    /// every resync interval, an eventually consistent read of the whole table. A table
    /// without a feed is read whole every time.
    async fn observe(&self, mirror: &mut Mirror) -> Result<Vec<Lease>, BackendError> {
        let limit = self.config.call_timeout;
        let now = Instant::now();
        let from = mirror.position(now).cloned();
        let read = bounded(limit, "read_changes", self.store.changes(from.as_ref())).await;
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
        let leases = bounded(limit, "snapshot", self.store.snapshot()).await?;
        if let Some(to) = restart {
            mirror.reset(to, leases.clone(), now);
        }
        Ok(leases)
    }

    /// Takes one lease and starts its shard task.
    pub(super) async fn take(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &Lease,
    ) {
        self.take_all(state, ctx, &[observed]).await;
    }

    /// Takes leases and starts their shard tasks. The fences and the heartbeat come first
    /// (they need the state), then the takes themselves, [`CONCURRENT_TAKES`] at a time: a
    /// worker starting on a large table takes hundreds of leases at once, and one after the
    /// other that would hold back the first records by a round trip each.
    pub(super) async fn take_all(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &[&Lease],
    ) {
        let mut ready = Vec::with_capacity(observed.len());
        for lease in observed {
            if let Some(owner) = lease.owner.as_ref().filter(|o| *o != &self.id)
                && !self.fence(state, owner).await
            {
                continue;
            }
            ready.push(*lease);
        }
        if ready.is_empty() {
            return;
        }
        if !self.ensure_heartbeat(state).await {
            tracing::debug!(leases = ready.len(), "no heartbeat: not taking");
            return;
        }
        // The futures are made first: a stream mapping through a closure that borrows `self`
        // would not be `Send` for every lifetime, as `tokio::spawn` needs.
        let takes: Vec<_> = ready.into_iter().map(|o| self.timed_take(o)).collect();
        let taken: Vec<_> = futures_util::stream::iter(takes)
            .buffer_unordered(CONCURRENT_TAKES)
            .collect()
            .await;
        for (observed, started, take) in taken {
            self.started(state, ctx, observed, started, take);
        }
    }

    /// Takes `observed` for this worker: the lease, when the take started, and its outcome.
    async fn timed_take<'a>(
        &self,
        observed: &'a Lease,
    ) -> (&'a Lease, Instant, Result<Lease, BackendError>) {
        let started = Instant::now();
        let take = self.store.take(observed, &self.id);
        let result = bounded(self.config.call_timeout, "take", take).await;
        (observed, started, result)
    }

    /// Starts the shard task of a lease whose take succeeded; logs why one did not.
    fn started(
        &self,
        state: &mut Coordinator,
        ctx: &Arc<ShardContext<S, F>>,
        observed: &Lease,
        started: Instant,
        take: Result<Lease, BackendError>,
    ) {
        let key = &observed.key;
        match take {
            Ok(lease) => {
                let [unowned, expired, handoff] = metrics::TAKEN_FROM;
                let from = match &observed.owner {
                    None => unowned,
                    Some(o) if o == &self.id => handoff,
                    Some(_) => expired,
                };
                match &observed.owner {
                    None => tracing::info!(shard = %key, "lease taken (it had no owner)"),
                    Some(o) if o == &self.id => {
                        tracing::info!(shard = %key, "lease taken (handed over to this worker)");
                    }
                    Some(o) => tracing::info!(shard = %key, from = %o, "lease taken (expired)"),
                }
                ::metrics::counter!(metrics::LEASES_TAKEN, "from" => from).increment(1);
                state.spawn(self, ctx, lease, started);
            }
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::debug!(shard = %key, "lease taken by someone else first");
            }
            Err(error) => tracing::warn!(shard = %key, %error, "taking lease failed"),
        }
    }

    fn holder(&self, lease: &Lease, state: &Coordinator, now: Instant) -> Holder {
        if state.held.contains_key(&lease.key) {
            return Holder::Me;
        }
        match &lease.owner {
            None if lease.counter == 0 => Holder::Unowned,
            None => Holder::Released,
            Some(owner) if owner == &self.id => Holder::Adoptable,
            Some(owner) => {
                let mut idle = state.observer.idle(lease, now);
                // An owner with a heartbeat is alive while either moves.
                if let Some(heartbeat) = state.heartbeats.get(owner)
                    && heartbeat.is_owned_by(owner)
                {
                    idle = idle.min(state.observer.idle(heartbeat, now));
                }
                let expiry = if mutation::on(Mutation::TakeAtHalfFailover) {
                    self.config.failover_time / 2
                } else {
                    self.config.failover_time
                };
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

    /// Starts handoffs other workers asked for while this worker stays at or above its lower
    /// fair share, and declines the others (clears the request) so that a request from a
    /// worker that has gone away, or one the fleet no longer needs, does not linger.
    async fn grant_handoffs(
        &self,
        state: &Coordinator,
        candidates: &[Candidate],
        by_key: &BTreeMap<&ShardId, &Lease>,
    ) {
        let in_progress = state
            .held
            .values()
            .filter(|h| h.control.is_handing_off())
            .count();
        // A worker asked to drain grants every request: it is to hold nothing.
        let mut grant = if state.drained.contains(&self.id) {
            usize::MAX
        } else {
            taker::handoffs_to_grant(&self.id, candidates, in_progress)
        };
        for c in candidates {
            let (Holder::Me, Some(to)) = (&c.holder, &c.handoff_to) else {
                continue;
            };
            let Some(held) = state.held.get(&c.key) else {
                continue;
            };
            if held.control.is_handing_off() {
                continue;
            }
            if grant > 0 && to != &self.id {
                grant -= 1;
                tracing::info!(shard = %c.key, to = %to, "granting handoff");
                held.control.hand_off(to.clone());
            } else if let Some(row) = by_key.get(&c.key) {
                tracing::debug!(shard = %c.key, to = %to, "declining handoff");
                let decline = self.store.request_handoff(row, None);
                if let Err(error) =
                    bounded(self.config.call_timeout, "request_handoff", decline).await
                {
                    tracing::debug!(shard = %c.key, %error, "declining handoff failed");
                }
            }
        }
    }

    /// Lists shards and creates or cleans up leases. Returns whether anything was written, and
    /// whether every lease due was created.
    ///
    /// Creating a lease from an old view could bring back a parent that was processed and
    /// cleaned up meanwhile, so creation stops once the view of the lease table (read at
    /// `listed_at`) is older than half the failover time, and a finished parent is deleted
    /// only after it stood still for `lease_cleanup_delay`, far longer than that.
    async fn sync_shards(
        &self,
        leases: &[Lease],
        listed_at: Instant,
        observer: &Observer,
    ) -> Result<Synced, Error> {
        let limit = self.config.call_timeout;
        let shards = bounded(limit, "list_shards", self.source.list_shards())
            .await
            .map_err(Error::Source)?;
        let configured = self.config.initial_position;
        let initial = |key: &ShardId| self.source.initial_position(key).unwrap_or(configured);
        let plan = sync::plan_for(&shards, leases, &initial);
        let lineage = Lineage::new(leases);
        let mut synced = Synced::default();
        for lease in &plan.create {
            if listed_at.elapsed() > self.config.failover_time / 2 {
                tracing::debug!("shard sync took too long; creating the rest next cycle");
                return Ok(synced);
            }
            // In order, stopping at the first failure: a child never exists without its parents.
            let created = bounded(limit, "create", self.store.create(lease)).await;
            if created.map_err(Error::Store)? {
                tracing::info!(shard = %lease.key, checkpoint = %lease.checkpoint, "lease created");
                synced.changed = true;
            } else {
                synced.refused.push(lease.key.clone());
            }
        }
        let mut changed = synced.changed;
        let now = Instant::now();
        let due = plan.delete.iter().filter(|l| {
            lineage.is_stale(l) || observer.idle(l, now) >= self.config.lease_cleanup_delay
        });
        for lease in due {
            match bounded(limit, "delete", self.store.delete(lease)).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "finished lease cleaned up");
                    changed = true;
                }
                Err(error) => tracing::debug!(shard = %lease.key, %error, "cleanup failed"),
            }
        }
        // Leases of streams no longer consumed (multi-stream): deleted, conditionally on the
        // counter seen, so a holder renewing meanwhile makes it fail until the next sync.
        for lease in leases.iter().filter(|l| self.source.is_retired(&l.key)) {
            match bounded(limit, "delete", self.store.delete(lease)).await {
                Ok(()) => {
                    tracing::info!(shard = %lease.key, "lease of a stream no longer consumed deleted");
                    changed = true;
                }
                Err(error) => {
                    tracing::debug!(shard = %lease.key, %error, "deleting failed; next sync");
                }
            }
        }
        synced.changed = changed;
        synced.complete = true;
        Ok(synced)
    }

    /// Reports the shards whose lease the sync could not create (a row holds the key) and
    /// that `leases`, read after the sync, does not show either.
    fn unleased(&self, state: &mut Coordinator, leases: &[Lease], refused: Vec<ShardId>) {
        let unreadable: BTreeSet<String> = self
            .store
            .unreadable()
            .into_iter()
            .filter_map(|row| row.key)
            .collect();
        let missing = refused
            .into_iter()
            .filter(|key| leases.iter().all(|l| &l.key != key))
            .map(|key| {
                let why = if unreadable.contains(key.as_str()) {
                    "its lease row cannot be read, so nobody processes the shard"
                } else {
                    "a row holds its key but no lease shows for it"
                };
                (key.to_string(), why.to_owned())
            });
        state
            .problems
            .replace(ProblemKind::Unleased, missing.collect());
    }
}

/// What a shard sync did.
#[derive(Debug, Default)]
struct Synced {
    /// It created or deleted a lease.
    changed: bool,
    /// It got through every lease it meant to create.
    complete: bool,
    /// Leases it meant to create whose key a row already holds.
    refused: Vec<ShardId>,
}

impl Coordinator {
    pub(super) fn new() -> Self {
        Self {
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            task_keys: BTreeMap::new(),
            observer: Observer::default(),
            mirror: Mirror::default(),
            moves: Moves::default(),
            next_sync: Instant::now(),
            ended: BTreeSet::new(),
            problems: Problems::default(),
            drained: BTreeSet::new(),
            roles: Roles::none(),
            looked_for_work: None,
            owner_query_at: None,
            heartbeat: None,
            heartbeats: BTreeMap::new(),
            fenced: BTreeMap::new(),
            unreleased: Vec::new(),
        }
    }

    pub(super) fn spawn<S: ShardSource, L: LeaseStore, F: ProcessorFactory>(
        &mut self,
        worker: &Worker<S, L, F>,
        ctx: &Arc<ShardContext<S, F>>,
        lease: Lease,
        started: Instant,
    ) {
        let key = lease.key.clone();
        let tenure = match &self.heartbeat {
            Some(heartbeat) => Tenure::derived(
                lease,
                worker.id.clone(),
                worker.store.clone(),
                heartbeat.tenure.clone(),
                worker.config.call_timeout,
            ),
            None => Tenure::new(
                lease,
                worker.id.clone(),
                worker.store.clone(),
                worker.config.failover_time,
                worker.config.call_timeout,
                started,
            ),
        };
        let tenure = Arc::new(tenure);
        let control = Arc::new(Control::new(worker.handle.graceful.child_token()));
        let task = shard_consumer::run(ctx.clone(), tenure.clone(), control.clone())
            .instrument(shard_consumer::span(&key, &worker.id));
        let handle = crate::task::spawn_in(&mut self.tasks, task);
        self.task_keys.insert(handle.id(), key.clone());
        worker.publish_taken(&key, self.held.len() + 1);
        self.held.insert(key, Held { tenure, control });
    }

    /// Forgets a finished shard task; returns its shard and why it ended.
    pub(super) fn on_exit(
        &mut self,
        joined: Result<(tokio::task::Id, Exit), tokio::task::JoinError>,
    ) -> Option<(ShardId, Exit)> {
        let (id, exit) = match joined {
            Ok((id, exit)) => (id, Some(exit)),
            Err(error) => {
                // Shard tasks catch processor panics: this is an abort, or a bug of ours.
                tracing::error!(%error, "shard task failed");
                (error.id(), None)
            }
        };
        let key = self.task_keys.remove(&id)?;
        tracing::debug!(shard = %key, ?exit, "shard task ended");
        if let Some(held) = self.held.remove(&key) {
            held.tenure.mark_lost();
        }
        exit.map(|exit| (key, exit))
    }
}

/// A lease's owner for a log line: its id, or `nobody`.
pub(super) fn owner_name(lease: &Lease) -> &str {
    lease.owner.as_ref().map_or("nobody", WorkerId::as_str)
}

#[cfg(all(test, feature = "test-util"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
    use crate::types::Checkpoint;

    /// `Status.held` names a shard the moment its task starts, not at the end of the cycle
    /// that took it: a follower adopting leases one by one on a slow table would otherwise
    /// report none while it already delivers records.
    #[tokio::test(start_paused = true)]
    async fn status_names_a_shard_as_soon_as_its_task_starts() {
        let worker = Worker::builder(MemoryStream::new(1), MemoryLeaseStore::new())
            .id("w")
            .build(|_| IdleProcessor)
            .unwrap();
        let status = worker.status();
        let ctx = Arc::new(ShardContext::new(
            worker.source.clone(),
            worker.factory.clone(),
            worker.config.clone(),
            None,
        ));
        let mut state = Coordinator::new();
        let mut lease = Lease::new(
            ShardId::new("shardId-000000000000"),
            Checkpoint::TrimHorizon,
        );
        lease.owner = Some(worker.id.clone());
        state.spawn(&worker, &ctx, lease, Instant::now());
        assert_eq!(
            status.borrow().held,
            vec![ShardId::new("shardId-000000000000")]
        );
        state.tasks.abort_all();
    }
}
