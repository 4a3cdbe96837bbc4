//! The worker's configuration from the settings: kcl-core's [`WorkerConfig`], validated by
//! it, its errors named by our keys.

use kcl_core::failure::FailurePolicy;
use kcl_core::{Balancing, InitialPosition, InitialPositionKind as Position, WorkerConfig};

use super::RunArgs;
use super::{SettingsError, Values};

/// Where a shard without a checkpoint starts.
fn initial_position(a: &RunArgs, v: &Values<'_>) -> Result<InitialPosition, SettingsError> {
    match (a.initial_position, a.initial_timestamp) {
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

/// The failure policy of `--on-failure` and `--failure-attempts`, kcl-core's defaults
/// otherwise.
fn failure(a: &RunArgs) -> FailurePolicy {
    let mut policy = FailurePolicy::default();
    policy.exhausted = a.on_failure;
    policy.attempts = a.failure_attempts;
    policy.outage_after = (a.failure_outage_after > 0).then_some(a.failure_outage_after);
    policy
}

/// The worker's configuration, validated; a fan-out consumer is named after the application,
/// as KCL Java names it.
pub(super) fn worker_config(
    a: &RunArgs,
    v: &Values<'_>,
    application_name: &str,
) -> Result<WorkerConfig, SettingsError> {
    let worker = WorkerConfig::default()
        .failover_time(a.failover_time.0)
        .initial_position(initial_position(a, v)?)
        .max_leases(a.max_leases)
        .max_leases_to_steal(a.max_leases_to_steal)
        .max_concurrent_reads(a.max_concurrent_reads)
        .coordination(a.coordination)
        .liveness(a.liveness)
        .retrieval(a.retrieval.with_consumer(application_name))
        .shutdown_timeout(a.shutdown_timeout.0)
        .restart_grace(a.restart_grace.0)
        .max_records(a.max_records)
        .idle_time_between_reads(a.idle_time_between_reads.0)
        .shard_sync_interval(a.shard_sync_interval.0)
        .stalled_after(a.stalled_after.0)
        .failure(failure(a))
        .balancing(Balancing::default().by(a.balance_by).capacity(a.capacity))
        .autoscaling(super::autoscale::autoscaling(a));
    worker.validate().map_err(|e| {
        // kcl-core names its field; ours is the same name (renew_interval follows
        // failover_time, the consumer name the application name).
        let key = match e.key {
            "renew_interval" => "failover_time",
            "retrieval.consumer_name" => "application_name",
            "failure.attempts" => "failure_attempts",
            "failure.outage_after" => "failure_outage_after",
            "balancing.capacity" => "capacity",
            key => key.strip_prefix("autoscaling.").unwrap_or(key),
        };
        v.fail(key, e.reason)
    })?;
    Ok(worker)
}
