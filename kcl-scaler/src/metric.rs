//! Which figure a ScaledObject scales on, chosen by its trigger's metadata, and its value.
//!
//! KEDA's HPA divides a metric's value by its target to get the replicas it wants (an
//! `AverageValue` target). `desiredWorkers` at a target of 1 is the leader's figure as it is:
//! the formula, the shard cap, the minimum and the damping all apply once, in kcl. Only where
//! the HPA's tolerance could leave a shard unowned is it raised (see
//! [`FleetSignals::for_autoscaler`]): the HPA ignores a figure within its tolerance of the
//! replicas running (10 % unless `scaleUp.tolerance` is set), and a figure the shard floor
//! sets must still be reached. The trigger's `scaleUpTolerance` says what tolerance the HPA
//! applies (default 0.1). A backlog target (`backlogRecords` at N records a replica) is there
//! for those who would rather have the HPA do the arithmetic; it knows nothing of the shard
//! cap or of kcl's damping.

use std::collections::HashMap;

use kcl_core::FleetSignals;

use crate::proto::{MetricSpec, MetricValue};

/// The metric a ScaledObject scales on, from its trigger's `metadata`:
/// - nothing, or `metric: desiredWorkers`: [`FleetSignals::desired_workers`], target 1, as
///   [`FleetSignals::for_autoscaler`] gives it to an HPA of tolerance `scaleUpTolerance`
///   (default `0.1`, the HPA's own default; `0` where the ScaledObject sets the HPA's
///   `behavior.scaleUp.tolerance` to 0 and the cluster applies it);
/// - `metric: backlogRecords` and `targetPerWorker: N`: [`FleetSignals::backlog_records`],
///   target N records a replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Metric {
    /// The workers the fleet should run, damped, raised past `tolerance` where the shard
    /// floor sets them.
    DesiredWorkers {
        /// The HPA's scale-up tolerance: a figure within it of the replicas is ignored.
        tolerance: f64,
    },
    /// Records behind the tip, fleet wide, at `per_worker` records a replica.
    BacklogRecords {
        /// The target: records of backlog one replica is for.
        per_worker: f64,
    },
}

/// A trigger's metadata the scaler cannot follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid scaler metadata `{key}`: {reason}")]
pub struct MetricError {
    /// The metadata key at fault.
    pub key: &'static str,
    /// Why.
    pub reason: String,
}

impl Metric {
    /// The metric's name for `desiredWorkers`.
    pub const DESIRED_WORKERS: &'static str = "desiredWorkers";
    /// The metric's name for `backlogRecords`.
    pub const BACKLOG_RECORDS: &'static str = "backlogRecords";
    /// The metadata key choosing the metric.
    pub const METRIC_KEY: &'static str = "metric";
    /// The metadata key of the backlog's target.
    pub const TARGET_KEY: &'static str = "targetPerWorker";
    /// The metadata key of the HPA's scale-up tolerance (`desiredWorkers`).
    pub const TOLERANCE_KEY: &'static str = "scaleUpTolerance";
    /// The HPA's tolerance unless set: Kubernetes' default.
    pub const DEFAULT_TOLERANCE: f64 = 0.1;

