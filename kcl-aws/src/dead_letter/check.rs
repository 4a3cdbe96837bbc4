//! What the sinks' start-up checks ([`DeadLetterSink::check`](kcl_core::failure::DeadLetterSink::check))
//! share: an error that says what to fix, and retention periods in words.

use kcl_core::{BackendError, ErrorKind};

/// `error`, met while checking `what`, as an error that says what to fix: `missing` when it
/// does not exist, else that `permission` may be what is missing.
pub(crate) fn refused(
    error: &BackendError,
    what: &str,
    missing: &str,
    permission: &str,
) -> BackendError {
    let operation = error.operation();
    let message = match error.kind() {
        ErrorKind::NotFound => {
            format!("{what} does not exist: {missing} (the dead-letter sink cannot store letters)")
        }
        _ => format!(
            "the dead-letter sink cannot check {what}: {error}; if access is denied, allow \
             {permission} on it"
        ),
    };
    BackendError::new(error.kind(), operation, message)
}

/// `seconds` in days and hours, as a retention is said: `4 days`, `1 day 12 hours`, `1 hour`.
pub(crate) fn days(seconds: u64) -> String {
    let (days, hours) = (seconds / 86_400, seconds % 86_400 / 3_600);
    let unit = |n: u64, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    match (days, hours) {
        (0, 0) => unit(seconds / 60, "minute"),
        (0, h) => unit(h, "hour"),
        (d, 0) => unit(d, "day"),
        (d, h) => format!("{} {}", unit(d, "day"), unit(h, "hour")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retentions_in_words() {
        assert_eq!(days(345_600), "4 days");
        assert_eq!(days(86_400), "1 day");
        assert_eq!(days(24 * 3600), "1 day");
        assert_eq!(days(3600 * 36), "1 day 12 hours");
        assert_eq!(days(3600), "1 hour");
        assert_eq!(days(60), "1 minute");
    }

    #[test]
    fn a_missing_resource_says_what_to_fix() {
        let missing = BackendError::new(ErrorKind::NotFound, "get_queue_attributes", "gone");
        let e = refused(
            &missing,
            "the SQS queue q",
            "create it",
            "sqs:GetQueueAttributes",
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(
            e.to_string()
                .contains("the SQS queue q does not exist: create it"),
            "{e}"
        );
        let denied = BackendError::new(ErrorKind::Fatal, "get_queue_attributes", "AccessDenied");
        let e = refused(
            &denied,
            "the SQS queue q",
            "create it",
            "sqs:GetQueueAttributes",
        );
        assert!(
            e.to_string().contains("allow sqs:GetQueueAttributes"),
            "{e}"
        );
    }
}
