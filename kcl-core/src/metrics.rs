//! Metric names, emitted through the [`metrics`] facade.
//!
//! The library records; the application chooses an exporter (the example consumer serves
//! Prometheus text). Per-shard series carry a `shard` label; fleet-level ones carry none.
//!
//! **Series stay fresh while they mean something.** A running worker refreshes every counter
//! and gauge it owns every `taker_interval` (counters at zero from the start, so `rate()` has
//! something to work on), and each shard task refreshes its shard's series as often while it
//! holds the lease. When a shard leaves the worker, its gauges go to 0 and its series stop
//! being refreshed, so an exporter's idle timeout (metrics-exporter-prometheus:
//! `idle_timeout(MetricKindMask::COUNTER | MetricKindMask::GAUGE, …)`, a few taker cycles)
//! removes exactly them, rather than leaving a `kcl_behind_latest_seconds` for a shard
//! processed elsewhere. `Status::held` says which shards are this worker's at any moment.

/// Records delivered to processors (counter, `shard`).
pub const RECORDS: &str = "kcl_records_processed_total";
/// Payload bytes delivered to processors (counter, `shard`).
pub const BYTES: &str = "kcl_bytes_processed_total";
/// Time spent in `process_records` per batch, seconds (histogram).
pub const BATCH_DURATION: &str = "kcl_batch_duration_seconds";
/// Delay from the oldest record's arrival in Kinesis to its delivery, seconds (histogram).
pub const DELIVERY_DELAY: &str = "kcl_delivery_delay_seconds";
/// How far behind the newest record a shard's last batch was, seconds (gauge, `shard`):
/// Kinesis' `MillisBehindLatest`, in the unit Prometheus conventions ask for.
pub const BEHIND_LATEST: &str = "kcl_behind_latest_seconds";
/// Records handed out with `acknowledge_later` and not acknowledged yet (gauge, `shard`; only
/// for shards whose processor acknowledges later, e.g. [`Parallel`](crate::Parallel)).
pub const IN_FLIGHT: &str = "kcl_records_in_flight";
/// Records handed out after the checkpoint watermark: delivered, and waiting for an older
/// record to finish (gauge, `shard`; see [`ack`](crate::ack)).
pub const WATERMARK_LAG_RECORDS: &str = "kcl_watermark_lag_records";
/// Seconds since the oldest unfinished record was delivered, 0 when none is (gauge,
/// `shard`): how long the watermark has been held back.
pub const WATERMARK_LAG: &str = "kcl_watermark_lag_seconds";
/// Tries of a failing record beyond its first, under a failure policy (counter, `shard`; see
/// [`failure`](crate::failure)).
pub const RETRIES: &str = "kcl_record_retries_total";
/// Records written to the dead-letter sink (counter, `shard`).
pub const DEAD_LETTERED: &str = "kcl_records_dead_lettered_total";
/// Records given up on and skipped (counter, `shard`; `Exhausted::Skip`).
pub const SKIPPED: &str = "kcl_records_skipped_total";
/// Records not delivered again because the lease row says they finished before (counter,
/// `shard`; sparse acknowledgements, see [`SparseAcks`](crate::ack::SparseAcks)).
pub const ALREADY_FINISHED: &str = "kcl_records_already_finished_total";
/// Failing batches split in two to find the record that fails (counter, `shard`).
pub const BISECTS: &str = "kcl_batch_bisects_total";
/// Ordering keys parked behind a dead-lettered record (gauge, `shard`;
/// `Parallel::park_keys`).
pub const PARKED_KEYS: &str = "kcl_parked_keys";
/// Dead letters the sink refused (each retried until accepted; counter, `shard`).
pub const SINK_FAILURES: &str = "kcl_dead_letter_sink_failures_total";
/// Outages a failure policy saw begin: `outage_after` records given up in a row, after which
/// the shard blocks (counter, `shard`; `FailurePolicy::outage_after`).
pub const OUTAGES: &str = "kcl_failure_outages_total";
/// Leases held by this worker (gauge).
pub const LEASES_HELD: &str = "kcl_leases_held";
/// Leases taken (counter, `from`: `unowned`, `expired`, `handoff` or `restart`: resumed
/// after this worker's own restart, see `WorkerConfig::restart_grace`).
pub const LEASES_TAKEN: &str = "kcl_leases_taken_total";
/// Available leases the leader wrote to other workers (counter; `Coordination::Leader`).
pub const LEASES_ASSIGNED: &str = "kcl_leases_assigned_total";
/// Handoffs requested from more loaded workers (counter).
pub const LEASES_STOLEN: &str = "kcl_lease_handoffs_requested_total";
/// Leases lost: taken by others or expired locally (counter).
pub const LEASES_LOST: &str = "kcl_leases_lost_total";
/// Leases handed back or over gracefully: at shutdown (or kept for this worker's restart,
/// under `restart_grace`), to another worker, on a drain (counter).
pub const LEASES_RELEASED: &str = "kcl_leases_released_total";
/// Successful checkpoint writes (counter).
pub const CHECKPOINTS: &str = "kcl_checkpoints_total";
/// Transactional checkpoints ([`Checkpointer::commit_outputs`](crate::Checkpointer::commit_outputs),
/// [`Parallel::with_outputs`](crate::Parallel::with_outputs)) by outcome (counter, `outcome`:
/// `committed`, `refused` by an output's own condition, `invalid`: refused by the store as
/// invalid, `lease_lost`, `behind`: the row's
/// checkpoint had moved, nothing applied; `failed`: the store's error, after the retries;
/// and `retried`, once per attempt retried after a retryable error or a conflict, so that
/// the other outcomes count each commit once).
pub const OUTPUT_COMMITS: &str = "kcl_output_commits_total";
/// Time from a transactional checkpoint's call to its outcome, retries and the read of the
/// row after a lost answer included, whatever the outcome (histogram, seconds).
pub const OUTPUT_COMMIT_DURATION: &str = "kcl_output_commit_duration_seconds";
/// Processor failures (error or panic) that restarted a shard (counter).
pub const PROCESSOR_FAILURES: &str = "kcl_processor_failures_total";
/// Reads of a shard that failed and restarted its processor from the last checkpoint
/// (counter): the stream's fault, not the processor's.
pub const READ_FAILURES: &str = "kcl_read_failures_total";
/// Lease-table rows the last whole-table read could not parse (gauge; see
/// [`ProblemKind`](crate::ProblemKind)).
pub const LEASE_ROWS_UNREADABLE: &str = "kcl_lease_rows_unreadable";
/// Shards the stream lists that should have a lease and have none kcl can read (gauge, set
/// by the worker that syncs shards).
pub const SHARDS_UNLEASED: &str = "kcl_shards_unleased";
/// Leases ready to be processed that no worker has room for (gauge, set by the leader; under
/// `EveryWorker` by each worker at its `max_leases`).
pub const SHARDS_UNOWNED: &str = "kcl_shards_unowned";
/// Held shards whose reads fail in a way retrying cannot fix (gauge).
pub const SHARD_READ_FAILING: &str = "kcl_shard_read_failing";
/// Held shards whose checkpoint has not moved for
/// [`stalled_after`](crate::WorkerConfig::stalled_after) while records past it wait (gauge).
pub const SHARDS_STALLED: &str = "kcl_shards_stalled";
/// Held shards whose attempts keep failing without progress (gauge; see
/// [`ProblemKind::Failing`](crate::ProblemKind::Failing)).
pub const SHARDS_FAILING: &str = "kcl_shards_failing";
/// Seconds since the shard's checkpoint last moved while records past it wait (delivered,
/// and not covered by it), or since they began waiting if that is later; 0 when the
/// checkpoint covers everything delivered (gauge, `shard`; set by the coordinator, so it
/// grows while a processor hangs). A processor that checkpoints as it goes keeps it near
/// its checkpoint interval, even if its checkpoint never covers the last record delivered.
pub const CHECKPOINT_AGE: &str = "kcl_checkpoint_age_seconds";
/// Throttled backend calls (counter, `operation`).
pub const THROTTLED: &str = "kcl_throttled_total";

