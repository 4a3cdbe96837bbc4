//! The fleet's autoscaling signals in the cycle (see [`autoscale`](crate::autoscale)): worked
//! out by the worker that reads the whole table for the fleet (the leader, or each worker
//! under `EveryWorker`), exported as its `kcl_fleet_*` gauges and in its status, published
//! by the leader for the others, who read them back into theirs while the row keeps
//! changing (see [`Freshness`]).

use std::collections::{BTreeMap, BTreeSet};

use chrono::Utc;
use tokio::time::Instant;

use crate::FleetSignals;
use crate::autoscale::{Damper, Fleet, Freshness, Publisher, recommend};
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
    /// Following: when it last saw the published row change, on its own clock.
    fresh: Freshness,
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
        // Damped, but never below the floor: fewer workers would leave shards unowned.
        let damped = self.damper.next(signals.recommended, now, config);
        signals.desired_workers = damped.max(signals.shard_floor);
        signals.at = Some(Utc::now());
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

    /// A cycle of a worker that does not lead: reads what the leader published, when due,
    /// and shows it while the row keeps changing (nothing once it stood still for
    /// [`signals_max_age`](crate::Autoscaling::signals_max_age)).
    pub(super) async fn follow<L: LeaseStore>(&mut self, table: &Table<L>, report: &Report) {
        if !self.damper.is_fresh() {
            // It led until now: whoever leads next starts from what it said, and it answers
            // from the row as it reads it from now on.
            self.damper = Damper::default();
            self.publisher.let_go();
            self.last = None;
            self.fresh.forget();
        }
        let config = &table.config.autoscaling;
        let (Some(interval), Some(max_age)) = (
            config.publish_interval,
            config.max_age(table.config.failover_time),
        ) else {
            // Nothing is published: nothing to answer with.
            report.publish_fleet(None);
            return;
        };
        let now = Instant::now();
        if self
            .last
            .is_none_or(|at| now.saturating_duration_since(at) >= interval)
        {
            self.last = Some(now);
            self.read(table, now).await;
        }
        let fresh = self.fresh.is_fresh(now, max_age);
        report.publish_fleet(self.latest.clone().filter(|_| fresh));
    }

    /// Reads the published row: a write it can read counts as a change when it is another.
    async fn read<L: LeaseStore>(&mut self, table: &Table<L>, now: Instant) {
        match table
            .call("read_signals", Publisher::read(&*table.store))
            .await
        {
            Ok(Some(published)) => {
                // A row it cannot read (damaged, or a newer version's) refreshes nothing.
                if let Some(signals) = published.signals {
                    self.fresh.saw(published.counter, now);
                    self.latest = Some(signals);
                }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::{Autoscaling, WorkerConfig};
    use crate::lease::TableFeatures;
    use crate::memory::MemoryLeaseStore;

    const INTERVAL: Duration = Duration::from_secs(15);

    fn signals(desired: u32) -> FleetSignals {
        let line = format!("v2 2 4 0 0 0 0 0 0 {desired} {desired} 1 -");
        FleetSignals::decode(&line).unwrap_or_else(|| unreachable!("a valid line"))
    }

    /// A leader that stops publishing (hung, or cut off from the table while it still holds
    /// its lease): a follower answering from its row says it knows no figure (KEDA's scaler:
    /// UNAVAILABLE, and KEDA's fallback applies) once the row stood still for
    /// `signals_max_age` (default 3 × 15 s + 10 s), at most a read interval and a cycle after;
    /// never while the row moves; and again once it moves.
    #[tokio::test(start_paused = true)]
    async fn a_publisher_that_stops_leaves_followers_without_a_figure_within_the_bound() {
        let store = Arc::new(MemoryLeaseStore::new());
        let _ = store.ensure_table(TableFeatures::NONE).await;
        let config = WorkerConfig::default()
            .failover_time(Duration::from_secs(10))
            .autoscaling(Autoscaling::default().publish_interval(INTERVAL));
        let bound = config.autoscaling.max_age(config.failover_time);
        assert_eq!(
            bound,
            Some(Duration::from_secs(55)),
            "the documented default"
        );
        let follower = Table {
            me: WorkerId::from("follower"),
            config: Arc::new(config),
            store: store.clone(),
            meters: crate::lease::load::Meters::new(1000),
        };
        let (report, mut scaling) = (Report::default(), Scaling::default());
        let status = report.subscribe();
        let (leader, mut publisher) = (WorkerId::from("leader"), Publisher::default());
        let t0 = Instant::now();
        let (mut last_write, mut gone) = (None, None);
        // A taker cycle a second for 4 minutes; the leader publishes every 15 s for the first
        // 2 minutes, then freezes, then publishes once more at 220 s.
        for second in 0..240_u64 {
            let now = Instant::now();
            if (second < 120 && second % 15 == 0) || second == 220 {
                let said = signals(u32::try_from(second / 15).unwrap_or(0) + 1);
                assert!(publisher.publish(&*store, &leader, &said).await.is_ok());
                last_write = Some(now);
            }
            scaling.follow(&follower, &report).await;
            let shown = status.borrow().fleet.clone();
            let stood_still = last_write.map(|at| now - at);
            match (shown, stood_still) {
                (Some(_), Some(still)) => assert!(
                    still <= Duration::from_secs(55) + INTERVAL + Duration::from_secs(1),
                    "still shown {still:?} after the last write (at {second} s)"
                ),
                (None, Some(still)) => {
                    // Gone only once the row stood still for the bound (or, at 220 s, until
                    // the new write is read).
                    let unread = second >= 220 && still < INTERVAL;
                    assert!(
                        still > Duration::from_secs(55) || unread,
                        "gone at {second} s, {still:?} after a write"
                    );
                    gone.get_or_insert(now - t0);
                }
                (shown, None) => assert!(shown.is_none(), "nothing written yet"),
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The last write before the freeze, at 105 s, was read at once: gone 55 s on.
        assert_eq!(
            gone,
            Some(Duration::from_secs(161)),
            "a frozen row served on"
        );
        // Shown again after the write at 220 s (read within an interval).
        assert_eq!(status.borrow().fleet, Some(signals(15)));
    }
}
