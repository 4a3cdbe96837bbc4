//! How the leader spreads leases over the fleet: by what they cost or by how many there are.
//!
//! Real streams are skewed: a few hot shards carry most of the bytes, and a fleet balanced by
//! lease counts can put all of them on one worker. KCL Java 3.x balances by host CPU within a
//! ±10 % *relative* band, which at 5 % CPU is half a point of noise, so quiet fleets move
//! leases for nothing. kcl balances by what each lease costs its holder (see
//! [`lease::load`](crate::lease::load)), moves only past an *absolute* band, a few moves a
//! minute at most, the move that fixes most first, and never a lease it moved lately.

use std::time::Duration;

use crate::error::ConfigError;

/// What the leader balances (under [`Coordination::Leader`](crate::Coordination::Leader); with
/// [`Coordination::EveryWorker`](crate::Coordination::EveryWorker) every worker balances counts,
/// as KCL Java's taker does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum BalanceBy {
    /// Each worker's load per unit of capacity, from the figures holders write
    /// with their renewals. Falls back to counts while no figure is known (a fleet of older
    /// workers, or one that has not measured anything yet), and balances counts among leases
    /// that cost nothing (an idle fleet still spreads its leases over new workers).
    Load,
    /// The default: lease counts only, no two workers more than one lease apart (as KCL Java
    /// 2.x). Load balancing is opt-in until the simulation proves it under crashes and
    /// restarts too, as it proves counts (see `docs/balancing.md`).
    #[default]
    Count,
}

/// How the leader places and balances leases; see [`docs/balancing.md`] in the repository
/// and the module docs of [`lease::load`](crate::lease::load).
///
/// [`docs/balancing.md`]: https://github.com/kcl-rs/kcl/blob/main/docs/balancing.md
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct Balancing {
    /// What is balanced. Default [`BalanceBy::Count`]; [`Balancing::by_load`] opts in.
    pub by: BalanceBy,
    /// This worker's capacity, relative to a standard worker (1): a pod with twice the CPU
    /// declares 2 and is given twice the load. Written with its renewals. Default 1.
    pub capacity: f64,
    /// The band, in units of load per unit of capacity (1 unit: a shard at its limit, see
    /// [`lease::load`](crate::lease::load)): leases move only while the most loaded worker is
    /// above the fleet's mean by more than this. Absolute, so a quiet fleet never moves.
    /// Default 0.1 (a tenth of one busy shard).
    pub band: f64,
    /// Most balancing moves the leader starts per [`move_window`](Self::move_window), fleet
    /// wide. Default 4.
    pub move_budget: usize,
    /// The window of [`move_budget`](Self::move_budget). Default 60 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub move_window: Duration,
    /// A lease handed over (by balancing or otherwise) is not moved for balance again within
    /// this. Default 10 min: long against the [`smoothing`](Self::smoothing), so a move is
    /// judged on what it did.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub stickiness: Duration,
    /// The time constant of the smoothed load figure. Default 60 s: a minute-long change is
    /// seen at 63 %, noise every few seconds is averaged away.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub smoothing: Duration,
}

impl Default for Balancing {
    fn default() -> Self {
        Self {
            by: BalanceBy::Count,
            capacity: 1.0,
            band: 0.1,
            move_budget: 4,
            move_window: Duration::from_secs(60),
            stickiness: Duration::from_secs(600),
            smoothing: Duration::from_secs(60),
        }
    }
}

impl Balancing {
    /// Balancing by load ([`BalanceBy::Load`]), the rest as default.
    pub fn by_load() -> Self {
        Self {
            by: BalanceBy::Load,
            ..Self::default()
        }
    }

    /// Balancing by lease counts only ([`BalanceBy::Count`], the default), the rest as
    /// default.
    pub fn by_count() -> Self {
        Self {
            by: BalanceBy::Count,
            ..Self::default()
        }
    }

    /// Sets [`by`](Self::by).
    #[must_use]
    pub fn by(mut self, by: BalanceBy) -> Self {
        self.by = by;
        self
    }

    /// Sets [`capacity`](Self::capacity).
    #[must_use]
    pub fn capacity(mut self, capacity: f64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets [`band`](Self::band).
    #[must_use]
    pub fn band(mut self, band: f64) -> Self {
        self.band = band;
        self
    }

    /// Sets [`move_budget`](Self::move_budget) per [`move_window`](Self::move_window).
    #[must_use]
    pub fn move_budget(mut self, moves: usize, per: Duration) -> Self {
        self.move_budget = moves;
        self.move_window = per;
        self
    }

    /// Sets [`stickiness`](Self::stickiness).
    #[must_use]
    pub fn stickiness(mut self, stickiness: Duration) -> Self {
        self.stickiness = stickiness;
        self
    }

    /// Sets [`smoothing`](Self::smoothing).
    #[must_use]
    pub fn smoothing(mut self, smoothing: Duration) -> Self {
        self.smoothing = smoothing;
        self
    }

    /// The capacity in thousandths, as written to the lease rows.
    pub(crate) fn capacity_milli(&self) -> u32 {
        crate::lease::load::milli(self.capacity).max(1)
    }

    /// Checks the fields; the error names the first bad one (prefixed `balancing.`).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_owned(),
            })
        };
        if !(self.capacity.is_finite() && (0.001..=1000.0).contains(&self.capacity)) {
            return err("balancing.capacity", "must be between 0.001 and 1000");
        }
        if !(self.band.is_finite() && self.band > 0.0) {
            return err(
                "balancing.band",
                "must be above zero (an absolute band: zero would move leases on noise)",
            );
        }
        if self.move_budget == 0 {
            return err("balancing.move_budget", "must be at least 1");
        }
        for (key, value) in [
            ("balancing.move_window", self.move_window),
            ("balancing.smoothing", self.smoothing),
        ] {
            if value.is_zero() || value > super::MAX_DURATION {
                return err(key, "must be above zero and at most 7 days");
            }
        }
        if self.stickiness > super::MAX_DURATION {
            return err("balancing.stickiness", "must be at most 7 days");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_key() {
        let key = |b: Balancing| b.check().err().map(|e| e.key);
        assert_eq!(key(Balancing::default()), None);
        assert_eq!(
            key(Balancing::default().capacity(0.0)),
            Some("balancing.capacity")
        );
        assert_eq!(
            key(Balancing::default().capacity(f64::NAN)),
            Some("balancing.capacity")
        );
        assert_eq!(key(Balancing::default().band(0.0)), Some("balancing.band"));
        let no_budget = Balancing::default().move_budget(0, Duration::from_secs(1));
        assert_eq!(key(no_budget), Some("balancing.move_budget"));
        let no_window = Balancing::default().move_budget(1, Duration::ZERO);
        assert_eq!(key(no_window), Some("balancing.move_window"));
        assert_eq!(Balancing::default().capacity(2.0).capacity_milli(), 2000);
    }
}
