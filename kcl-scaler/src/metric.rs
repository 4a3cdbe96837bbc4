//! Which figure a ScaledObject scales on, chosen by its trigger's metadata, and its value.
//!
//! KEDA's HPA divides a metric's value by its target to get the replicas it wants (an
//! `AverageValue` target). `desiredWorkers` at a target of 1 is the leader's figure as it is:
//! the formula, the shard cap, the minimum and the damping all apply once, in kcl. A backlog
//! target (`backlogRecords` at N records a replica) is there for those who would rather have
//! the HPA do the arithmetic; it knows nothing of the shard cap or of kcl's damping.

use std::collections::HashMap;

use kcl_core::FleetSignals;

use crate::proto::{MetricSpec, MetricValue};

/// The metric a ScaledObject scales on, from its trigger's `metadata`:
/// - nothing, or `metric: desiredWorkers`: [`FleetSignals::desired_workers`], target 1;
/// - `metric: backlogRecords` and `targetPerWorker: N`: [`FleetSignals::backlog_records`],
///   target N records a replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Metric {
    /// The workers the fleet should run, damped.
    DesiredWorkers,
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

    /// The metric a trigger's `metadata` asks for (other keys, such as KEDA's own
    /// `scalerAddress`, are left alone).
    pub fn from_metadata(metadata: &HashMap<String, String>) -> Result<Self, MetricError> {
        let target = metadata.get(Self::TARGET_KEY).map(|t| t.trim());
        match metadata.get(Self::METRIC_KEY).map(|m| m.trim()) {
            None | Some(Self::DESIRED_WORKERS) => match target {
                None => Ok(Self::DesiredWorkers),
                Some(_) => Err(MetricError {
                    key: Self::TARGET_KEY,
                    reason: format!(
                        "only used with metric {}: {} has a target of 1",
                        Self::BACKLOG_RECORDS,
                        Self::DESIRED_WORKERS
                    ),
                }),
            },
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
            Self::DesiredWorkers => Self::DESIRED_WORKERS,
            Self::BacklogRecords { .. } => Self::BACKLOG_RECORDS,
        }
    }

    /// The target a replica stands for.
    pub fn target(self) -> f64 {
        match self {
            Self::DesiredWorkers => 1.0,
            Self::BacklogRecords { per_worker } => per_worker,
        }
    }

    /// The metric's value in `fleet`.
    pub fn value(self, fleet: &FleetSignals) -> f64 {
        match self {
            Self::DesiredWorkers => f64::from(fleet.desired_workers),
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

    /// The value `GetMetrics` answers (the deprecated whole number too).
    pub(crate) fn metric_value(self, fleet: &FleetSignals) -> MetricValue {
        let value = self.value(fleet);
        MetricValue {
            metric_name: self.name().to_owned(),
            metric_value: whole(value),
            metric_value_float: value,
        }
    }
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
        assert_eq!(
            m(&[("scalerAddress", "kcl:9091")]),
            Ok(Metric::DesiredWorkers)
        );
        assert_eq!(
            m(&[("metric", "desiredWorkers")]),
            Ok(Metric::DesiredWorkers)
        );
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
        let spec = Metric::DesiredWorkers.spec();
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
        let v = Metric::DesiredWorkers.metric_value(&fleet);
        assert_eq!((v.metric_value, v.metric_value_float), (4, 4.0));
        let v = Metric::BacklogRecords { per_worker: 10.0 }.metric_value(&fleet);
        assert_eq!((v.metric_value, v.metric_value_float), (12_345, 12_345.0));
    }
}
