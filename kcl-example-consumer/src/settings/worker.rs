//! The worker's configuration from the settings: kcl-core's [`WorkerConfig`], validated by
//! it, its errors named by our keys.

use kcl_core::{Coordination, InitialPosition, Liveness, RetrievalMode, WorkerConfig};

use super::parse::{
    Position, from_str, parse_count, parse_max_leases, parse_position, parse_stalled_after,
    parse_timestamp, parse_u32,
};
use super::{SettingsError, Values};
use crate::cli::parse_duration;

/// Where a shard without a checkpoint starts.
fn initial_position(v: &Values) -> Result<InitialPosition, SettingsError> {
    let timestamp = v.parsed("initial_timestamp", parse_timestamp)?;
    let position = v
        .parsed("initial_position", parse_position)?
        .unwrap_or_default();
    match (position, timestamp) {
        (Position::AtTimestamp, Some(t)) => Ok(InitialPosition::AtTimestamp(t)),
        (Position::AtTimestamp, None) => Err(v.fail(
            "initial_timestamp",
            "required when initial-position is AT_TIMESTAMP".into(),
        )),
        (_, Some(_)) => Err(v.fail(
            "initial_timestamp",
            "only used with initial-position AT_TIMESTAMP".into(),
        )),
        (Position::TrimHorizon, None) => Ok(InitialPosition::TrimHorizon),
        (Position::Latest, None) => Ok(InitialPosition::Latest),
    }
}

/// The worker's configuration, validated; a fan-out consumer is named after the application,
/// as KCL Java names it.
pub(super) fn worker_config(
    v: &Values,
    application_name: &str,
) -> Result<WorkerConfig, SettingsError> {
    let defaults = WorkerConfig::default();
    let failover_time = v
        .parsed("failover_time", parse_duration)?
        .unwrap_or(defaults.failover_time);
    let mut worker = defaults
        .failover_time(failover_time)
        .initial_position(initial_position(v)?);
    if let Some(n) = v.parsed("max_leases", parse_max_leases)? {
        worker = worker.max_leases(n);
    }
    if let Some(n) = v.parsed("max_leases_to_steal", parse_count)? {
        worker = worker.max_leases_to_steal(n);
    }
    if let Some(n) = v.parsed("max_concurrent_reads", parse_count)? {
        worker = worker.max_concurrent_reads(n);
    }
    if let Some(mode) = v.parsed("coordination", from_str::<Coordination>)? {
        worker = worker.coordination(mode);
    }
    if let Some(mode) = v.parsed("liveness", from_str::<Liveness>)? {
        worker = worker.liveness(mode);
    }
    if let Some(mode) = v.parsed("retrieval", from_str::<RetrievalMode>)? {
        worker = worker.retrieval(mode.with_consumer(application_name));
    }
    if let Some(d) = v.parsed("shutdown_timeout", parse_duration)? {
        worker = worker.shutdown_timeout(d);
    }
    if let Some(n) = v.parsed("max_records", parse_u32)? {
        worker = worker.max_records(n);
    }
    if let Some(d) = v.parsed("idle_time_between_reads", parse_duration)? {
        worker = worker.idle_time_between_reads(d);
    }
    if let Some(d) = v.parsed("shard_sync_interval", parse_duration)? {
        worker = worker.shard_sync_interval(d);
    }
    if let Some(limit) = v.parsed("stalled_after", parse_stalled_after)? {
        worker = worker.stalled_after(limit);
    }
    worker.validate().map_err(|e| {
        // kcl-core names its field; ours is the same name (renew_interval follows
        // failover_time, the consumer name the application name).
        let key = match e.key {
            "renew_interval" => "failover_time",
            "retrieval.consumer_name" => "application_name",
            key => key,
        };
        v.fail(key, e.reason)
    })?;
    Ok(worker)
}