/// Aggregated records dropped because a user record in them lies outside the shard's
/// hash-key range (counter; see [`crate::aggregation`]).
pub const AGGREGATES_DROPPED: &str = "kcl_aggregates_dropped_total";

/// Lease-table requests that reached the table (counter, `operation`: see
/// [`Operation`](crate::lease::usage::Operation)).
pub const STORE_REQUESTS: &str = "kcl_lease_store_requests_total";
/// Read capacity units the lease table consumed (counter, `operation`): computed by the
/// in-memory store, as reported by DynamoDB for the DynamoDB store.
pub const STORE_READ_UNITS: &str = "kcl_lease_store_read_units_total";
/// Write capacity units the lease table consumed (counter, `operation`).
pub const STORE_WRITE_UNITS: &str = "kcl_lease_store_write_units_total";

/// What a held lease costs its holder, as last written to its row: the largest of busy time
/// per second, bytes against 1 MiB/s and records against 1,000/s (gauge, `shard`; see
/// [`lease::load`](crate::lease::load)).
pub const LEASE_LOAD: &str = "kcl_lease_load";
/// Leases the leader asked to move to balance load (counter; moves of small leases by count
/// and count balancing are in `kcl_lease_handoffs_requested_total`).
pub const LOAD_MOVES: &str = "kcl_load_moves_total";

