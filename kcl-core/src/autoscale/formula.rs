//! The formula of the module docs, as a pure function of what the leader read.

use std::time::Duration;

use super::FleetSignals;
use crate::config::Autoscaling;
use crate::lease::load::Flow;

/// A record's cost in units while nothing is known of what reading costs: a shard's record
/// limit (1,000 a second) is one unit, as in [`lease::load`](crate::lease::load).
const DEFAULT_COST: f64 = 1.0 / 1000.0;

/// The workers needed may stray this far (a tenth) from the figure last said before the
/// recommendation changes: the HPA's own default tolerance. A fleet whose need sits near a
/// whole number of workers does not flip between the two.
const TOLERANCE: f64 = 0.1;

/// A fleet shrinks only to a size at which its need would take at most this share of the
/// planned utilization. Busy time counts time spent waiting for a core, which grows as
/// workers are taken away: a fleet shrunk to exactly its target would find itself above it,
/// and grow again.
const SCALE_IN_HEADROOM: f64 = 0.8;

/// What the formula reads: the flows the holders measured (one per lease, or one per worker
/// where its heartbeat row carries its total) and the fleet's shape.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fleet {
    /// What each lease (or worker) reads, as last written, and how many shards each stands
    /// for (a worker's total: the leases it holds; no more than one worker each can help).
    pub(crate) flows: Vec<(Flow, u32)>,
    /// Workers seen active.
    pub(crate) workers: u32,
    /// Their mean capacity (1: a standard worker).
    pub(crate) capacity: f64,
    /// Leases not at their end.
    pub(crate) open_shards: u32,
    /// The most leases one worker takes.
    pub(crate) max_leases: usize,
    /// What was said last (`desired_workers`), if anything.
    pub(crate) current: Option<u32>,
}

/// The signals of `fleet` (see the module docs of [`autoscale`](super)), with
/// `desired_workers` equal to `recommended`: damping is the caller's.
pub(crate) fn recommend(fleet: &Fleet, config: &Autoscaling) -> FleetSignals {
    let catch_up = config.catch_up.as_secs_f64().max(0.001);
    let per_worker = fleet.capacity.max(0.001) * config.utilization;
    let (mut arrival, mut drain, mut load, mut backlog) = (0.0, 0.0, 0.0, 0.0);
    let (mut cost_load, mut cost_reads) = (0.0, 0.0);
    let mut behind = Duration::ZERO;
    for (flow, _) in &fleet.flows {
        arrival += flow.arrival();
        drain += flow.read();
        load += flow.work();
        backlog += flow.backlog();
        behind = behind.max(flow.behind());
        if flow.read() > 0.0 {
            cost_load += flow.work();
            cost_reads += flow.read();
        }
    }
    let average_cost = if cost_reads > 0.0 && cost_load > 0.0 {
        cost_load / cost_reads
    } else {
        DEFAULT_COST
    };
    let needed: f64 = fleet
        .flows
        .iter()
        .map(|(flow, shards)| {
            let cost = if flow.read() > 0.0 && flow.work() > 0.0 {
                flow.work() / flow.read()
            } else {
                average_cost
            };
            let cap = per_worker * f64::from((*shards).max(1));
            (cost * (flow.arrival() + flow.backlog() / catch_up)).min(cap)
        })
        .sum();
    let recommended = workers_for(needed / per_worker, fleet, config);
    FleetSignals {
        shard_floor: shard_floor(fleet),
        at: None,
        workers: fleet.workers,
        shards: fleet.open_shards,
        behind,
        backlog_records: whole(backlog),
        arrival_rate: arrival,
        drain_rate: drain,
        load,
        needed,
        recommended,
        desired_workers: recommended,
    }
}

