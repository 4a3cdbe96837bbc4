//! The failure policy and where dead letters go (kcl's own keys): what a batch the child fails
//! on costs; see `kcl_core::failure`.

use std::time::Duration;

use kcl_aws::dead_letter::Location;
use kcl_core::failure::{Exhausted, FailurePolicy};

use super::reader::Reader;
use super::{KeyError, key_error};

/// Where dead letters go (`deadLetterSink`, `deadLetterOverflowS3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterSettings {
    /// The sink: `sqs:QUEUE-URL`, `s3://BUCKET/PREFIX`, `kinesis:STREAM` or `file:PATH`.
    pub sink: Location,
    /// For an SQS or Kinesis sink, where letters too large for a message or a record go: a
    /// bucket and a key prefix (`deadLetterOverflowS3`).
    pub overflow: Option<(String, String)>,
}

/// Keys given that have no effect with the rest of the file, each with why.
pub(super) type Unused = Vec<(&'static str, &'static str)>;

/// The failure policy (errors kept in `r`): what a batch the child fails on (it answers an
/// error or exits) costs.
pub(super) fn failure(r: &Reader<'_>, policy: &mut FailurePolicy) {
    if let Some(exhausted) = r.optional(r.parsed("failureExhausted")) {
        policy.exhausted = exhausted;
    }
    if let Some(n) = r.optional(r.number("failureAttempts")) {
        policy.attempts = n;
    }
    if let Some(backoff) = r.optional(r.millis("failureBackoffMillis")) {
        policy.backoff = backoff;
    }
    if let Some(max) = r.optional(r.millis("failureMaxBackoffMillis")) {
        policy.max_backoff = max.max(policy.backoff);
    }
    if let Some(seconds) = r.optional(r.number::<u64>("failureMaxRecordAgeSeconds")) {
        policy.max_record_age = Some(Duration::from_secs(seconds));
    }
    if let Some(run) = r.optional(r.number::<u32>("failureOutageAfter")) {
        // 0: never taken for an outage.
        policy.outage_after = (run > 0).then_some(run);
    }
}

/// Where dead letters go, if anywhere, and the dead-letter keys given to no effect (errors
/// kept in `r`). `exhausted` is the policy's, if it was read: `dead-letter` without a sink is
/// an error naming `failureExhausted`, as kcl's worker refuses it (`failure.exhausted`).
pub(super) fn dead_letters(
    r: &Reader<'_>,
    exhausted: Option<Exhausted>,
) -> (Option<DeadLetterSettings>, Unused) {
    let sink = r.optional(r.parsed::<Location>("deadLetterSink"));
    let overflow = r.optional(overflow(r));
    let mut unused = Unused::new();
    if r.get("deadLetterSink").is_none() {
        if exhausted == Some(Exhausted::DeadLetter) {
            r.keep(Err::<(), _>(key_error(
                "failureExhausted",
                "dead-letter needs deadLetterSink, where the letters go (sqs:QUEUE-URL, \
                 s3://BUCKET/PREFIX, kinesis:STREAM or file:PATH)",
            )));
        }
        if overflow.is_some() {
            unused.push(("deadLetterOverflowS3", "no deadLetterSink is given"));
        }
    }
    if sink.is_some() && exhausted.is_some_and(|e| e != Exhausted::DeadLetter) {
        unused.push((
            "deadLetterSink",
            "failureExhausted is not dead-letter: nothing is dead-lettered",
        ));
    }
    if overflow.is_some() && matches!(sink, Some(Location::File(_) | Location::S3 { .. })) {
        unused.push((
            "deadLetterOverflowS3",
            "only an sqs: or kinesis: deadLetterSink overflows into S3 (a file or S3 takes any size)",
        ));
    }
    let settings = sink.map(|sink| DeadLetterSettings { sink, overflow });
    (settings, unused)
}

/// `deadLetterOverflowS3`: `s3://BUCKET/PREFIX`.
fn overflow(r: &Reader<'_>) -> Result<Option<(String, String)>, KeyError> {
    let key = "deadLetterOverflowS3";
    let Some(given) = r.get(key) else {
        return Ok(None);
    };
    match given.parse::<Location>() {
        Ok(Location::S3 { bucket, prefix }) => Ok(Some((bucket, prefix))),
        _ => Err(key_error(
            key,
            format!("`{given}` is not an S3 location (s3://BUCKET/PREFIX)"),
        )),
    }
}
