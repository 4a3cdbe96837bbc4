//! Worker configuration: typed, with documented defaults and validation.

use std::time::Duration;

use crate::error::ConfigError;
use crate::failure::FailurePolicy;
use crate::types::InitialPosition;

mod autoscale;
mod balance;
mod modes;
#[cfg(feature = "serde")]
mod off_or_duration;
mod parse;

pub use autoscale::Autoscaling;
pub use balance::{BalanceBy, Balancing};
pub use modes::{Coordination, Liveness, Retrieval};
pub use parse::{InitialPositionKind, ParseModeError, RetrievalMode};

/// How a [`Worker`](crate::Worker) coordinates and consumes.
///
/// Every default says where it comes from. Where we depart from KCL Java it is to fail over
/// faster: KCL Java scans the lease table every 20 s, we scan every second, which lets a lease
/// held by a dead worker move after the failover time plus about a second instead of up to
/// half a minute later. Under the default, [`Coordination::Leader`], only a leader and a
/// standby read the whole table (through its change feed), so the reads do not grow with the
/// number of workers; [`Coordination::EveryWorker`] has every worker read it every cycle.
///
/// With the feature `serde` it reads from a configuration file: durations as humantime
/// strings (`"10s"`), unknown keys refused.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
#[doc(
    alias = "ConfigsBuilder",
    alias = "LeaseManagementConfig",
    alias = "CoordinatorConfig",
    alias = "RetrievalConfig"
)]
pub struct WorkerConfig {
    /// A lease whose counter has not moved for this long, as observed on the local monotonic
    /// clock, is expired and may be taken. Default 10 s (KCL Java `failoverTimeMillis`).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub failover_time: Duration,
    /// How often held leases are renewed, or under [`Liveness::Heartbeat`] the worker's
    /// heartbeat. Default: a third of `failover_time` (KCL Java); the
    /// [`liveness`](Self::liveness) setter makes it half for heartbeats.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub renew_interval: Duration,
    /// How often the lease table is read to take, balance and adopt leases. Default 1 s
    /// (KCL Java: 2 × failover time; see the module docs for why we scan more often).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub taker_interval: Duration,
    /// How often the stream's shards are listed to create leases for new shards. Default 60 s
    /// (KCL Java `shardSyncIntervalMillis`); a shard reaching its end triggers a sync at once.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub shard_sync_interval: Duration,
    /// How long a finished parent lease stays after its children started before it is deleted.
    /// Default 5 min (KCL Java's completed-lease cleanup interval). Keeping it well above the
    /// failover time means no worker with a stale view can bring it back.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub lease_cleanup_delay: Duration,
    /// Most leases one worker holds. Default unlimited (KCL Java `maxLeasesForWorker`).
    pub max_leases: usize,
    /// Most leases requested from other workers in one taker cycle. Default 1 (KCL Java
    /// `maxLeasesToStealAtOneTime`).
    pub max_leases_to_steal: usize,
    /// Where a shard without a checkpoint starts. Default TRIM_HORIZON (KCL Java: LATEST; we
    /// prefer to lose nothing still retained).
    pub initial_position: InitialPosition,
    /// Records asked for per `GetRecords`. Default 10,000 (the Kinesis maximum, KCL Java).
    pub max_records: u32,
    /// Pause after an empty read before polling again. Default 1 s (KCL Java
    /// `idleTimeBetweenReadsInMillis`; Kinesis allows 5 reads per shard per second).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub idle_time_between_reads: Duration,
    /// When set, a shard that has delivered nothing for this long gets a `process_records`
    /// call with an empty batch, and again every such interval while it stays quiet, so that
    /// a processor that checkpoints "every N records or T seconds" can checkpoint on a shard
    /// that went quiet. Default none: batches are never empty (KCL Java
    /// `callProcessRecordsEvenForEmptyRecordList`, there on every empty read).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub empty_batch_interval: Option<Duration>,
    /// How often a child shard checks whether its parents have finished. Default 1 s (KCL Java:
    /// 10 s `parentShardPollIntervalMillis`, which delays every resharding by that much).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub parent_poll_interval: Duration,
    /// Batches fetched ahead of the processor, per shard. Default 3 (KCL Java
    /// `maxPendingProcessRecordsInput`).
    pub max_prefetch_batches: usize,
    /// Bytes fetched ahead of the processor, per shard. Default 8 MiB (KCL Java prefetch
    /// `maxByteSize`).
    pub max_prefetch_bytes: usize,
    /// Reads (`GetRecords`, `GetShardIterator`) in flight at once across all of the worker's
    /// shards. Default 16 (no KCL Java equivalent: it reads each shard on a thread of its
    /// own). Each read in flight holds a connection and, while it is answered, up to a 10 MiB
    /// response; shards whose reads wait take turns. At 30–100 ms a read, 16 serve 160–500
    /// reads a second: an idle shard needs 1 a second, and a shard catching up gets up to
    /// 10,000 records a read, more than a 2-core worker processes. Measured: a worker holding
    /// 100 idle shards peaks at 20.0 MiB with 16, 26.1 MiB without a bound (docs/benchmarks.md).
    pub max_concurrent_reads: usize,
    /// First delay after a throttled or failed call; doubles up to `max_backoff`. Default
    /// 100 ms (AWS SDK standard retry base).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub min_backoff: Duration,
    /// Longest delay between retries. Default 10 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_backoff: Duration,
    /// Graceful shutdown deadline: processors get `shutdown_requested` and leases are released;
    /// after this, remaining shard tasks are stopped. Default 30 s (ECS `stopTimeout` default;
    /// KCL Java's graceful shutdown has no deadline by default).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub shutdown_timeout: Duration,
    /// For a worker with a stable identity (the same [`WorkerBuilder::id`](crate::WorkerBuilder::id)
    /// across restarts: a StatefulSet pod, an ECS service with fixed names, a systemd unit):
    /// on a graceful shutdown its processors checkpoint (`shutdown_requested`) as always, but
    /// its leases stay its own instead of being released, marked
    /// ([`Lease::restart_grace`](crate::Lease::restart_grace)) so that other workers wait this
    /// much longer than the failover time before they take them. When it comes back under
    /// the same id it resumes them at once (a conditional take of each, which also fences any
    /// older process of that id); if it does not come back in time they fail over as after a
    /// crash: a rolling restart moves no lease. Expiry stays judged by a counter standing still
    /// (the failover time + this) on each observer's monotonic clock. A KCL Java worker in the
    /// fleet ignores the mark and takes such leases after the failover time.
    ///
    /// Default `None` (`"off"` in a file): leases are released at once on shutdown (KCL Java's
    /// behaviour). Off, because a worker whose id changes at every start (a Kubernetes
    /// Deployment's pod names, the default [`WorkerId::for_this_process`](crate::WorkerId::for_this_process))
    /// never comes back to resume: its leases would wait the failover time + this for nothing.
    /// A worker stopped for good with this set (a scale-down) leaves its leases waiting that
    /// long too.
    #[cfg_attr(feature = "serde", serde(with = "off_or_duration"))]
    pub restart_grace: Option<Duration>,
    /// The longest any one lease-table or stream call may take before the worker gives up on
    /// it and treats it as failed (the write may or may not have been applied). Default 15 s,
    /// above kcl-aws's SDK operation timeouts (10 s), so that the SDK's own error comes
    /// first; KCL Java sets none. Renewals are bounded tighter, by the lease's validity.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub call_timeout: Duration,
    /// How far this host's clock may run ahead of the stream's. A shard started at `LATEST`
    /// is pinned at the local time of its first open less this margin, so that a reopen before
    /// the first checkpoint (an expired iterator, a restart, a new owner) skips nothing written
    /// after the first open; records that arrived within the margin before it may then be
    /// delivered too. Default 2 s (NTP keeps hosts within milliseconds; KCL Java has no pin
    /// and reopens at `LATEST`, skipping what arrived in between).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_clock_skew: Duration,
    /// How long a held shard's checkpoint may stand still while records past it wait before
    /// the shard is reported stalled ([`ProblemKind::Stalled`](crate::ProblemKind)): its
    /// processor hangs, keeps failing, or never checkpoints. The age counts from the
    /// checkpoint's last move (or from when records began waiting, if later), across the
    /// processor's restarts, so a processor that checkpoints as it goes is never stalled.
    /// `None` (`"off"` in a file) reports no shard stalled: for a processor that
    /// checkpoints only when it stops. Default 10 min (kcl's own; KCL Java reports nothing
    /// of the kind). The metric `kcl_checkpoint_age_seconds` shows the age at any moment,
    /// also when this is off.
    #[cfg_attr(feature = "serde", serde(with = "off_or_duration"))]
    pub stalled_after: Option<Duration>,
    /// Records of a shard held from its oldest unfinished one on (delivered to a processor
    /// that acknowledges later, see [`ack`](crate::ack)), finished or not: at this many,
    /// reading the shard pauses (a batch already read is still delivered, so up to one batch
    /// more may wait). A record that never finishes thus holds at most this many behind it,
    /// and that is all a crash replays. Default 1,000 (kcl's own; KCL Java has no
    /// asynchronous acknowledgement).
    pub max_unacknowledged: usize,
    /// The worker checkpoints acknowledged records (the watermark, see [`ack`](crate::ack))
    /// once this many have finished since its last checkpoint. Default 1,000.
    pub ack_checkpoint_every: u64,
    /// ... or once this long has passed since the first of them finished. Default 5 s (kcl's
    /// own, as `ack_checkpoint_every`: at most one lease write per shard per interval).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub ack_checkpoint_interval: Duration,
    /// Who reads the whole lease table. Default [`Coordination::Leader`] (an elected leader
    /// and a standby follow it through its change feed; with
    /// [`Coordination::EveryWorker`] every worker reads it every taker interval).
    pub coordination: Coordination,
    /// What proves a holder alive. Default [`Liveness::PerLease`] (KCL Java's rule: every
    /// held lease is renewed every `renew_interval`).
    pub liveness: Liveness,
    /// How records are read. Default [`Retrieval::Polling`] (`GetRecords`, as KCL Java 1.x
    /// and KCL Java 2.x's polling mode; fan-out is KCL Java 2.x's default, here an opt-in,
    /// because each stream consumer costs extra on AWS).
    pub retrieval: Retrieval,
    /// What a batch processor's failing batch costs: retries of the record that fails (named
    /// with [`BatchFailed`](crate::failure::BatchFailed), or found by bisecting), and what
    /// happens when they are spent. Default [`FailurePolicy::block`] (KCL Java's behaviour: the
    /// shard restarts from its checkpoint until the batch succeeds). A policy that
    /// dead-letters needs a sink ([`WorkerBuilder::dead_letters`](crate::WorkerBuilder::dead_letters)).
    /// Under [`Parallel`](crate::Parallel) set [`Parallel::on_failure`](crate::Parallel::on_failure)
    /// instead. See [`failure`](crate::failure).
    pub failure: FailurePolicy,
    /// How the leader places and balances leases: by counts (the default) or by what they cost
    /// ([`Balancing::by_load`]: within an absolute band, a move budget and a stickiness window);
    /// and this worker's capacity. See [`Balancing`].
    pub balancing: Balancing,
    /// How the leader works out how many workers the fleet needs (`desired_workers`, for an
    /// autoscaler), and whether it publishes it for every worker to answer with. See
    /// [`Autoscaling`] and [`autoscale`](crate::autoscale).
    pub autoscaling: Autoscaling,
}

