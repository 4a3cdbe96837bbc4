//! [`SingletonConfig`]: the timing of a singleton, validated like the worker's.

use std::time::Duration;

use crate::config::check_lease_timing;
use crate::error::ConfigError;

/// The longest line of standbys [`SingletonConfig::standbys`] allows.
pub const MAX_STANDBYS: u8 = 3;

/// Timing of a [`Singleton`](super::Singleton).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct SingletonConfig {
    /// As [`WorkerConfig::failover_time`](crate::WorkerConfig::failover_time). Default 10 s.
    /// Each call to the lease table is also given up after this long.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub failover_time: Duration,
    /// How often the holder renews. Default: a third of the failover time.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub renew_interval: Duration,
    /// How often candidates read the row. Default 1 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub poll_interval: Duration,
    /// How long a task has to return once its token is cancelled (on shutdown, or when its
    /// lease is at risk: renewals kept failing and less than this is left of its validity)
    /// before it is dropped at its next `.await`. It is dropped at the latest when the
    /// validity runs out, before any other candidate may take the row, so two instances never
    /// run at once. Default: a quarter of the failover time (2.5 s).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub stop_timeout: Duration,
    /// Health mode: when set, a task that does not call
    /// [`TaskContext::heartbeat`](super::TaskContext::heartbeat) within this long (from its
    /// start, then from its last call) is cancelled, dropped after `stop_timeout`, and its row
    /// released, so that another candidate starts it; this candidate then leaves it to the
    /// others for the failover time, doubling with each unhealthy run in a row up to 16×.
    /// Default: none (a task is trusted while it runs).
    #[cfg_attr(feature = "serde", serde(default, with = "humantime_serde"))]
    pub health_timeout: Option<Duration>,
    /// How many candidates stand in line behind the holder (at most [`MAX_STANDBYS`]). The
    /// first, the standby, reads the row every `poll_interval`; each next one reads the
    /// standby row ahead of it as often, so it moves up within a poll when the one ahead does;
    /// the other candidates read the last standby row every 2 × and the rows ahead of it every
    /// 6 × the failover time. W candidates thus cost about `standbys` reads a poll instead of
    /// W, and a takeover stays within the failover time plus a poll after the holder dies
    /// (within a poll after it stops) unless the holder and every standby are lost together;
    /// see `coordination/standby.rs` for the bounds. Each standby also renews its row like a
    /// holder. 0: every candidate reads the row every poll. Default 2.
    pub standbys: u8,
}

impl Default for SingletonConfig {
    fn default() -> Self {
        Self::derived(Duration::from_secs(10), Duration::from_secs(1), None)
    }
}

impl SingletonConfig {
    fn derived(failover_time: Duration, poll_interval: Duration, health: Option<Duration>) -> Self {
        // `standbys` is set after: `failover_time` keeps it (see the setter).
        Self {
            failover_time,
            renew_interval: failover_time / 3,
            poll_interval,
            stop_timeout: failover_time / 4,
            health_timeout: health,
            standbys: 2,
        }
    }

    /// Sets the failover time, and derives the renew interval (a third) and the stop timeout
    /// (a quarter) from it.
    #[must_use]
    pub fn failover_time(self, value: Duration) -> Self {
        let standbys = self.standbys;
        Self::derived(value, self.poll_interval, self.health_timeout).standbys(standbys)
    }

    /// Sets the poll interval.
    #[must_use]
    pub fn poll_interval(mut self, value: Duration) -> Self {
        self.poll_interval = value;
        self
    }

    /// Sets how many candidates stand in line: see [`SingletonConfig::standbys`].
    #[must_use]
    pub fn standbys(mut self, value: u8) -> Self {
        self.standbys = value;
        self
    }

    /// Turns health mode on: see [`SingletonConfig::health_timeout`].
    #[must_use]
    pub fn health_timeout(mut self, value: Duration) -> Self {
        self.health_timeout = Some(value);
        self
    }

    /// Sets the stop timeout.
    #[must_use]
    pub fn stop_timeout(mut self, value: Duration) -> Self {
        self.stop_timeout = value;
        self
    }

    /// How long a successful renewal keeps the lease valid here: the failover time less a
    /// tenth, as for shard leases.
    pub(crate) fn validity(&self) -> Duration {
        self.failover_time - self.failover_time / 10
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_owned(),
            })
        };
        let durations = [
            ("failover_time", self.failover_time),
            ("renew_interval", self.renew_interval),
            ("poll_interval", self.poll_interval),
            ("stop_timeout", self.stop_timeout),
        ];
        check_lease_timing(&durations, self.failover_time, self.renew_interval)?;
        if self.poll_interval.is_zero() {
            return err("poll_interval", "must be above zero");
        }
        if self.standbys > MAX_STANDBYS {
            return err("standbys", &format!("must be at most {MAX_STANDBYS}"));
        }
        if let Some(health) = self.health_timeout
            && (health.is_zero() || health > crate::config::MAX_DURATION)
        {
            return err("health_timeout", "must be above zero and at most 7 days");
        }
        if self.stop_timeout + self.renew_interval >= self.validity() {
            return err(
                "stop_timeout",
                "with renew_interval must stay below 0.9 × failover_time, or healthy renewals would cancel the task",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        assert_eq!(SingletonConfig::default().validate(), Ok(()));
        let short = SingletonConfig::default().failover_time(Duration::from_secs(2));
        assert_eq!(short.validate(), Ok(()));
        assert_eq!(short.stop_timeout, Duration::from_millis(500));
        let key = |c: SingletonConfig| c.validate().err().map(|e| e.key);
        let huge = Duration::from_secs(u64::MAX / 4);
        assert_eq!(
            key(SingletonConfig::default().failover_time(huge)),
            Some("failover_time")
        );
        assert_eq!(
            key(SingletonConfig::default().poll_interval(huge)),
            Some("poll_interval")
        );
        let slow = SingletonConfig::default().stop_timeout(Duration::from_secs(6));
        assert_eq!(key(slow), Some("stop_timeout"));
        let never = SingletonConfig::default().health_timeout(Duration::ZERO);
        assert_eq!(key(never), Some("health_timeout"));
        let long = SingletonConfig::default().standbys(MAX_STANDBYS + 1);
        assert_eq!(key(long), Some("standbys"));
        // The line survives a later change of the failover time too.
        let none = SingletonConfig::default()
            .standbys(0)
            .failover_time(Duration::from_secs(3));
        assert_eq!(none.standbys, 0);
        // Health mode survives a later change of the failover time.
        let health = SingletonConfig::default()
            .health_timeout(Duration::from_secs(5))
            .failover_time(Duration::from_secs(3));
        assert_eq!(health.health_timeout, Some(Duration::from_secs(5)));
    }
}
