//! SDK errors → [`ErrorKind`], in one place for both services.
//!
//! The worker's retry decisions depend only on the [`ErrorKind`] of a [`BackendError`], so the
//! whole mapping lives here. Operation error enums differ per operation and are
//! `#[non_exhaustive]`, so instead of one match per enum we read the error code every AWS
//! error carries ([`ProvideErrorMetadata`]), reduce it to a small internal [`Cause`], and map
//! that with one exhaustive `match`: adding a cause forces a decision about its kind.
//!
//! Unknown codes fall back on the HTTP status: 5xx is transient, anything else fatal. That
//! fallback matters with emulators, which answer some client errors with a 500.

use std::fmt::Display;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_types::event_stream::RawMessage;
use kcl_core::{BackendError, ErrorKind};

/// What an SDK error means, independent of the service and operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// A DynamoDB condition expression evaluated to false.
    ConditionFailed,
    /// Throughput or request-rate limits (DynamoDB, Kinesis, KMS).
    Throttled,
    /// A Kinesis shard iterator older than five minutes.
    ExpiredIterator,
    /// The table or stream does not exist.
    NotFound,
    /// Network, timeout, 5xx, a resource still being created: try again.
    Transient,
    /// Invalid request, access denied, disabled KMS key: retrying will not help.
    Invalid,
}

impl Cause {
    /// Classifies an error code plus HTTP status (the status only for unknown codes).
    pub(crate) fn from_code(code: Option<&str>, status: Option<u16>) -> Self {
        match code {
            Some("ConditionalCheckFailedException") => Self::ConditionFailed,
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "Throttling"
                | "RequestLimitExceeded"
                | "LimitExceededException"
                | "KMSThrottlingException"
                | "TooManyRequestsException"
                // SQS and S3 (dead-letter sinks).
                | "RequestThrottled"
                | "KmsThrottled"
                | "SlowDown",
            ) => Self::Throttled,
            // DynamoDB Streams: the records after the iterator are gone (older than 24 h); the
            // reopen meets it at `GetShardIterator`, where the source reads on from the oldest
            // record kept.
            Some("ExpiredIteratorException" | "TrimmedDataAccessException") => {
                Self::ExpiredIterator
            }
            Some(
                "ResourceNotFoundException"
                | "TableNotFoundException"
                | "QueueDoesNotExist"
                | "AWS.SimpleQueueService.NonExistentQueue"
                | "NoSuchBucket"
                | "NoSuchKey",
            ) => Self::NotFound,
            Some(
                "InternalServerError"
                | "InternalFailure"
                | "InternalFailureException"
                | "ServiceUnavailable"
                | "ServiceUnavailableException"
                | "ResourceInUseException"
                | "TransactionConflictException"
                | "TransactionInProgressException"
                | "ExpiredNextTokenException"
                | "InternalError",
            ) => Self::Transient,
            Some(
                "ValidationException"
                | "InvalidArgumentException"
                | "AccessDeniedException"
                | "UnrecognizedClientException"
                | "MissingAuthenticationToken"
                | "IncompleteSignature"
                | "KMSAccessDeniedException"
                | "KMSDisabledException"
                | "KMSInvalidStateException"
                | "KMSNotFoundException"
                | "KMSOptInRequired"
                | "ItemCollectionSizeLimitExceededException",
            ) => Self::Invalid,
            _ if status.is_some_and(|s| s >= 500) => Self::Transient,
            _ => Self::Invalid,
        }
    }

    /// Classifies any SDK error of either client.
    pub(crate) fn of<E: ProvideErrorMetadata, R: Raw>(err: &SdkError<E, R>) -> Self {
        match err {
            SdkError::ServiceError(ctx) => Self::from_code(ctx.err().code(), ctx.raw().status()),
            // No request was sent: a bug or a missing setting (region, credentials).
            SdkError::ConstructionFailure(_) => Self::Invalid,
            // No region: no call can be signed or routed until the setting is fixed.
            SdkError::DispatchFailure(failure)
                if failure
                    .as_connector_error()
                    .is_some_and(|e| is_missing_region(&kcl_core::error_chain(e))) =>
            {
                Self::Invalid
            }
            // Timeouts, connection failures and unparseable answers: the call may be retried.
            SdkError::TimeoutError(_)
            | SdkError::DispatchFailure(_)
            | SdkError::ResponseError(_) => Self::Transient,
            // `SdkError` is non-exhaustive; a future variant is most likely transport-level.
            _ => Self::Transient,
        }
    }

    /// The core's kind for this cause. The one exhaustive match of the crate.
    pub(crate) fn kind(self) -> ErrorKind {
        match self {
            Self::ConditionFailed => ErrorKind::Conflict,
            Self::Throttled => ErrorKind::Throttled,
            Self::ExpiredIterator => ErrorKind::ExpiredIterator,
            Self::NotFound => ErrorKind::NotFound,
            Self::Invalid => ErrorKind::Fatal,
            Self::Transient => ErrorKind::Retryable,
        }
    }
}