/// `workers` rounded up (a fall only as far as [`SCALE_IN_HEADROOM`] allows, a change only
/// beyond [`TOLERANCE`]), at most one per open shard and `max_workers`, at least
/// `min_workers` and enough workers for every open shard under `max_leases`.
fn workers_for(workers: f64, fleet: &Fleet, config: &Autoscaling) -> u32 {
    // A hair under a whole number is that number: 3.0000001 of rounding is not a fourth.
    let round_up = |x: f64| clamp_u32(whole((x - 1e-6).ceil()));
    let up = round_up(workers);
    let wanted = match fleet.current {
        Some(current)
            if (f64::from(current) * (1.0 - TOLERANCE)
                ..=f64::from(current) * (1.0 + TOLERANCE))
                .contains(&workers) =>
        {
            current
        }
        Some(current) if up < current => round_up(workers / SCALE_IN_HEADROOM).min(current),
        _ => up,
    };
    let shards = fleet.open_shards.max(1);
    let cap = config.max_workers.map_or(shards, |max| max.min(shards));
    wanted
        .min(cap)
        .max(shard_floor(fleet))
        .max(config.min_workers)
}

/// Workers enough for every open shard under `max_leases`.
fn shard_floor(fleet: &Fleet) -> u32 {
    fleet
        .open_shards
        .div_ceil(clamp_u32(fleet.max_leases).max(1))
}

/// `x` rounded to a whole non-negative number, saturating.
fn whole(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    // Rounded, non-negative and capped: the conversion loses nothing that matters.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let n = x.round().min(u64::MAX as f64) as u64;
    n
}