    /// The metric a trigger's `metadata` asks for (other keys, such as KEDA's own
    /// `scalerAddress`, are left alone).
    pub fn from_metadata(metadata: &HashMap<String, String>) -> Result<Self, MetricError> {
        let target = metadata.get(Self::TARGET_KEY).map(|t| t.trim());
        let tolerance = metadata.get(Self::TOLERANCE_KEY).map(|t| t.trim());
        match metadata.get(Self::METRIC_KEY).map(|m| m.trim()) {
            None | Some(Self::DESIRED_WORKERS) => match target {
                None => Ok(Self::DesiredWorkers {
                    tolerance: tolerance.map_or(Ok(Self::DEFAULT_TOLERANCE), parse_tolerance)?,
                }),
                Some(_) => Err(MetricError {
                    key: Self::TARGET_KEY,
                    reason: format!(
                        "only used with metric {}: {} has a target of 1",
                        Self::BACKLOG_RECORDS,
                        Self::DESIRED_WORKERS
                    ),
                }),
            },
            Some(Self::BACKLOG_RECORDS) if tolerance.is_some() => Err(MetricError {
                key: Self::TOLERANCE_KEY,
                reason: format!("only used with metric {}", Self::DESIRED_WORKERS),
            }),
            Some(Self::BACKLOG_RECORDS) => {
                let per_worker = target
                    .ok_or_else(|| MetricError {
                        key: Self::TARGET_KEY,
                        reason: format!(
                            "required with metric {}: records of backlog a replica is for",
                            Self::BACKLOG_RECORDS
                        ),
                    })?
                    .parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| MetricError {
                        key: Self::TARGET_KEY,
                        reason: format!("expected a number above 0, got {target:?}"),
                    })?;
                Ok(Self::BacklogRecords { per_worker })
            }
            Some(other) => Err(MetricError {
                key: Self::METRIC_KEY,
                reason: format!(
                    "expected {} or {}, got {other:?}",
                    Self::DESIRED_WORKERS,
                    Self::BACKLOG_RECORDS
                ),
            }),
        }
    }

    /// The metric's name, as KEDA asks for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::DesiredWorkers { .. } => Self::DESIRED_WORKERS,
            Self::BacklogRecords { .. } => Self::BACKLOG_RECORDS,
        }
    }

    /// The target a replica stands for.
    pub fn target(self) -> f64 {
        match self {
            Self::DesiredWorkers { .. } => 1.0,
            Self::BacklogRecords { per_worker } => per_worker,
        }
    }

    /// The metric's value in `fleet`.
    pub fn value(self, fleet: &FleetSignals) -> f64 {
        match self {
            Self::DesiredWorkers { tolerance } => fleet.for_autoscaler(tolerance),
            // Backlogs are far below 2^53 records: exact.
            #[allow(clippy::cast_precision_loss)]
            Self::BacklogRecords { .. } => fleet.backlog_records as f64,
        }
    }

    /// The spec `GetMetricSpec` answers (the deprecated whole number too, rounded up).
    pub(crate) fn spec(self) -> MetricSpec {
        MetricSpec {
            metric_name: self.name().to_owned(),
            target_size: whole(self.target().ceil()),
            target_size_float: self.target(),
        }
    }

    /// The value `GetMetrics` answers (the deprecated whole number too, rounded up: the
    /// replicas it asks for are those of the value itself).
    pub(crate) fn metric_value(self, fleet: &FleetSignals) -> MetricValue {
        let value = self.value(fleet);
        MetricValue {
            metric_name: self.name().to_owned(),
            metric_value: whole(value.ceil()),
            metric_value_float: value,
        }
    }
}

/// A tolerance as a trigger's metadata gives it: a fraction, at least 0 and below 1.
fn parse_tolerance(text: &str) -> Result<f64, MetricError> {
    text.parse::<f64>()
        .ok()
        .filter(|t| (0.0..1.0).contains(t))
        .ok_or_else(|| MetricError {
            key: Metric::TOLERANCE_KEY,
            reason: format!(
                "expected a fraction, at least 0 and below 1 (0.1: 10 %), got {text:?}"
            ),
        })
}