/// The longest duration any setting may have: far beyond any useful value, and small enough
/// that adding it to a clock reading never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The checks every lease holder's timing must pass: each duration at most [`MAX_DURATION`],
/// a failover time of at least 100 ms, and renewals at least twice per failover time, so
/// that one failed renewal does not lose the lease.
pub(crate) fn check_lease_timing(
    durations: &[(&'static str, Duration)],
    failover_time: Duration,
    renew_interval: Duration,
) -> Result<(), ConfigError> {
    let err = |key, reason: &str| {
        Err(ConfigError {
            key,
            reason: reason.to_owned(),
        })
    };
    for &(key, value) in durations {
        if value > MAX_DURATION {
            return err(key, "must be at most 7 days");
        }
    }
    if failover_time < Duration::from_millis(100) {
        return err("failover_time", "must be at least 100ms");
    }
    if renew_interval.is_zero() || renew_interval * 2 > failover_time {
        return err(
            "renew_interval",
            "must be above zero and at most half of failover_time, so that one failed renewal does not lose the lease",
        );
    }
    Ok(())
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let failover_time = Duration::from_secs(10);
        Self {
            failover_time,
            renew_interval: failover_time / 3,
            taker_interval: Duration::from_secs(1),
            shard_sync_interval: Duration::from_secs(60),
            lease_cleanup_delay: Duration::from_secs(300),
            max_leases: usize::MAX,
            max_leases_to_steal: 1,
            initial_position: InitialPosition::TrimHorizon,
            max_records: 10_000,
            idle_time_between_reads: Duration::from_secs(1),
            empty_batch_interval: None,
            parent_poll_interval: Duration::from_secs(1),
            max_prefetch_batches: 3,
            max_prefetch_bytes: 8 << 20,
            max_concurrent_reads: 16,
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            restart_grace: None,
            call_timeout: Duration::from_secs(15),
            max_clock_skew: Duration::from_secs(2),
            stalled_after: Some(Duration::from_secs(600)),
            max_unacknowledged: 1_000,
            ack_checkpoint_every: 1_000,
            ack_checkpoint_interval: Duration::from_secs(5),
            coordination: Coordination::Leader,
            liveness: Liveness::PerLease,
            retrieval: Retrieval::Polling,
            failure: FailurePolicy::block(),
            balancing: Balancing::default(),
            autoscaling: Autoscaling::default(),
        }
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, value: $ty) -> Self {
                self.$name = value;
                self
            }
        )*
    };
}

