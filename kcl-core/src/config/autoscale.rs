//! What the fleet tells its autoscaler: how many workers it needs (see
//! [`autoscale`](crate::autoscale) for the figures and the formula).

use std::time::Duration;

use crate::error::ConfigError;

/// How the leader turns backlog and rates into `desired_workers`, and whether it publishes
/// them for the other workers to answer an autoscaler with. See `docs/autoscaling.md` in the
/// repository and [`autoscale`](crate::autoscale).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct Autoscaling {
    /// A backlog is to be read within this, on top of what keeps arriving. Default 5 min:
    /// the time a deploy or a burst may leave a fleet behind without anyone being paged.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub catch_up: Duration,
    /// The share of each worker's capacity the recommendation plans to use: the headroom.
    /// Default 0.7 (the CPU target most HPA users pick).
    pub utilization: f64,
    /// Never recommend fewer workers, even more than the shards can use (an explicit floor
    /// wins over the one-worker-per-shard cap). Default 1: a fleet of none has nobody to read
    /// the table or answer the autoscaler.
    pub min_workers: u32,
    /// Never recommend more workers; `None`: only the shards cap it (a shard is read by one
    /// worker). Default `None`.
    pub max_workers: Option<u32>,
    /// A rise is followed once the recommendation has stayed above the current figure for
    /// this long. Default 0 (at once, as the HPA's default scale-up).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub scale_up_window: Duration,
    /// A fall is followed only to the highest recommendation of this window. Default 5 min
    /// (the HPA's default scale-down stabilization): scale-in is slower than scale-out.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub scale_down_window: Duration,
    /// The leader writes its figures to the lease table this often, so that every worker
    /// can answer an autoscaler with them (one row, `kcl-coordination/fleet-signals`; at
    /// 15 s about 5,800 write units a day). `None`, the default: not written (the leader's
    /// `/metrics` still shows them).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub publish_interval: Option<Duration>,
    /// A worker that does not lead answers an autoscaler from the published row only while
    /// it saw the row change within this, on its own clock (it never compares the leader's
    /// clock with its own); after, it says it knows no figure (KEDA's scaler answers
    /// UNAVAILABLE, and KEDA's `fallback` applies), so that a leader that stopped publishing
    /// does not leave every worker repeating its last figure. `None`, the default: three
    /// publish intervals and the failover time (55 s at 15 s and 10 s), what a leader change
    /// and an eventually consistent read take, and some.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub signals_max_age: Option<Duration>,
}

impl Default for Autoscaling {
    fn default() -> Self {
        Self {
            catch_up: Duration::from_secs(300),
            utilization: 0.7,
            min_workers: 1,
            max_workers: None,
            scale_up_window: Duration::ZERO,
            scale_down_window: Duration::from_secs(300),
            publish_interval: None,
            signals_max_age: None,
        }
    }
}

impl Autoscaling {
    /// Sets [`catch_up`](Self::catch_up).
    #[must_use]
    pub fn catch_up(mut self, value: Duration) -> Self {
        self.catch_up = value;
        self
    }

    /// Sets [`utilization`](Self::utilization).
    #[must_use]
    pub fn utilization(mut self, value: f64) -> Self {
        self.utilization = value;
        self
    }

    /// Sets [`min_workers`](Self::min_workers) and [`max_workers`](Self::max_workers).
    #[must_use]
    pub fn workers(mut self, min: u32, max: impl Into<Option<u32>>) -> Self {
        self.min_workers = min;
        self.max_workers = max.into();
        self
    }

    /// Sets [`scale_up_window`](Self::scale_up_window) and
    /// [`scale_down_window`](Self::scale_down_window).
    #[must_use]
    pub fn windows(mut self, up: Duration, down: Duration) -> Self {
        self.scale_up_window = up;
        self.scale_down_window = down;
        self
    }

    /// Sets [`publish_interval`](Self::publish_interval).
    #[must_use]
    pub fn publish_interval(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.publish_interval = value.into();
        self
    }

