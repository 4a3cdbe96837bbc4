//! The fleet's autoscaling signals in the cycle (see [`autoscale`](crate::autoscale)): worked
//! out by the worker that reads the whole table for the fleet (the leader, or each worker
//! under `EveryWorker`), exported as its `kcl_fleet_*` gauges and in its status, published
//! by the leader for the others, who read them back into theirs.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use crate::FleetSignals;
use crate::autoscale::{Damper, Fleet, Publisher, recommend};
use crate::lease::load::Flow;
use crate::lease::{Lease, LeaseStore};
use crate::metrics;
use crate::types::WorkerId;
use crate::worker::report::Report;
use crate::worker::table::Table;
use crate::worker::view::View;

/// What the signals keep between cycles.
#[derive(Debug, Default)]
pub(crate) struct Scaling {
    damper: Damper,
    publisher: Publisher,
    /// When this worker last published (leading) or read the published row (following).
    last: Option<Instant>,
    /// What it last said or read.
    latest: Option<FleetSignals>,
}

impl Scaling {
    /// After a read of the whole table for the fleet: works the signals out, exports them,
    /// and (`publish`: the leader) writes them to the signals row when due.
    pub(super) async fn lead<L: LeaseStore>(
        &mut self,
        table: &Table<L>,
        view: &View,
        leases: &[Lease],
        report: &Report,
        publish: bool,
    ) {
        let now = Instant::now();
        let mut fleet = fleet(table, view, leases, now);
        if self.damper.is_fresh() {
            // A new leader goes on from what was said last, or from the fleet as it runs:
            // the workers its rows name, as it has not watched them long enough to see them
            // all active yet.
            let owners: BTreeSet<&WorkerId> =
                leases.iter().filter_map(|l| l.owner.as_ref()).collect();
            let running = u32::try_from(owners.len())
                .unwrap_or(u32::MAX)
                .max(fleet.workers);
            let from = self.latest.as_ref().map_or(running, |s| s.desired_workers);
            self.damper = Damper::starting_at(from, now);
        }
        fleet.current = self.damper.current();
        let config = &table.config.autoscaling;
        let mut signals = recommend(&fleet, config);
        let (up, down) = (config.scale_up_window, config.scale_down_window);
        signals.desired_workers = self.damper.next(signals.recommended, now, up, down);
        export(&signals);
        report.publish_fleet(Some(signals.clone()));
        self.latest = Some(signals.clone());
        let Some(interval) = config.publish_interval.filter(|_| publish) else {
            return;
        };
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < interval)
        {
            return;
        }
        self.last = Some(now);
        let me = &table.me;
        let write = self.publisher.publish(&*table.store, me, &signals);
        if let Err(error) = table.call("publish_signals", write).await {
            tracing::debug!(%error, "fleet signals not published; again next interval");
        }
    }

    /// A cycle of a worker that does not lead: reads what the leader published, when due.
    pub(super) async fn follow<L: LeaseStore>(&mut self, table: &Table<L>, report: &Report) {
        if !self.damper.is_fresh() {
            // It led until now: whoever leads next starts from what it said.
            self.damper = Damper::default();
            self.publisher.let_go();
            self.last = None;
        }
        let Some(interval) = table.config.autoscaling.publish_interval else {
            return;
        };
        let now = Instant::now();
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < interval)
        {
            return;
        }
        self.last = Some(now);
        match table
            .call("read_signals", Publisher::read(&*table.store))
            .await
        {
            Ok(Some(signals)) => {
                report.publish_fleet(Some(signals.clone()));
                self.latest = Some(signals);
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, "fleet signals not read; again next interval"),
        }
    }
}