impl WorkerConfig {
    /// Sets the failover time and derives the renew interval from it: a third, or half under
    /// [`Liveness::Heartbeat`] (see [`liveness`](Self::liveness)).
    #[must_use]
    pub fn failover_time(mut self, value: Duration) -> Self {
        self.failover_time = value;
        self.renew_interval = self.derived_renew_interval();
        self
    }

    /// Sets [`WorkerConfig::liveness`] and derives the renew interval for it from the failover
    /// time: a third per lease (KCL Java), half for a heartbeat. A heartbeat renewed every half
    /// failover time still gets four attempts (one, then retries every eighth) before its
    /// validity (0.9 × failover time) runs out, and it is the fleet's main cost under
    /// heartbeats: every half costs two thirds of every third. Set `renew_interval` after this to choose
    /// another. (Deserialized configurations keep the `renew_interval` they give, or the
    /// default third.)
    #[must_use]
    pub fn liveness(mut self, value: Liveness) -> Self {
        self.liveness = value;
        self.renew_interval = self.derived_renew_interval();
        self
    }

    /// Sets [`WorkerConfig::stalled_after`]: a duration, or `None` to report no shard
    /// stalled.
    #[must_use]
    pub fn stalled_after(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.stalled_after = value.into();
        self
    }

    /// Sets [`WorkerConfig::restart_grace`]: how much longer than the failover time the
    /// fleet waits for this worker to come back under its id after a graceful shutdown, or
    /// `None` to release its leases at once.
    #[must_use]
    pub fn restart_grace(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.restart_grace = value.into();
        self
    }