/// Records behind the tip of a held shard: its arrival rate × how far behind it is (gauge,
/// `shard`; see [`autoscale`](crate::autoscale)).
pub const SHARD_BACKLOG: &str = "kcl_shard_backlog_records";
/// Workers the fleet should run, damped (gauge; the leader's, see
/// [`FleetSignals::desired_workers`](crate::FleetSignals::desired_workers)).
pub const FLEET_DESIRED_WORKERS: &str = "kcl_fleet_desired_workers";
/// Workers the formula asks for, before damping (gauge; the leader's).
pub const FLEET_RECOMMENDED_WORKERS: &str = "kcl_fleet_recommended_workers";
/// Workers the leader sees active (gauge; the leader's).
pub const FLEET_WORKERS: &str = "kcl_fleet_workers";
/// Records behind the tip, fleet wide (gauge; the leader's).
pub const FLEET_BACKLOG: &str = "kcl_fleet_backlog_records";
/// How far behind the tip the most behind shard is (gauge; the leader's).
pub const FLEET_BEHIND: &str = "kcl_fleet_behind_seconds";
/// Records arriving per second, fleet wide (gauge; the leader's).
pub const FLEET_ARRIVAL_RATE: &str = "kcl_fleet_arrival_records_per_second";
/// Records read per second, fleet wide: the drain rate (gauge; the leader's).
pub const FLEET_DRAIN_RATE: &str = "kcl_fleet_drain_records_per_second";
/// The load the fleet needs to keep up and catch up within `catch_up` (gauge; the leader's).
pub const FLEET_NEEDED_LOAD: &str = "kcl_fleet_needed_load";