/// What the formula reads, from the leases as read and the workers seen active.
fn fleet<L>(table: &Table<L>, view: &View, leases: &[Lease], now: Instant) -> Fleet {
    let failover = table.config.failover_time;
    let mut workers: BTreeSet<&WorkerId> = view.observer.active_workers(now, failover).collect();
    workers.insert(&table.me);
    let totals = view.heartbeats.totals();
    let open: Vec<&Lease> = leases.iter().filter(|l| !l.is_finished()).collect();
    // Each worker's flows: its heartbeat row's total where it carries one (its lease rows
    // move only with checkpoints under heartbeats), else its leases'.
    let mut by_owner: BTreeMap<Option<&WorkerId>, Vec<(Flow, u32)>> = BTreeMap::new();
    for (w, total) in &totals {
        if let (Some(flow), Some(w)) = (total.flow, workers.get(w)) {
            let held = open.iter().filter(|l| l.is_owned_by(w)).count();
            let held = u32::try_from(held).unwrap_or(u32::MAX);
            by_owner.insert(Some(*w), vec![(flow, held)]);
        }
    }
    let by_total: BTreeSet<&WorkerId> = by_owner.keys().flatten().copied().collect();
    for lease in &open {
        let owner = lease.owner.as_ref();
        // Counted by its holder's total already (a holder not seen active has none counted:
        // its leases count one by one).
        if owner.is_some_and(|o| by_total.contains(o)) {
            continue;
        }
        if let Some(flow) = lease.load.and_then(|load| load.flow) {
            by_owner.entry(owner).or_default().push((flow, 1));
        }
    }
    let mut flows = Vec::new();
    for (owner, mut owned) in by_owner {
        if let Some(owner) = owner {
            within_capacity(&mut owned, declared(table, owner, leases));
        }
        flows.extend(owned);
    }
    let capacity = workers
        .iter()
        .map(|w| declared(table, w, leases))
        .sum::<f64>();
    #[allow(clippy::cast_precision_loss)]
    let capacity = capacity / workers.len().max(1) as f64;
    Fleet {
        flows,
        workers: u32::try_from(workers.len()).unwrap_or(u32::MAX),
        capacity,
        open_shards: u32::try_from(open.len()).unwrap_or(u32::MAX),
        max_leases: table.config.max_leases,
        current: None,
    }
}

/// A worker cannot do more work than its capacity: what its leases' hooks measure beyond it
/// is time spent waiting (for a core, a shared pool), so their costs are scaled down to it.
/// Without this a saturated worker would ask for one worker per shard.
fn within_capacity(flows: &mut [(Flow, u32)], capacity: f64) {
    let work: f64 = flows.iter().map(|(f, _)| f.work()).sum();
    if work > capacity && work > 0.0 {
        let scale = capacity / work;
        for (flow, _) in flows.iter_mut() {
            *flow = Flow::new(
                flow.arrival(),
                flow.read(),
                flow.behind(),
                flow.work() * scale,
            );
        }
    }
}

/// A worker's capacity as its rows declare it (this worker's as configured; 1 if unknown).
fn declared<L>(table: &Table<L>, worker: &WorkerId, leases: &[Lease]) -> f64 {
    if *worker == table.me {
        return table.config.balancing.capacity;
    }
    leases
        .iter()
        .filter(|l| l.is_owned_by(worker))
        .find_map(|l| l.load)
        .map_or(1.0, crate::LeaseLoad::capacity)
}

/// The leader's gauges (refreshed every cycle: `/metrics` drops them once it stops leading).
fn export(s: &FleetSignals) {
    ::metrics::gauge!(metrics::FLEET_DESIRED_WORKERS).set(f64::from(s.desired_workers));
    ::metrics::gauge!(metrics::FLEET_RECOMMENDED_WORKERS).set(f64::from(s.recommended));
    ::metrics::gauge!(metrics::FLEET_WORKERS).set(f64::from(s.workers));
    #[allow(clippy::cast_precision_loss)]
    ::metrics::gauge!(metrics::FLEET_BACKLOG).set(s.backlog_records as f64);
    ::metrics::gauge!(metrics::FLEET_BEHIND).set(s.behind.as_secs_f64());
    ::metrics::gauge!(metrics::FLEET_ARRIVAL_RATE).set(s.arrival_rate);
    ::metrics::gauge!(metrics::FLEET_DRAIN_RATE).set(s.drain_rate);
    ::metrics::gauge!(metrics::FLEET_NEEDED_LOAD).set(s.needed);
}