/// What an error came with: an HTTP response, or a message of an event stream.
pub(crate) trait Raw: std::fmt::Debug + Send + Sync + 'static {
    /// The HTTP status that classifies an error with an unknown code.
    fn status(&self) -> Option<u16>;
}

impl Raw for HttpResponse {
    fn status(&self) -> Option<u16> {
        Some(self.status().as_u16())
    }
}

impl Raw for RawMessage {
    /// An error inside an event stream (a `SubscribeToShard` subscription) comes after the
    /// call succeeded: like a 5xx, an unknown one is worth a new subscription.
    fn status(&self) -> Option<u16> {
        Some(500)
    }
}

/// Converts an SDK error into the core's error. `what` names the resource (table or stream)
/// and appears in the message, so that "not found" says what was not found.
///
/// The message carries the cause (the service's code and message, or the transport's chain
/// of errors, each once) and, where the fix is usually a setting, a hint; the SDK error is
/// not also attached as `source()`, so that a printed chain says everything once.
// By value, as `map_err` hands it over; nothing of it is kept.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn backend_error<E, R: Raw>(
    operation: &'static str,
    what: impl Display,
    err: SdkError<E, R>,
) -> BackendError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let cause = Cause::of(&err);
    let detail = match (err.code(), err.message()) {
        (Some(code), Some(msg)) => format!("{code}: {msg}"),
        (Some(code), None) => code.to_owned(),
        _ => kcl_core::error_chain(&err),
    };
    let message = match cause {
        Cause::NotFound => format!("{what} does not exist ({detail})"),
        Cause::ConditionFailed => format!("condition failed on {what}"),
        Cause::Throttled | Cause::ExpiredIterator | Cause::Transient | Cause::Invalid => {
            match hint(err.code(), &detail) {
                Some(hint) => format!("{what}: {detail}; {hint}"),
                None => format!("{what}: {detail}"),
            }
        }
    };
    BackendError::new(cause.kind(), operation, message)
}

/// Whether an SDK error's text says no region is set (`missing signing region`, or the
/// endpoint resolver's `Missing Region`).
fn is_missing_region(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    lower.contains("missing signing region") || lower.contains("missing region")
}

/// What to check when an error is, most likely, a setting.
fn hint(code: Option<&str>, detail: &str) -> Option<&'static str> {
    if is_missing_region(detail) {
        return Some("set AWS_REGION (or a profile's region)");
    }
    let lower = detail.to_ascii_lowercase();
    let credentials = matches!(
        code,
        Some(
            "UnrecognizedClientException"
                | "MissingAuthenticationToken"
                | "InvalidSignatureException"
        )
    ) || lower.contains("credential");
    if credentials {
        return Some(
            "check the AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, \
             or a role (IRSA, ECS task role, instance profile)",
        );
    }
    // "connect" covers "tcp connect error" and "Connection refused".
    let unreachable = ["connect", "dns error", "timed out", "timeout"]
        .iter()
        .any(|needle| lower.contains(needle));
    unreachable.then_some(
        "check the endpoint and region (AWS_REGION; AWS_ENDPOINT_URL_KINESIS and \
         AWS_ENDPOINT_URL_DYNAMODB for an emulator) and the network",
    )
}