/// A whole number of at most `i64::MAX` as an `i64`.
#[allow(clippy::cast_possible_truncation)]
fn whole(x: f64) -> i64 {
    // `as` saturates: the values are whole counts, far inside i64.
    x.round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn desired_workers_unless_the_backlog_is_asked_for_with_a_target() {
        let m = |pairs: &[(&str, &str)]| Metric::from_metadata(&metadata(pairs));
        let desired = |tolerance| Ok(Metric::DesiredWorkers { tolerance });
        assert_eq!(m(&[("scalerAddress", "kcl:9091")]), desired(0.1));
        assert_eq!(m(&[("metric", "desiredWorkers")]), desired(0.1));
        assert_eq!(m(&[("scaleUpTolerance", "0")]), desired(0.0));
        assert_eq!(m(&[("scaleUpTolerance", " 0.05 ")]), desired(0.05));
        assert_eq!(
            m(&[("metric", "backlogRecords"), ("targetPerWorker", "5000")]),
            Ok(Metric::BacklogRecords { per_worker: 5000.0 })
        );
        let key = |pairs: &[(&str, &str)]| m(pairs).err().map(|e| e.key);
        assert_eq!(
            key(&[("metric", "backlogRecords")]),
            Some("targetPerWorker")
        );
        assert_eq!(
            key(&[("metric", "backlogRecords"), ("targetPerWorker", "0")]),
            Some("targetPerWorker")
        );
        assert_eq!(
            key(&[("metric", "backlogRecords"), ("targetPerWorker", "NaN")]),
            Some("targetPerWorker")
        );
        assert_eq!(key(&[("targetPerWorker", "10")]), Some("targetPerWorker"));
        for bad in ["-0.1", "1", "NaN", "10%"] {
            assert_eq!(key(&[("scaleUpTolerance", bad)]), Some("scaleUpTolerance"));
        }
        assert_eq!(
            key(&[
                ("metric", "backlogRecords"),
                ("targetPerWorker", "5"),
                ("scaleUpTolerance", "0")
            ]),
            Some("scaleUpTolerance")
        );
        assert_eq!(key(&[("metric", "shards")]), Some("metric"));
        let error = m(&[("metric", "shards")]).err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "invalid scaler metadata `metric`: expected desiredWorkers or backlogRecords, \
                 got \"shards\""
            )
        );
    }

    #[test]
    fn specs_and_values_carry_the_float_and_the_whole_number() {
        let spec = Metric::DesiredWorkers { tolerance: 0.1 }.spec();
        assert_eq!(
            (
                spec.metric_name.as_str(),
                spec.target_size,
                spec.target_size_float
            ),
            ("desiredWorkers", 1, 1.0)
        );
        let spec = Metric::BacklogRecords { per_worker: 2.5 }.spec();
        assert_eq!(
            (
                spec.metric_name.as_str(),
                spec.target_size,
                spec.target_size_float
            ),
            ("backlogRecords", 3, 2.5)
        );
        let fleet = FleetSignals::decode("v1 3 8 61500 12345 250.500 400.250 1.5 2.25 5 4")
            .unwrap_or_else(|| unreachable!("a valid line"));
        let v = Metric::DesiredWorkers { tolerance: 0.1 }.metric_value(&fleet);
        assert_eq!((v.metric_value, v.metric_value_float), (4, 4.0));
        let v = Metric::BacklogRecords { per_worker: 10.0 }.metric_value(&fleet);
        assert_eq!((v.metric_value, v.metric_value_float), (12_345, 12_345.0));
    }

    /// At 11 replicas the HPA ignores 12 (within its 10 %): a 12 the shard floor sets is
    /// raised past it, unless the trigger says the HPA's tolerance is 0.
    #[test]
    fn a_figure_the_shard_floor_sets_is_raised_past_the_hpas_tolerance() {
        let floor_driven = FleetSignals::decode("v2 11 24 0 0 0 0 0 0 12 12 12 -")
            .unwrap_or_else(|| unreachable!("a valid line"));
        let desired = |tolerance| Metric::DesiredWorkers { tolerance }.metric_value(&floor_driven);
        let v = desired(0.1);
        assert!(v.metric_value_float > 12.1, "{v:?}: within 10 % of 11");
        assert_eq!(v.metric_value, 13);
        let v = desired(0.0);
        assert_eq!((v.metric_value, v.metric_value_float), (12, 12.0));
        // A need above the floor's edge is given as it is.
        let needed = FleetSignals::decode("v2 11 24 0 0 0 0 0 0 14 14 12 -")
            .unwrap_or_else(|| unreachable!("a valid line"));
        let v = Metric::DesiredWorkers { tolerance: 0.1 }.metric_value(&needed);
        assert_eq!((v.metric_value, v.metric_value_float), (14, 14.0));
    }
}
