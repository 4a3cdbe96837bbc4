//! How many workers the fleet needs, worked out where the whole fleet is already in view.
//!
//! Autoscalers scale Kinesis consumers on CPU or on the number of shards (KEDA's Kinesis
//! scaler: 2 shards a replica), neither of which says whether the fleet keeps up. The
//! holders of leases already measure what they read (see [`lease::load`](crate::lease::load)),
//! and write it into their lease rows with the renewals and checkpoints they make anyway: how
//! fast records arrive, how fast they are read, how far behind the tip the shard is, and what
//! the reading costs (the lease's load). The leader, which follows the whole table, adds them
//! up into [`FleetSignals`] every cycle, exports them as metrics (`kcl_fleet_*`), and (with
//! [`Autoscaling::publish_interval`](crate::Autoscaling::publish_interval)) writes them to one
//! row of the lease table, from which every other worker answers an autoscaler too.
//!
//! **The formula** (`docs/autoscaling.md` says it with examples). For each shard, with
//! `a` its arrival rate (records/s), `r` its read rate, `s` how far behind it is (seconds),
//! and `w` the load its reading puts on its holder (units: 1 is one worker busy all the time):
//! - its backlog is `b = a × s` records, and a record costs `k = w / r` units (the fleet's
//!   average cost while a shard reads nothing, 1/1,000 while nothing is known);
//! - it needs `n = k × (a + b / catch_up)` units: what keeps arriving, and its backlog read
//!   within [`catch_up`](crate::Autoscaling::catch_up), at most one worker's share
//!   `c × utilization` (a shard is read by one worker: more workers cannot help it);
//! - the fleet needs `N = Σ n / (c × utilization)` workers, `c` the workers' mean capacity;
//!   `recommended` is `N` rounded up, at least `min_workers` (and enough for `max_leases`),
//!   at most `max_workers` and one worker per open shard.
//!
//! A worker's leases cannot cost more than its capacity: busy time beyond it is time spent
//! waiting for a core, so their costs are scaled down to it (else a saturated worker would
//! ask for one worker per shard). For the same reason, busy time grows as workers are taken
//! away, so the recommendation falls only to a size at which `N` would use at most 80 % of
//! the planned utilization, and it does not move while `N` is within a tenth of what was said
//! last, so that a need near a whole number of workers does not flap between two.
//!
//! **Damping**, as the HPA's stabilization windows: `desired_workers` follows a rise once
//! every recommendation of [`scale_up_window`](crate::Autoscaling::scale_up_window) is above
//! it (at once by default), and a fall only down to the highest recommendation of
//! [`scale_down_window`](crate::Autoscaling::scale_down_window) (5 min). A new leader starts
//! from the published figure, or from the workers it sees, never from nothing. Damping never
//! takes the figure below [`shard_floor`](FleetSignals::shard_floor): fewer workers would leave
//! shards unowned.
//!
//! **An autoscaler's tolerance.** The HPA ignores a figure within its tolerance (10 % unless
//! set) of the replicas running. A figure the shard floor raises must still reach the
//! replicas, so [`FleetSignals::for_autoscaler`] raises it past that tolerance (see there).
//!
//! **Freshness.** The published row carries when its figures were worked out, but a follower
//! never compares that with its own clock: it serves the row only while it sees the row change
//! within [`signals_max_age`](crate::Autoscaling::signals_max_age) on its own monotonic
//! clock, and says nothing (an autoscaler's fallback applies) once the row stands still.
//!
//! **Measured** by each lease's meter ([`lease::load`](crate::lease::load)), smoothed with
//! the balancing's time constant (a minute), and corrected for its start: a lease taken
//! from a fleet that was down reports what it reads within seconds, not a climb from zero.
//! The arrival rate is the records read per second of the stream's time the reads covered
//! (the read position moves by the records' arrival times: `now − millisBehindLatest`), so it
//! is the producers' rate whether the shard is caught up or catching up.

mod damping;
mod formula;
mod fresh;
mod hpa;
mod publish;

