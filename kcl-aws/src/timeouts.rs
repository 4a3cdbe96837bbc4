//! Timeouts for the SDK clients kcl-aws builds, so that no call can hang a worker.
//!
//! The SDK sets a connect timeout (3.1 s) but no operation or attempt timeout: a request
//! whose answer never comes would wait forever. Where the caller's [`SdkConfig`] sets none,
//! the clients built by `new` get the ones below; whatever the caller set (even "disabled")
//! is kept. The worker bounds every call again from the outside
//! ([`WorkerConfig::call_timeout`](kcl_core::WorkerConfig::call_timeout), 15 s), above these,
//! so that the SDK's own, more precise, error comes first.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;

/// Kinesis: one attempt (a `GetRecords` answer is at most 10 MB), and the whole operation
/// with its retries.
pub(crate) const KINESIS: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(10));
/// DynamoDB: single-item writes and 1 MB scan pages.
pub(crate) const DYNAMODB: (Duration, Duration) = (Duration::from_secs(3), Duration::from_secs(10));
/// SQS: one message of at most 1 MiB.
#[cfg(feature = "dead-letters")]
pub(crate) const SQS: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(15));
/// S3: one dead letter (a few MiB at most) a call.
#[cfg(feature = "dead-letters")]
pub(crate) const S3: (Duration, Duration) = (Duration::from_secs(15), Duration::from_secs(30));

/// The caller's timeouts, with `(attempt, operation)` filled in where it set none.
pub(crate) fn with_defaults(
    sdk: &SdkConfig,
    (attempt, operation): (Duration, Duration),
) -> TimeoutConfig {
    let ours = TimeoutConfig::builder()
        .operation_attempt_timeout(attempt)
        .operation_timeout(operation)
        .build();
    let mut merged = sdk
        .timeout_config()
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    merged.take_defaults_from(&ours);
    merged
}

#[cfg(test)]
mod tests {
    use aws_config::BehaviorVersion;

    use super::*;

    #[test]
    fn fills_in_only_what_the_caller_left_unset() {
        let sdk = SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(1))
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build();
        let t = with_defaults(&sdk, KINESIS);
        assert_eq!(t.connect_timeout(), Some(Duration::from_secs(1)));
        assert_eq!(
            t.operation_timeout(),
            Some(Duration::from_secs(60)),
            "the caller's"
        );
        assert_eq!(t.operation_attempt_timeout(), Some(KINESIS.0), "ours");

        let bare = SdkConfig::builder().build();
        let t = with_defaults(&bare, DYNAMODB);
        assert_eq!(t.operation_attempt_timeout(), Some(DYNAMODB.0));
        assert_eq!(t.operation_timeout(), Some(DYNAMODB.1));
    }
}