    fn derived_renew_interval(&self) -> Duration {
        match self.liveness {
            Liveness::PerLease => self.failover_time / 3,
            Liveness::Heartbeat => self.failover_time / 2,
        }
    }

    setters! {
        /// Sets [`WorkerConfig::renew_interval`].
        renew_interval: Duration,
        /// Sets [`WorkerConfig::taker_interval`].
        taker_interval: Duration,
        /// Sets [`WorkerConfig::shard_sync_interval`].
        shard_sync_interval: Duration,
        /// Sets [`WorkerConfig::lease_cleanup_delay`].
        lease_cleanup_delay: Duration,
        /// Sets [`WorkerConfig::max_leases`].
        max_leases: usize,
        /// Sets [`WorkerConfig::max_leases_to_steal`].
        max_leases_to_steal: usize,
        /// Sets [`WorkerConfig::initial_position`].
        initial_position: InitialPosition,
        /// Sets [`WorkerConfig::max_records`].
        max_records: u32,
        /// Sets [`WorkerConfig::idle_time_between_reads`].
        idle_time_between_reads: Duration,
        /// Sets [`WorkerConfig::empty_batch_interval`].
        empty_batch_interval: Option<Duration>,
        /// Sets [`WorkerConfig::parent_poll_interval`].
        parent_poll_interval: Duration,
        /// Sets [`WorkerConfig::max_prefetch_batches`].
        max_prefetch_batches: usize,
        /// Sets [`WorkerConfig::max_prefetch_bytes`].
        max_prefetch_bytes: usize,
        /// Sets [`WorkerConfig::max_concurrent_reads`].
        max_concurrent_reads: usize,
        /// Sets [`WorkerConfig::min_backoff`].
        min_backoff: Duration,
        /// Sets [`WorkerConfig::max_backoff`].
        max_backoff: Duration,
        /// Sets [`WorkerConfig::shutdown_timeout`].
        shutdown_timeout: Duration,
        /// Sets [`WorkerConfig::call_timeout`].
        call_timeout: Duration,
        /// Sets [`WorkerConfig::max_clock_skew`].
        max_clock_skew: Duration,
        /// Sets [`WorkerConfig::max_unacknowledged`].
        max_unacknowledged: usize,
        /// Sets [`WorkerConfig::ack_checkpoint_every`].
        ack_checkpoint_every: u64,
        /// Sets [`WorkerConfig::ack_checkpoint_interval`].
        ack_checkpoint_interval: Duration,
        /// Sets [`WorkerConfig::coordination`].
        coordination: Coordination,
        /// Sets [`WorkerConfig::retrieval`].
        retrieval: Retrieval,
        /// Sets [`WorkerConfig::failure`].
        failure: FailurePolicy,
        /// Sets [`WorkerConfig::balancing`].
        balancing: Balancing,
        /// Sets [`WorkerConfig::autoscaling`].
        autoscaling: Autoscaling,
    }