pub(crate) use damping::Damper;
pub(crate) use formula::{Fleet, recommend};
pub(crate) use fresh::Freshness;
pub(crate) use publish::Publisher;

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What the leader knows of the fleet's backlog and what it needs, as of its last cycle (see
/// the module docs). In [`Status::fleet`](crate::Status::fleet).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FleetSignals {
    /// Workers the leader sees active.
    pub workers: u32,
    /// Shards being read or to be read (leases not at their end).
    pub shards: u32,
    /// How far behind the tip the most behind shard is.
    pub behind: Duration,
    /// Records behind the tip, fleet wide (each shard's arrival rate × how far behind it is).
    pub backlog_records: u64,
    /// Records arriving per second, fleet wide.
    pub arrival_rate: f64,
    /// Records read per second, fleet wide: the fleet's drain rate.
    pub drain_rate: f64,
    /// The load the fleet carries now, in units (1: one worker busy all the time).
    pub load: f64,
    /// The load it needs to keep up and read its backlog within `catch_up`, in units.
    pub needed: f64,
    /// Workers the formula asks for now, before damping.
    pub recommended: u32,
    /// Workers the fleet should run: `recommended`, damped (what an autoscaler follows).
    pub desired_workers: u32,
    /// Workers enough for every open shard under `max_leases` (the shards over `max_leases`,
    /// rounded up): fewer would leave shards unowned. `desired_workers` is never below it. 0
    /// when not known (a row written by a version before this field).
    pub shard_floor: u32,
    /// When the leader worked these figures out, by its own clock; `None` in a row written by
    /// a version before this field. For people reading them: a follower judges a row's
    /// freshness by seeing it change on its own clock, never by comparing this with it.
    pub at: Option<DateTime<Utc>>,
}

impl FleetSignals {
    /// The signals as one line of text (the published row's `kclSignals`): version, then the
    /// fields in order, numbers only (`at` in milliseconds since the epoch, `-` if unknown).
    pub fn encode(&self) -> String {
        let at = self
            .at
            .map_or_else(|| "-".to_owned(), |at| at.timestamp_millis().to_string());
        format!(
            "v2 {} {} {} {} {:.3} {:.3} {:.4} {:.4} {} {} {} {at}",
            self.workers,
            self.shards,
            self.behind.as_millis(),
            self.backlog_records,
            self.arrival_rate,
            self.drain_rate,
            self.load,
            self.needed,
            self.recommended,
            self.desired_workers,
            self.shard_floor,
        )
    }

    /// Reads what [`encode`](Self::encode) wrote, or what a version before it wrote (`v1`:
    /// no `shard_floor`, read as 0, and no `at`); `None` for anything else (a row written by
    /// a newer version, or damaged: the reader keeps what it had).
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split_ascii_whitespace();
        let v2 = match parts.next()? {
            "v1" => false,
            "v2" => true,
            _ => return None,
        };
        let mut next = || parts.next();
        let finite = |x: f64| x.is_finite().then_some(x);
        let mut signals = Self {
            workers: next()?.parse().ok()?,
            shards: next()?.parse().ok()?,
            behind: Duration::from_millis(next()?.parse().ok()?),
            backlog_records: next()?.parse().ok()?,
            arrival_rate: finite(next()?.parse().ok()?)?,
            drain_rate: finite(next()?.parse().ok()?)?,
            load: finite(next()?.parse().ok()?)?,
            needed: finite(next()?.parse().ok()?)?,
            recommended: next()?.parse().ok()?,
            desired_workers: next()?.parse().ok()?,
            shard_floor: 0,
            at: None,
        };
        if v2 {
            signals.shard_floor = next()?.parse().ok()?;
            signals.at = match next()? {
                "-" => None,
                millis => Some(DateTime::from_timestamp_millis(millis.parse().ok()?)?),
            };
        }
        parts.next().is_none().then_some(signals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_read_back_as_written_and_nothing_else_reads() {
        let signals = FleetSignals {
            workers: 3,
            shards: 8,
            behind: Duration::from_millis(61_500),
            backlog_records: 12_345,
            arrival_rate: 250.5,
            drain_rate: 400.25,
            load: 1.5,
            needed: 2.25,
            recommended: 5,
            desired_workers: 4,
            shard_floor: 3,
            at: DateTime::from_timestamp_millis(1_700_000_000_123),
        };
        assert_eq!(
            FleetSignals::decode(&signals.encode()),
            Some(signals.clone())
        );
        let unknown_time = FleetSignals {
            at: None,
            ..signals
        };
        assert_eq!(
            FleetSignals::decode(&unknown_time.encode()),
            Some(unknown_time)
        );
        for bad in [
            "",
            "v3 1 2 3 4 5 6 7 8 9 10 11 12",
            "v2 1 2 3 4 5 6 7 8 9 10",
            "v2 1 2 3 4 5 6 7 8 9 10 11 x",
            "v1 1 2 3",
            "v1 1 2 3 4 NaN 6 7 8 9 10",
            "v1 1 2 3 4 5 6 7 8 9 10 11 12",
        ] {
            assert_eq!(FleetSignals::decode(bad), None, "{bad:?}");
        }
        let extra = format!("{} 11", signals.encode());
        assert_eq!(FleetSignals::decode(&extra), None);
    }

    #[test]
    fn a_row_written_before_the_floor_and_time_reads_without_them() {
        // As a leader of the version before this one wrote it.
        let old = FleetSignals::decode("v1 3 8 61500 12345 250.500 400.250 1.5000 2.2500 5 4");
        let old = old.map(|s| (s.desired_workers, s.shard_floor, s.at));
        assert_eq!(old, Some((4, 0, None)));
    }
}
