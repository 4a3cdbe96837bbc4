//! Metric names, emitted through the [`metrics`] facade.
//!
//! The library records; the application chooses an exporter (the example consumer serves
//! Prometheus text). Per-shard series carry a `shard` label; fleet-level ones carry none.
//!
//! **Series stay fresh while they mean something.** A running worker refreshes every counter
//! and gauge it owns every `taker_interval` (counters at zero from the start, so `rate()` has
//! something to work on), and each shard task refreshes its shard's series as often while it
//! holds the lease. When a shard leaves the worker, its series stop being refreshed, so an
//! exporter's idle timeout (metrics-exporter-prometheus: `idle_timeout(MetricKindMask::COUNTER
//! | MetricKindMask::GAUGE, …)`, a few taker cycles) removes exactly them, rather than leaving
//! a `kcl_millis_behind_latest` for a shard processed elsewhere. `Status::held` says which
//! shards are this worker's at any moment.

/// Records delivered to processors (counter, `shard`).
pub const RECORDS: &str = "kcl_records_processed_total";
/// Payload bytes delivered to processors (counter, `shard`).
pub const BYTES: &str = "kcl_bytes_processed_total";
/// Time spent in `process_records` per batch, seconds (histogram).
pub const BATCH_DURATION: &str = "kcl_batch_duration_seconds";
/// Delay from the oldest record's arrival in Kinesis to its delivery, seconds (histogram).
pub const DELIVERY_DELAY: &str = "kcl_delivery_delay_seconds";
/// How far behind the newest record a shard's last batch was, milliseconds (gauge, `shard`).
pub const MILLIS_BEHIND_LATEST: &str = "kcl_millis_behind_latest";
/// Leases held by this worker (gauge).
pub const LEASES_HELD: &str = "kcl_leases_held";
/// Leases taken (counter, `from`: `unowned`, `expired` or `handoff`).
pub const LEASES_TAKEN: &str = "kcl_leases_taken_total";
/// Available leases the leader wrote to other workers (counter; `Coordination::Leader`).
pub const LEASES_ASSIGNED: &str = "kcl_leases_assigned_total";
/// Handoffs requested from more loaded workers (counter).
pub const LEASES_STOLEN: &str = "kcl_lease_handoffs_requested_total";
/// Leases lost: taken by others or expired locally (counter).
pub const LEASES_LOST: &str = "kcl_leases_lost_total";
/// Successful checkpoint writes (counter).
pub const CHECKPOINTS: &str = "kcl_checkpoints_total";
/// Processor failures (error or panic) that restarted a shard (counter).
pub const PROCESSOR_FAILURES: &str = "kcl_processor_failures_total";
/// Throttled backend calls (counter, `operation`).
pub const THROTTLED: &str = "kcl_throttled_total";

/// Lease-table requests that reached the table (counter, `operation`: see
/// [`Operation`](crate::lease::usage::Operation)).
pub const STORE_REQUESTS: &str = "kcl_lease_store_requests_total";
/// Read capacity units the lease table consumed (counter, `operation`): computed by the
/// in-memory store, as reported by DynamoDB for the DynamoDB store.
pub const STORE_READ_UNITS: &str = "kcl_lease_store_read_units_total";
/// Write capacity units the lease table consumed (counter, `operation`).
pub const STORE_WRITE_UNITS: &str = "kcl_lease_store_write_units_total";

/// Label values of [`LEASES_TAKEN`].
pub(crate) const TAKEN_FROM: [&str; 3] = ["unowned", "expired", "handoff"];
/// Label values of [`THROTTLED`].
pub(crate) const THROTTLED_OPERATIONS: [&str; 2] = ["get_records", "shard_iterator"];

/// Registers every worker-level counter (at zero on the first call) and keeps it fresh; see
/// the module docs. Called every taker interval.
pub(crate) fn refresh_worker_series() {
    for name in [
        LEASES_STOLEN,
        LEASES_ASSIGNED,
        LEASES_LOST,
        CHECKPOINTS,
        PROCESSOR_FAILURES,
    ] {
        ::metrics::counter!(name).increment(0);
    }
    for from in TAKEN_FROM {
        ::metrics::counter!(LEASES_TAKEN, "from" => from).increment(0);
    }
    for operation in THROTTLED_OPERATIONS {
        ::metrics::counter!(THROTTLED, "operation" => operation).increment(0);
    }
    for operation in crate::lease::usage::Operation::ALL {
        let op = operation.as_str();
        ::metrics::counter!(STORE_REQUESTS, "operation" => op).increment(0);
        let units = if operation.is_read() {
            STORE_READ_UNITS
        } else {
            STORE_WRITE_UNITS
        };
        if operation != crate::lease::usage::Operation::EnsureTable {
            ::metrics::counter!(units, "operation" => op).increment(0);
        }
    }
}

/// The per-shard series of one shard while this worker processes it.
#[derive(Debug)]
pub(crate) struct ShardMetrics {
    shard: String,
    behind: Option<f64>,
}

impl ShardMetrics {
    pub(crate) fn new(shard: &crate::ShardId) -> Self {
        let metrics = Self {
            shard: shard.to_string(),
            behind: None,
        };
        metrics.refresh();
        metrics
    }

    /// Registers the shard's counters (at zero the first time) and re-sets its gauge, so that
    /// its series stay fresh while the shard is held; see the module docs.
    pub(crate) fn refresh(&self) {
        ::metrics::counter!(RECORDS, "shard" => self.shard.clone()).increment(0);
        ::metrics::counter!(BYTES, "shard" => self.shard.clone()).increment(0);
        if let Some(behind) = self.behind {
            ::metrics::gauge!(MILLIS_BEHIND_LATEST, "shard" => self.shard.clone()).set(behind);
        }
    }

    /// How far behind the newest record the last batch was.
    pub(crate) fn behind_latest(&mut self, millis: u64) {
        #[allow(clippy::cast_precision_loss)]
        let millis = millis as f64;
        self.behind = Some(millis);
        ::metrics::gauge!(MILLIS_BEHIND_LATEST, "shard" => self.shard.clone()).set(millis);
    }

    /// One batch delivered.
    pub(crate) fn batch(
        &self,
        records: usize,
        bytes: usize,
        took: std::time::Duration,
        delay: std::time::Duration,
    ) {
        ::metrics::counter!(RECORDS, "shard" => self.shard.clone()).increment(records as u64);
        ::metrics::counter!(BYTES, "shard" => self.shard.clone()).increment(bytes as u64);
        ::metrics::histogram!(BATCH_DURATION).record(took.as_secs_f64());
        ::metrics::histogram!(DELIVERY_DELAY).record(delay.as_secs_f64());
    }
}