    /// Sets [`signals_max_age`](Self::signals_max_age).
    #[must_use]
    pub fn signals_max_age(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.signals_max_age = value.into();
        self
    }

    /// How long a follower trusts a published row that stopped changing, with the failover
    /// time `failover` (see [`signals_max_age`](Self::signals_max_age)); `None` while nothing
    /// is published.
    pub(crate) fn max_age(&self, failover: Duration) -> Option<Duration> {
        let interval = self.publish_interval?;
        Some(
            self.signals_max_age
                .unwrap_or_else(|| interval.saturating_mul(3).saturating_add(failover)),
        )
    }

    /// Checks the fields; the error names the first bad one (prefixed `autoscaling.`).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.catch_up.is_zero() || self.catch_up > super::MAX_DURATION {
            return err(
                "autoscaling.catch_up",
                "must be above zero and at most 7 days",
            );
        }
        if !(self.utilization.is_finite() && self.utilization > 0.0 && self.utilization <= 1.0) {
            return err("autoscaling.utilization", "must be above 0 and at most 1");
        }
        if self.min_workers == 0 {
            return err(
                "autoscaling.min_workers",
                "must be at least 1 (a fleet of none cannot answer its autoscaler)",
            );
        }
        if self.max_workers.is_some_and(|max| max < self.min_workers) {
            return err("autoscaling.max_workers", "must not be below min_workers");
        }
        for (key, value) in [
            ("autoscaling.scale_up_window", self.scale_up_window),
            ("autoscaling.scale_down_window", self.scale_down_window),
        ] {
            if value > super::MAX_DURATION {
                return err(key, "must be at most 7 days");
            }
        }
        if self
            .publish_interval
            .is_some_and(|d| d < Duration::from_secs(1) || d > super::MAX_DURATION)
        {
            return err(
                "autoscaling.publish_interval",
                "must be at least 1 s (each write is billed) and at most 7 days, or off",
            );
        }
        if let (Some(interval), Some(max_age)) = (self.publish_interval, self.signals_max_age)
            && (max_age <= interval || max_age > super::MAX_DURATION)
        {
            return err(
                "autoscaling.signals_max_age",
                "must be above publish_interval (a row changes once an interval at most) and at \
                 most 7 days",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_key() {
        let key = |a: Autoscaling| a.check().err().map(|e| e.key);
        assert_eq!(key(Autoscaling::default()), None);
        let zero = Duration::ZERO;
        assert_eq!(
            key(Autoscaling::default().catch_up(zero)),
            Some("autoscaling.catch_up")
        );
        assert_eq!(
            key(Autoscaling::default().utilization(1.5)),
            Some("autoscaling.utilization")
        );
        assert_eq!(
            key(Autoscaling::default().workers(0, None)),
            Some("autoscaling.min_workers")
        );
        assert_eq!(
            key(Autoscaling::default().workers(3, 2)),
            Some("autoscaling.max_workers")
        );
        assert_eq!(
            key(Autoscaling::default().publish_interval(zero)),
            Some("autoscaling.publish_interval")
        );
        assert_eq!(
            key(Autoscaling::default().publish_interval(Duration::from_millis(1))),
            Some("autoscaling.publish_interval")
        );
        let every = |s| Autoscaling::default().publish_interval(Duration::from_secs(s));
        assert_eq!(
            key(every(15).signals_max_age(Duration::from_secs(15))),
            Some("autoscaling.signals_max_age")
        );
        assert_eq!(
            key(every(15).signals_max_age(Duration::from_secs(16))),
            None
        );
    }

    #[test]
    fn signals_age_three_intervals_and_the_failover_time_unless_set() {
        let failover = Duration::from_secs(10);
        assert_eq!(Autoscaling::default().max_age(failover), None);
        let every = Autoscaling::default().publish_interval(Duration::from_secs(15));
        assert_eq!(every.max_age(failover), Some(Duration::from_secs(55)));
        let set = every.signals_max_age(Duration::from_secs(120));
        assert_eq!(set.max_age(failover), Some(Duration::from_secs(120)));
    }
}