/// Every metric name above with its unit and help text: what [`describe`] registers, and
/// what the README's list shows.
pub const ALL: [(&str, Kind, Option<Unit>, &str); 50] = [
    (
        LEASE_LOAD,
        Kind::Gauge,
        None,
        "What a held lease costs its holder: the largest of busy time per second, bytes against 1 MiB/s and records against 1,000/s",
    ),
    (
        LOAD_MOVES,
        Kind::Counter,
        Some(Unit::Count),
        "Leases the leader asked to move to balance load",
    ),
    (
        RETRIES,
        Kind::Counter,
        Some(Unit::Count),
        "Tries of a failing record beyond its first, under a failure policy",
    ),
    (
        DEAD_LETTERED,
        Kind::Counter,
        Some(Unit::Count),
        "Records written to the dead-letter sink",
    ),
    (
        SKIPPED,
        Kind::Counter,
        Some(Unit::Count),
        "Records given up on and skipped",
    ),
    (
        ALREADY_FINISHED,
        Kind::Counter,
        Some(Unit::Count),
        "Records not delivered again after a failover or restart: the lease row says they finished before",
    ),
    (
        BISECTS,
        Kind::Counter,
        Some(Unit::Count),
        "Failing batches split in two to find the record that fails",
    ),
    (
        PARKED_KEYS,
        Kind::Gauge,
        Some(Unit::Count),
        "Ordering keys parked behind a dead-lettered record",
    ),
    (
        SINK_FAILURES,
        Kind::Counter,
        Some(Unit::Count),
        "Dead letters the sink refused (retried until accepted)",
    ),
    (
        OUTAGES,
        Kind::Counter,
        Some(Unit::Count),
        "Outages seen by a failure policy (records given up in a row; the shard then blocks)",
    ),
    (
        RECORDS,
        Kind::Counter,
        Some(Unit::Count),
        "Records delivered to processors",
    ),
    (
        BYTES,
        Kind::Counter,
        Some(Unit::Bytes),
        "Payload bytes delivered to processors",
    ),
    (
        BATCH_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time spent in process_records per batch",
    ),
    (
        DELIVERY_DELAY,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Delay from a batch's oldest record arriving in the stream to its delivery",
    ),
    (
        BEHIND_LATEST,
        Kind::Gauge,
        Some(Unit::Seconds),
        "How far behind the newest record of its shard the last batch was",
    ),
    (
        LEASES_HELD,
        Kind::Gauge,
        Some(Unit::Count),
        "Leases held by this worker",
    ),
    (
        LEASES_TAKEN,
        Kind::Counter,
        Some(Unit::Count),
        "Leases taken, by whom they came from (from: unowned, expired, handoff, restart)",
    ),
    (
        LEASES_ASSIGNED,
        Kind::Counter,
        Some(Unit::Count),
        "Available leases the leader assigned to other workers",
    ),
    (
        LEASES_STOLEN,
        Kind::Counter,
        Some(Unit::Count),
        "Handoffs requested from more loaded workers",
    ),
    (
        LEASES_LOST,
        Kind::Counter,
        Some(Unit::Count),
        "Leases lost: taken by others or expired locally",
    ),
    (
        LEASES_RELEASED,
        Kind::Counter,
        Some(Unit::Count),
        "Leases handed back or over gracefully (shutdown, handoff, drain; kept for a restart)",
    ),
    (
        CHECKPOINTS,
        Kind::Counter,
        Some(Unit::Count),
        "Successful checkpoint writes",
    ),
    (
        OUTPUT_COMMITS,
        Kind::Counter,
        Some(Unit::Count),
        "Transactional checkpoints by outcome (committed, refused, invalid, lease_lost, behind, failed; retried: attempts retried)",
    ),
    (
        OUTPUT_COMMIT_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time from a transactional checkpoint's call to its outcome, retries included",
    ),
    (
        PROCESSOR_FAILURES,
        Kind::Counter,
        Some(Unit::Count),
        "Processor failures (error or panic) that restarted a shard",
    ),
    (
        READ_FAILURES,
        Kind::Counter,
        Some(Unit::Count),
        "Shard reads that failed and restarted the shard from its last checkpoint",
    ),
    (
        LEASE_ROWS_UNREADABLE,
        Kind::Gauge,
        Some(Unit::Count),
        "Lease-table rows the last whole-table read could not parse",
    ),
    (
        SHARDS_UNLEASED,
        Kind::Gauge,
        Some(Unit::Count),
        "Shards the stream lists without a lease kcl can read",
    ),
    (
        SHARDS_UNOWNED,
        Kind::Gauge,
        Some(Unit::Count),
        "Leases ready to be processed that no worker has room for",
    ),
    (
        SHARD_READ_FAILING,
        Kind::Gauge,
        Some(Unit::Count),
        "Held shards whose reads fail in a way retrying cannot fix",
    ),
    (
        SHARDS_STALLED,
        Kind::Gauge,
        Some(Unit::Count),
        "Held shards whose checkpoint has not moved for stalled_after while records wait",
    ),
    (
        SHARDS_FAILING,
        Kind::Gauge,
        Some(Unit::Count),
        "Held shards whose attempts keep failing without progress",
    ),
    (
        CHECKPOINT_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        "Since the checkpoint last moved while records past it wait (0 when none wait)",
    ),
    (
        IN_FLIGHT,
        Kind::Gauge,
        Some(Unit::Count),
        "Records handed out to be acknowledged later and not acknowledged yet",
    ),
    (
        SHARD_BACKLOG,
        Kind::Gauge,
        Some(Unit::Count),
        "Records behind the tip of a held shard: its arrival rate times how far behind it is",
    ),
    (
        FLEET_DESIRED_WORKERS,
        Kind::Gauge,
        Some(Unit::Count),
        "Workers the fleet should run, damped (the leader's figure; what an autoscaler follows)",
    ),
    (
        FLEET_RECOMMENDED_WORKERS,
        Kind::Gauge,
        Some(Unit::Count),
        "Workers the formula asks for now, before damping (the leader's figure)",
    ),
    (
        FLEET_WORKERS,
        Kind::Gauge,
        Some(Unit::Count),
        "Workers the leader sees active",
    ),
    (
        FLEET_BACKLOG,
        Kind::Gauge,
        Some(Unit::Count),
        "Records behind the tip, fleet wide (the leader's figure)",
    ),
    (
        FLEET_BEHIND,
        Kind::Gauge,
        Some(Unit::Seconds),
        "How far behind the tip the most behind shard is (the leader's figure)",
    ),
    (
        FLEET_ARRIVAL_RATE,
        Kind::Gauge,
        None,
        "Records arriving per second, fleet wide (the leader's figure)",
    ),
    (
        FLEET_DRAIN_RATE,
        Kind::Gauge,
        None,
        "Records read per second, fleet wide: the drain rate (the leader's figure)",
    ),
    (
        FLEET_NEEDED_LOAD,
        Kind::Gauge,
        None,
        "Load the fleet needs to keep up and read its backlog within catch_up (1: one worker busy all the time)",
    ),
    (
        WATERMARK_LAG_RECORDS,
        Kind::Gauge,
        Some(Unit::Count),
        "Records delivered after the checkpoint watermark (an older record is unfinished)",
    ),
    (
        WATERMARK_LAG,
        Kind::Gauge,
        Some(Unit::Seconds),
        "Since the oldest unfinished record was delivered (0 when none is)",
    ),
    (
        AGGREGATES_DROPPED,
        Kind::Counter,
        Some(Unit::Count),
        "KPL aggregates dropped: a user record outside the shard's hash-key range",
    ),
    (
        THROTTLED,
        Kind::Counter,
        Some(Unit::Count),
        "Throttled backend calls (operation: get_records, shard_iterator)",
    ),
    (
        STORE_REQUESTS,
        Kind::Counter,
        Some(Unit::Count),
        "Lease-table requests, by operation",
    ),
    (
        STORE_READ_UNITS,
        Kind::Counter,
        None,
        "Read capacity units the lease table consumed, by operation",
    ),
    (
        STORE_WRITE_UNITS,
        Kind::Counter,
        None,
        "Write capacity units the lease table consumed, by operation",
    ),
];