    /// Every duration field with its key.
    fn durations(&self) -> [(&'static str, Duration); 15] {
        [
            ("failover_time", self.failover_time),
            ("renew_interval", self.renew_interval),
            ("taker_interval", self.taker_interval),
            ("shard_sync_interval", self.shard_sync_interval),
            ("lease_cleanup_delay", self.lease_cleanup_delay),
            ("idle_time_between_reads", self.idle_time_between_reads),
            ("parent_poll_interval", self.parent_poll_interval),
            ("min_backoff", self.min_backoff),
            ("max_backoff", self.max_backoff),
            ("shutdown_timeout", self.shutdown_timeout),
            ("call_timeout", self.call_timeout),
            ("max_clock_skew", self.max_clock_skew),
            ("stalled_after", self.stalled_after.unwrap_or_default()),
            ("ack_checkpoint_interval", self.ack_checkpoint_interval),
            ("restart_grace", self.restart_grace.unwrap_or_default()),
        ]
    }

    /// Checks every field; the error names the first bad one and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_owned(),
            })
        };
        check_lease_timing(&self.durations(), self.failover_time, self.renew_interval)?;
        for (key, value) in [
            ("taker_interval", self.taker_interval),
            ("shard_sync_interval", self.shard_sync_interval),
            ("idle_time_between_reads", self.idle_time_between_reads),
            ("parent_poll_interval", self.parent_poll_interval),
            ("min_backoff", self.min_backoff),
            ("call_timeout", self.call_timeout),
            ("ack_checkpoint_interval", self.ack_checkpoint_interval),
        ] {
            if value.is_zero() {
                return err(key, "must be above zero");
            }
        }
        if self.empty_batch_interval.is_some_and(|d| d.is_zero()) {
            return err("empty_batch_interval", "must be above zero when set");
        }
        if self.stalled_after.is_some_and(|d| d.is_zero()) {
            return err("stalled_after", "must be above zero, or off");
        }
        if self.restart_grace.is_some_and(|d| d.is_zero()) {
            return err("restart_grace", "must be above zero, or off");
        }
        if let Retrieval::FanOut { consumer_name } = &self.retrieval {
            let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
            if consumer_name.is_empty()
                || consumer_name.len() > 128
                || !consumer_name.chars().all(valid)
            {
                return err(
                    "retrieval.consumer_name",
                    "must be 1 to 128 characters of a-z, A-Z, 0-9, `_`, `.` and `-` (the Kinesis rule)",
                );
            }
        }
        if self.lease_cleanup_delay < self.failover_time {
            return err("lease_cleanup_delay", "must be at least failover_time");
        }
        if self.max_backoff < self.min_backoff {
            return err("max_backoff", "must not be below min_backoff");
        }
        if !(1..=10_000).contains(&self.max_records) {
            return err(
                "max_records",
                "must be between 1 and 10000 (the Kinesis limit)",
            );
        }
        for (key, value) in [
            ("max_leases", self.max_leases),
            ("max_leases_to_steal", self.max_leases_to_steal),
            ("max_prefetch_batches", self.max_prefetch_batches),
            ("max_prefetch_bytes", self.max_prefetch_bytes),
            ("max_concurrent_reads", self.max_concurrent_reads),
            ("max_unacknowledged", self.max_unacknowledged),
        ] {
            if value == 0 {
                return err(key, "must be at least 1");
            }
        }
        if self.ack_checkpoint_every == 0 {
            return err("ack_checkpoint_every", "must be at least 1");
        }
        self.failure
            .check(["failure.attempts", "failure.outage_after"])?;
        self.balancing.check()?;
        self.autoscaling.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_derived() {
        let c = WorkerConfig::default();
        assert_eq!(c.validate(), Ok(()));
        let c = c.failover_time(Duration::from_secs(3));
        assert_eq!(c.renew_interval, Duration::from_secs(1));
    }

    #[test]
    fn invalid_values_name_the_key() {
        let c = WorkerConfig::default().renew_interval(Duration::from_secs(9));
        assert_eq!(c.validate().map_err(|e| e.key), Err("renew_interval"));
        let c = WorkerConfig::default().max_records(0);
        let e = c.validate().err();
        assert_eq!(e.as_ref().map(|e| e.key), Some("max_records"));
        assert!(e.is_some_and(|e| e.to_string().contains("max_records")));
        let c = WorkerConfig::default().taker_interval(Duration::ZERO);
        assert_eq!(c.validate().map_err(|e| e.key), Err("taker_interval"));
        let c = WorkerConfig::default().restart_grace(Duration::ZERO);
        assert_eq!(c.validate().map_err(|e| e.key), Err("restart_grace"));
        let c = WorkerConfig::default().restart_grace(Duration::from_secs(60));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            WorkerConfig::default().restart_grace,
            None,
            "off by default"
        );
        for name in ["", "has space", &"x".repeat(129)] {
            let c = WorkerConfig::default().retrieval(Retrieval::FanOut {
                consumer_name: name.to_owned(),
            });
            assert_eq!(
                c.validate().map_err(|e| e.key),
                Err("retrieval.consumer_name")
            );
        }
        let c = WorkerConfig::default().retrieval(Retrieval::FanOut {
            consumer_name: "my-app_1.v2".to_owned(),
        });
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn every_duration_is_bounded_so_clock_arithmetic_cannot_overflow() {
        let huge = Duration::from_secs(u64::MAX / 2);
        let c = WorkerConfig::default();
        let cases = [
            ("shutdown_timeout", c.clone().shutdown_timeout(huge)),
            ("failover_time", c.clone().failover_time(huge)),
            ("taker_interval", c.clone().taker_interval(huge)),
            ("lease_cleanup_delay", c.clone().lease_cleanup_delay(huge)),
            ("max_backoff", c.clone().max_backoff(huge)),
            ("call_timeout", c.clone().call_timeout(huge)),
            ("max_clock_skew", c.clone().max_clock_skew(huge)),
            ("restart_grace", c.clone().restart_grace(huge)),
        ];
        for (key, config) in cases {
            let e = config.validate().err();
            assert_eq!(e.as_ref().map(|e| e.key), Some(key), "{e:?}");
            assert!(e.is_some_and(|e| e.reason.contains("at most")));
        }
        assert_eq!(c.shutdown_timeout(MAX_DURATION).validate(), Ok(()));
    }
}