/// A row or response the crate cannot interpret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    /// A required attribute or field is absent.
    #[error("missing attribute `{0}`")]
    Missing(&'static str),
    /// An attribute has another DynamoDB type than expected.
    #[error("attribute `{name}` is not of type {expected}")]
    WrongType {
        /// The attribute.
        name: &'static str,
        /// The expected DynamoDB type (`S`, `N`, `SS`).
        expected: &'static str,
    },
    /// An attribute has the right type but a value we cannot use.
    #[error("attribute `{name}` has an invalid value `{value}`")]
    Invalid {
        /// The attribute.
        name: &'static str,
        /// The value as stored.
        value: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        let kind = |code: &str, status: u16| Cause::from_code(Some(code), Some(status)).kind();
        assert_eq!(
            kind("ConditionalCheckFailedException", 400),
            ErrorKind::Conflict
        );
        for throttle in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
            "LimitExceededException",
            "KMSThrottlingException",
        ] {
            assert_eq!(kind(throttle, 400), ErrorKind::Throttled, "{throttle}");
        }
        assert_eq!(
            kind("ExpiredIteratorException", 400),
            ErrorKind::ExpiredIterator
        );
        // Emulators answer some client errors with 500: the code wins over the status.
        assert_eq!(
            kind("ExpiredIteratorException", 500),
            ErrorKind::ExpiredIterator
        );
        assert_eq!(kind("InvalidArgumentException", 500), ErrorKind::Fatal);
        assert_eq!(kind("ResourceNotFoundException", 400), ErrorKind::NotFound);
        for missing in ["QueueDoesNotExist", "NoSuchBucket", "NoSuchKey"] {
            assert_eq!(kind(missing, 400), ErrorKind::NotFound, "{missing}");
        }
        assert_eq!(kind("SlowDown", 503), ErrorKind::Throttled);
        assert_eq!(kind("RequestThrottled", 400), ErrorKind::Throttled);
        assert_eq!(kind("InternalServerError", 500), ErrorKind::Retryable);
        assert_eq!(kind("SomethingNew", 503), ErrorKind::Retryable);
        assert_eq!(kind("SomethingNew", 400), ErrorKind::Fatal);
        assert_eq!(
            Cause::from_code(None, Some(502)).kind(),
            ErrorKind::Retryable
        );
        assert_eq!(Cause::from_code(None, None).kind(), ErrorKind::Fatal);
    }

    #[test]
    fn a_missing_region_says_to_set_one() {
        for detail in [
            "dispatch failure: other: missing signing region",
            "dispatch failure: other: Invalid Configuration: Missing Region",
        ] {
            assert_eq!(
                hint(None, detail),
                Some("set AWS_REGION (or a profile's region)")
            );
            assert!(is_missing_region(detail));
        }
        assert!(!is_missing_region(
            "dispatch failure: io error: connection refused"
        ));
    }

    #[test]
    fn hints_name_the_setting_to_check() {
        let creds = hint(
            None,
            "dispatch failure: other: no credentials in the property bag",
        );
        assert!(creds.is_some_and(|h| h.contains("AWS_ACCESS_KEY_ID")));
        let refused = hint(
            None,
            "dispatch failure: io error: tcp connect error: Connection refused",
        );
        assert!(refused.is_some_and(|h| h.contains("AWS_ENDPOINT_URL_KINESIS")));
        assert_eq!(
            hint(Some("ValidationException"), "ValidationException: bad key"),
            None
        );
    }
}