/// The type of a metric in [`ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution.
    Histogram,
}

pub use ::metrics::Unit;

/// Describes every kcl metric (help text and unit) to the installed recorder. A worker does
/// this when it starts; call it yourself only if you install a recorder after that.
pub fn describe() {
    for (name, kind, unit, help) in ALL {
        match (kind, unit) {
            (Kind::Counter, Some(unit)) => ::metrics::describe_counter!(name, unit, help),
            (Kind::Counter, None) => ::metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => ::metrics::describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => ::metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(unit)) => ::metrics::describe_histogram!(name, unit, help),
            (Kind::Histogram, None) => ::metrics::describe_histogram!(name, help),
        }
    }
}

/// Label values of [`LEASES_TAKEN`].
pub(crate) const TAKEN_FROM: [&str; 4] = ["unowned", "expired", "handoff", "restart"];
/// Label values of [`OUTPUT_COMMITS`].
pub(crate) const COMMIT_OUTCOMES: [&str; 7] = [
    "committed",
    "retried",
    "refused",
    "invalid",
    "lease_lost",
    "behind",
    "failed",
];
/// Label values of [`THROTTLED`].
pub(crate) const THROTTLED_OPERATIONS: [&str; 2] = ["get_records", "shard_iterator"];

/// Registers every worker-level counter (at zero on the first call) and keeps it fresh; see
/// the module docs. Called every taker interval, with `lease::usage::refresh_series`.
pub(crate) fn refresh_worker_series() {
    for name in [
        LEASES_STOLEN,
        LEASES_ASSIGNED,
        LEASES_LOST,
        LEASES_RELEASED,
        CHECKPOINTS,
        PROCESSOR_FAILURES,
        READ_FAILURES,
        AGGREGATES_DROPPED,
        LOAD_MOVES,
    ] {
        ::metrics::counter!(name).increment(0);
    }
    for from in TAKEN_FROM {
        ::metrics::counter!(LEASES_TAKEN, "from" => from).increment(0);
    }
    for operation in THROTTLED_OPERATIONS {
        ::metrics::counter!(THROTTLED, "operation" => operation).increment(0);
    }
    for outcome in COMMIT_OUTCOMES {
        ::metrics::counter!(OUTPUT_COMMITS, "outcome" => outcome).increment(0);
    }
    // The lease table's request counters: `lease::usage::refresh_series`.
}

/// Zeroes the gauges of a shard this worker no longer holds. They also stop being refreshed,
/// and an exporter's idle timeout drops them (see the module docs); until it does, or where
/// a scraper saw them only once since, they read 0 rather than the last value, so that a sum
/// over workers does not count a shard twice and an alert on the largest value over shards
/// does not stay on a shard that moved.
pub(crate) fn shard_gone(shard: &crate::ShardId) {
    let shard = shard.to_string();
    for name in [
        BEHIND_LATEST,
        IN_FLIGHT,
        WATERMARK_LAG_RECORDS,
        WATERMARK_LAG,
        PARKED_KEYS,
        CHECKPOINT_AGE,
        LEASE_LOAD,
        SHARD_BACKLOG,
    ] {
        ::metrics::gauge!(name, "shard" => shard.clone()).set(0.0);
    }
}

mod shard;
pub(crate) use shard::ShardMetrics;
