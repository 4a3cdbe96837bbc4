//! The figure as an autoscaler with a tolerance must be told it, so that no shard is left
//! unowned.
//!
//! The HPA (and KEDA, which makes one) runs `ceil(value / target)` replicas, `value` the
//! metric and `target` 1 a replica here, but only once `value / (target × replicas)` strays
//! beyond its tolerance from 1: 10 % by default, and settable per HPA only from Kubernetes
//! 1.33 (`behavior.scaleUp.tolerance`, behind the `HPAConfigurableTolerance` gate until 1.35).
//! At 11 replicas a figure of 12 is within it, and never followed. Where the 12 is the shard
//! floor (24 shards at `max_leases` 2), a shard stays unowned for good.

use super::FleetSignals;

impl FleetSignals {
    /// The value to give an autoscaler that runs `ceil(value)` replicas (an HPA on an
    /// `AverageValue` target of 1 a replica) but ignores a value within `tolerance` (a
    /// fraction: 0.1 is the HPA's default) of the replicas it runs.
    ///
    /// [`desired_workers`](Self::desired_workers) as it is, unless that could leave a shard
    /// unowned: then raised just past the tolerance of the largest fleet that is too small,
    /// [`shard_floor`](Self::shard_floor) − 1 replicas. Whatever the replicas running (the
    /// autoscaler's count is not known here: it counts pods that do not read yet), a fleet
    /// below the floor is then beyond the tolerance and grows to `ceil(value)`, at least the
    /// floor; a fleet at or above it stays or goes to `ceil(value)`, never below the floor.
    /// The price: a fleet growing to its floor may get up to a tenth more (at 11 replicas, a
    /// floor of 12 gets 13). At `tolerance` 0, or with a floor of 10 or less at 0.1, the
    /// value is `desired_workers` exactly.
    ///
    /// The value is a whole number of thousandths plus a half (KEDA passes thousandths on,
    /// truncated), at least two thousandths past the tolerance's edge: float rounding in the
    /// autoscaler cannot put it back inside.
    pub fn for_autoscaler(&self, tolerance: f64) -> f64 {
        let figure = f64::from(self.desired_workers);
        if !(tolerance.is_finite() && tolerance > 0.0) || self.shard_floor < 2 {
            return figure;
        }
        let too_small = f64::from(self.shard_floor - 1);
        // The edge, in thousandths, rounded down; 2.5 thousandths past it.
        let edge = ((1.0 + tolerance) * too_small * 1000.0).floor();
        figure.max((edge + 2.5) / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_TOLERANCE: f64 = 0.1;

    /// The HPA's replicas running `current`, told `value` of a metric whose target is an
    /// `AverageValue` of 1 a replica, with `tolerance` both ways: as Kubernetes'
    /// `GetExternalPerPodMetricReplicas` works it out from what KEDA hands it (the value in
    /// thousandths, truncated). Within the tolerance it keeps `current`; beyond it, it runs
    /// `ceil(usage / target)` (= `ceil(current × ratio)`).
    fn hpa(current: u32, value: f64, tolerance: f64) -> u32 {
        let usage = (value * 1000.0).trunc();
        let ratio = usage / (1000.0 * f64::from(current));
        if (1.0 - tolerance) <= ratio && ratio <= (1.0 + tolerance) {
            return current;
        }
        // A whole number of replicas, far inside u32.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let replicas = (usage / 1000.0).ceil() as u32;
        replicas.max(1)
    }

    /// The HPA's replicas after it follows `value` from `start` until they stop changing
    /// (each sync once; at most 100).
    fn settle(start: u32, value: f64, tolerance: f64) -> Vec<u32> {
        let mut seen = vec![start];
        for _ in 0..100 {
            let now = seen[seen.len() - 1];
            let next = hpa(now, value, tolerance);
            if next == now {
                break;
            }
            seen.push(next);
        }
        seen
    }

    fn signals(desired_workers: u32, shard_floor: u32) -> FleetSignals {
        FleetSignals {
            workers: 0,
            shards: 0,
            behind: std::time::Duration::ZERO,
            backlog_records: 0,
            arrival_rate: 0.0,
            drain_rate: 0.0,
            load: 0.0,
            needed: 0.0,
            recommended: desired_workers,
            desired_workers,
            shard_floor,
            at: None,
        }
    }

    #[test]
    fn the_model_is_the_hpa_a_figure_within_a_tenth_is_ignored() {
        // Beyond a tenth, ceil(current × ratio): 10 → 12, 100 → 80.
        assert_eq!(hpa(10, 12.0, DEFAULT_TOLERANCE), 12);
        assert_eq!(hpa(100, 80.0, DEFAULT_TOLERANCE), 80);
        // Within it, nothing: at 11 replicas 12 is never followed, at 20 neither 18 nor 22.
        assert_eq!(settle(11, 12.0, DEFAULT_TOLERANCE), vec![11]);
        assert_eq!(hpa(20, 22.0, DEFAULT_TOLERANCE), 20);
        assert_eq!(hpa(20, 18.0, DEFAULT_TOLERANCE), 20);
        assert_eq!(hpa(11, 12.0, 0.0), 12);
    }

    #[test]
    fn at_tolerance_zero_the_replicas_equal_the_figure_from_1_to_100_up_and_down() {
        for figure in 1..=100 {
            for floor in 0..=figure {
                let value = signals(figure, floor).for_autoscaler(0.0);
                for current in 1..=100 {
                    assert_eq!(
                        settle(current, value, 0.0).last(),
                        Some(&figure),
                        "figure {figure} (floor {floor}) from {current} replicas"
                    );
                }
            }
        }
    }

    /// With the HPA's default tolerance (which the configurable one replaces only from
    /// Kubernetes 1.33 with its gate), from 1 to 100 replicas up and down: whenever the
    /// shard floor applies, every count the HPA runs on its way and where it settles owns
    /// every shard (replicas × max_leases ≥ shards), and overshoots the figure by at most a
    /// tenth of it, rounded up.
    #[test]
    fn at_the_default_tolerance_no_shard_is_left_unowned_from_1_to_100_up_and_down() {
        for max_leases in [1_u32, 2, 3, 8] {
            for floor in 1..=100_u32 {
                // The fewest and the most shards with this floor.
                for shards in [(floor - 1) * max_leases + 1, floor * max_leases] {
                    for figure in floor..=100 {
                        let value = signals(figure, floor).for_autoscaler(DEFAULT_TOLERANCE);
                        check_one(max_leases, shards, figure, value);
                    }
                }
            }
        }
        // The case of the issue: 11 replicas, a floor of 12: 13 run.
        let value = signals(12, 12).for_autoscaler(DEFAULT_TOLERANCE);
        assert_eq!(settle(11, value, DEFAULT_TOLERANCE), vec![11, 13]);
        // A floor of 10 or less needs no raise: 9 → 10 is beyond a tenth already.
        assert!((signals(10, 10).for_autoscaler(DEFAULT_TOLERANCE) - 10.0).abs() < 1e-9);
    }

    fn check_one(max_leases: u32, shards: u32, figure: u32, value: f64) {
        for current in 1..=100 {
            let path = settle(current, value, DEFAULT_TOLERANCE);
            let counts = if current * max_leases >= shards {
                &path[..]
            } else {
                // The fleet it starts from is too small (a shard joined, a pod died): it
                // must grow at the first sync.
                &path[1..]
            };
            let settled = path.last().copied().unwrap_or(current);
            let shown = format!("figure {figure}, {shards} shards at {max_leases}: {path:?}");
            assert!(!counts.is_empty(), "{shown}: stays too small");
            for count in counts {
                assert!(count * max_leases >= shards, "{shown}: shards unowned");
            }
            let most = figure + figure.div_ceil(10);
            assert!(
                settled <= most.max(current),
                "{shown}: more than a tenth over"
            );
        }
    }
}