fn clamp_u32(n: impl TryInto<u32>) -> u32 {
    n.try_into().unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard reading `read` records/s of `arrival`, `behind` seconds behind, at `work`.
    fn flow(arrival: f64, read: f64, behind: u64, work: f64) -> Flow {
        Flow::new(arrival, read, Duration::from_secs(behind), work)
    }

    fn fleet(flows: Vec<Flow>, workers: u32) -> Fleet {
        Fleet {
            open_shards: u32::try_from(flows.len()).unwrap_or(u32::MAX),
            flows: flows.into_iter().map(|f| (f, 1)).collect(),
            workers,
            capacity: 1.0,
            max_leases: usize::MAX,
            current: None,
        }
    }

    #[test]
    fn a_fleet_keeping_up_needs_its_load_over_the_utilization() {
        // 8 shards, each at 0.2 units, caught up: 1.6 units over 0.7 a worker = 2.3 → 3.
        let flows = vec![flow(100.0, 100.0, 0, 0.2); 8];
        let signals = recommend(&fleet(flows, 4), &Autoscaling::default());
        assert_eq!(signals.backlog_records, 0);
        assert!((signals.needed - 1.6).abs() < 1e-9, "{signals:?}");
        assert_eq!(signals.recommended, 3);
        assert!((signals.arrival_rate - 800.0).abs() < 1e-9);
        assert!((signals.drain_rate - 800.0).abs() < 1e-9);
    }

    #[test]
    fn a_backlog_asks_for_what_reads_it_within_catch_up() {
        // 4 shards 10 min behind at 100 records/s arriving: 60,000 records each; a record
        // costs 0.4 / 200 = 0.002 units; 0.002 × (100 + 60,000 / 300) = 0.6 a shard.
        let flows = vec![flow(100.0, 200.0, 600, 0.4); 4];
        let signals = recommend(&fleet(flows, 1), &Autoscaling::default());
        assert_eq!(signals.backlog_records, 240_000);
        assert_eq!(signals.behind, Duration::from_secs(600));
        assert!((signals.needed - 2.4).abs() < 1e-9, "{signals:?}");
        // 2.4 / 0.7 = 3.43 → 4.
        assert_eq!(signals.recommended, 4);
        // The longer the catch-up allowed, the fewer workers.
        let patient = Autoscaling::default().catch_up(Duration::from_secs(3600));
        let flows = vec![flow(100.0, 200.0, 600, 0.4); 4];
        assert_eq!(recommend(&fleet(flows, 1), &patient).recommended, 2);
    }

    #[test]
    fn never_more_workers_than_shards_nor_than_max() {
        // Two shards hopelessly behind: one worker each is all that helps.
        let flows = vec![flow(1000.0, 1000.0, 3600, 1.0); 2];
        let signals = recommend(&fleet(flows.clone(), 2), &Autoscaling::default());
        assert_eq!(signals.recommended, 2);
        assert!(
            (signals.needed - 1.4).abs() < 1e-9,
            "a shard's need is one worker's share"
        );
        let capped = Autoscaling::default().workers(1, 1);
        assert_eq!(recommend(&fleet(flows, 2), &capped).recommended, 1);
    }

    #[test]
    fn never_fewer_than_min_nor_than_max_leases_allows() {
        let idle = vec![flow(0.0, 0.0, 0, 0.0); 6];
        let signals = recommend(&fleet(idle.clone(), 3), &Autoscaling::default());
        assert_eq!((signals.recommended, signals.needed), (1, 0.0));
        let two = Autoscaling::default().workers(2, None);
        assert_eq!(recommend(&fleet(idle.clone(), 3), &two).recommended, 2);
        let mut capped = fleet(idle, 3);
        capped.max_leases = 4;
        let signals = recommend(&capped, &Autoscaling::default());
        assert_eq!((signals.recommended, signals.shard_floor), (2, 2));
    }

    #[test]
    fn a_shard_read_by_nobody_costs_the_fleets_average() {
        // One shard stuck 100 s behind, reading nothing: its 10,000 records at the others'
        // cost (0.5 / 500 a record) are 0.001 × (100 + 10,000 / 300) = 0.133 units.
        let flows = vec![flow(500.0, 500.0, 0, 0.5), flow(100.0, 0.0, 100, 0.0)];
        let signals = recommend(&fleet(flows, 1), &Autoscaling::default());
        let expected = 0.5 + 0.001 * (100.0 + 10_000.0 / 300.0);
        assert!((signals.needed - expected).abs() < 1e-9, "{signals:?}");
        // Nothing known at all: a record costs a thousandth.
        let unknown = vec![flow(2000.0, 0.0, 0, 0.0)];
        assert!((recommend(&fleet(unknown, 1), &Autoscaling::default()).needed - 0.7).abs() < 1e-9);
    }

    #[test]
    fn a_need_within_a_tenth_of_what_was_said_changes_nothing() {
        // 0.75 units: 1.07 workers at 0.7 each. Said 1: stays 1; said nothing: 2.
        let flows = vec![flow(75.0, 75.0, 0, 0.375); 2];
        let mut f = fleet(flows, 1);
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 2);
        f.current = Some(1);
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 1);
        // 1.96 units: 2.8 workers. Said 3: 3. Said 4: a fall, but only to where 2.8 workers'
        // need takes 80 % of the target: 2.8 / 0.8 = 3.5, so 4 stays.
        f.flows = vec![(flow(100.0, 100.0, 0, 0.49), 1); 4];
        f.open_shards = 4;
        f.current = Some(3);
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 3);
        f.current = Some(4);
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 4);
        // 1.4 units: 2 workers; said 4: down to 2 / 0.8 = 2.5, so 3.
        f.flows = vec![(flow(100.0, 100.0, 0, 0.35), 1); 4];
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 3);
    }

    #[test]
    fn a_workers_total_stands_for_each_of_its_shards() {
        // Under heartbeats a worker's row carries its total: 4 shards far behind on one
        // worker need a worker each, not one share for the lot.
        let mut f = fleet(Vec::new(), 2);
        f.flows = vec![(flow(1200.0, 667.0, 263, 1.0), 4)];
        f.open_shards = 4;
        assert_eq!(recommend(&f, &Autoscaling::default()).recommended, 4);
    }

    #[test]
    fn capacity_counts() {
        let flows = vec![flow(100.0, 100.0, 0, 0.5); 8];
        let mut big = fleet(flows, 2);
        big.capacity = 2.0;
        // 4 units over 2 × 0.7 = 2.86 → 3.
        assert_eq!(recommend(&big, &Autoscaling::default()).recommended, 3);
    }
}
