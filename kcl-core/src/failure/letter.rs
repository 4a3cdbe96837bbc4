//! Dead letters: a record that ran out of tries, with everything needed to replay it, and the
//! sink that keeps it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use super::{Tally, Tries};
use crate::error::BackendError;
use crate::types::{ExtendedSequenceNumber, Record, ShardId, WorkerId};

/// Why a record was dead-lettered (or skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// It failed on every one of its attempts.
    Attempts,
    /// It was older than the policy's maximum record age when it failed.
    Age,
    /// It failed with a [`Permanent`](super::Permanent) error.
    Permanent,
    /// It did not run: an earlier record of its key was dead-lettered, and the key is parked
    /// (`Parallel::park_keys`) until that record is redriven.
    Parked {
        /// The record that parked the key.
        behind: ExtendedSequenceNumber,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Attempts => f.write_str("out of attempts"),
            Self::Age => f.write_str("older than the maximum record age"),
            Self::Permanent => f.write_str("permanent failure"),
            Self::Parked { behind } => write!(f, "parked behind {behind}"),
        }
    }
}

/// A record that ran out of tries, with everything needed to replay it: the record itself
/// (payload, partition key, explicit hash key, sequence and sub-sequence number: a user record
/// of a KPL aggregate is a dead letter of its own), where it came from, and how it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The application ([`DeadLetters::application`]), if set.
    pub application: Option<String>,
    /// The stream ([`DeadLetters::stream`]), if set.
    pub stream: Option<String>,
    /// The worker that gave up on it.
    pub worker: WorkerId,
    /// The shard it was read from.
    pub shard: ShardId,
    /// The record, whole.
    pub record: Record,
    /// Tries made (0 for a parked record, which never ran).
    pub attempts: u32,
    /// The first failure's error, one line.
    pub first_error: String,
    /// The last failure's error, one line.
    pub last_error: String,
    /// When it first failed.
    pub first_failed: DateTime<Utc>,
    /// When the worker gave up on it.
    pub dead_lettered: DateTime<Utc>,
    /// Why it was given up on.
    pub reason: Reason,
    /// The ordering key it parked or was parked behind (`Parallel::park_keys`), as stored in
    /// the lease row: redriving the record unparks it.
    pub parked_key: Option<String>,
}

impl DeadLetter {
    /// A letter for `record`, read from `shard` by `worker` and given up on for `reason`,
    /// with nothing else known: no application or stream, no attempts, empty errors, failed
    /// and dead-lettered now, no parked key. The fields are public: set the rest after (a
    /// sink's decoder, tests).
    pub fn new(worker: WorkerId, shard: ShardId, record: Record, reason: Reason) -> Self {
        let now = Utc::now();
        Self {
            application: None,
            stream: None,
            worker,
            shard,
            record,
            attempts: 0,
            first_error: String::new(),
            last_error: String::new(),
            first_failed: now,
            dead_lettered: now,
            reason,
            parked_key: None,
        }
    }
}

/// Where dead letters go: a queue, a bucket, a stream, a file. kcl-aws implements it on SQS
/// (with S3 for records too large for a message), S3, Kinesis and a local file.
///
/// A record counts as finished only once `put` returned `Ok`: until then the worker retries
/// (with backoff, for as long as the lease is held) and the shard's checkpoint waits. So `put`
/// must return `Ok` only once the letter is durable, and may be called again with the same
/// letter (after a failover, or a timeout that hid a success): make it idempotent or let
/// readers tolerate a duplicate (the shard and sequence number identify a record).
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Stores `letter` durably.
    fn put(&self, letter: &DeadLetter) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Checks, when the worker starts, that the sink can work at all: the queue, bucket,
    /// stream or directory exists and may be written. `Err` stops the worker from starting
    /// (the error says what to fix); each returned warning is logged at WARN (for instance a
    /// retention shorter than [`RETENTION_FLOOR`], after which a letter counted finished
    /// expires unseen). Default: nothing to check.
    fn check(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
}

/// The shortest retention a sink should keep letters for before [`DeadLetterSink::check`]
/// warns: 7 days, a week of holidays. SQS keeps messages 4 days by default (at most 14), a
/// Kinesis stream 24 hours by default: a letter counted finished can expire before anyone
/// looks.
pub const RETENTION_FLOOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// A sink without its type, as the worker keeps it.
pub(crate) trait AnySink: Send + Sync {
    fn put<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), BackendError>>;
    fn check(&self) -> BoxFuture<'_, Result<Vec<String>, BackendError>>;
}

impl<T: DeadLetterSink> AnySink for T {
    fn put<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(DeadLetterSink::put(self, letter))
    }

    fn check(&self) -> BoxFuture<'_, Result<Vec<String>, BackendError>> {
        Box::pin(DeadLetterSink::check(self))
    }
}

/// A worker's dead-letter sink, and what it says about the records' origin; given to
/// [`WorkerBuilder::dead_letters`](crate::WorkerBuilder::dead_letters).
#[derive(Clone)]
pub struct DeadLetters {
    pub(crate) sink: Arc<dyn AnySink>,
    /// Reads the sink's letters back, for a redrive through the holder.
    pub(crate) reader: Option<super::replay::Reader>,
    application: Option<String>,
    stream: Option<String>,
}

impl fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetters")
            .field("application", &self.application)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl PartialEq for DeadLetters {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.sink, &other.sink)
            && self.application == other.application
            && self.stream == other.stream
    }
}

impl Eq for DeadLetters {}

impl DeadLetters {
    /// Dead letters go to `sink`.
    pub fn new(sink: impl DeadLetterSink) -> Self {
        Self {
            sink: Arc::new(sink),
            reader: None,
            application: None,
            stream: None,
        }
    }

    /// Reads the sink's letters back: a redrive of a parked key (`kcl-admin dead-letters
    /// redrive`) then goes through the shard's holder, which replays the key's letters
    /// before any later record of it ([`LetterReader`](super::LetterReader)). Without one, such a request
    /// is refused by the holder (logged), and the key stays parked.
    #[must_use]
    pub fn reader(mut self, reader: impl super::LetterReader) -> Self {
        self.reader = Some(Arc::new(reader));
        self
    }

    /// The application name each letter carries (e.g. the lease table's name).
    #[must_use]
    pub fn application(mut self, name: impl Into<String>) -> Self {
        self.application = Some(name.into());
        self
    }

    /// The application its letters name, if set.
    pub(crate) fn application_name(&self) -> Option<&str> {
        self.application.as_deref()
    }

    /// The stream each letter carries (its name or ARN), for a redrive into it.
    #[must_use]
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }
}

/// Where one shard's dead letters come from and go: the sink, with the worker and shard.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    /// The sink, if the worker has one.
    pub(crate) letters: Option<DeadLetters>,
    pub(crate) worker: WorkerId,
    pub(crate) shard: ShardId,
    /// The shard's stream when the lease key names it (multi-stream: `account:stream:epoch:
    /// shard`), whatever [`DeadLetters::stream`] says.
    pub(crate) stream: Option<String>,
    /// What the policy did on the shard, for `Status`.
    pub(crate) tally: Arc<Tally>,
    /// The shard's lease row, for a redrive's request (`None` for a batch processor's).
    pub(crate) row: Option<Arc<dyn super::Row>>,
    /// How often the row is looked at for a redrive's request while keys are parked (the
    /// renewal interval).
    pub(crate) poll: Duration,
    /// How long one put may take ([`WorkerConfig::call_timeout`](crate::WorkerConfig)).
    pub(crate) call_timeout: Duration,
}

impl PartialEq for Origin {
    fn eq(&self, other: &Self) -> bool {
        self.letters == other.letters
            && self.worker == other.worker
            && self.shard == other.shard
            && Arc::ptr_eq(&self.tally, &other.tally)
    }
}

impl Eq for Origin {}

impl Origin {
    /// The letter for `record`, given up on for `reason` after `tries`. Its stream is the
    /// shard's ([`Origin::stream`], under multi-stream), else [`DeadLetters::stream`]: a
    /// redrive puts it back where it came from.
    pub(crate) fn letter(&self, record: Record, tries: &Tries, reason: Reason) -> DeadLetter {
        let now = Utc::now();
        let letters = self.letters.as_ref();
        let stream = self.stream.clone();
        DeadLetter {
            application: letters.and_then(|l| l.application.clone()),
            stream: stream.or_else(|| letters.and_then(|l| l.stream.clone())),
            worker: self.worker.clone(),
            shard: self.shard.clone(),
            record,
            attempts: tries.failures(),
            first_error: tries.first_error().to_owned(),
            last_error: tries.last_error().to_owned(),
            first_failed: tries.first_failed().unwrap_or(now),
            dead_lettered: now,
            reason,
            parked_key: None,
        }
    }

    /// Puts `letter` until the sink accepts it, waiting `first`, doubling up to `max`, between
    /// tries, each failure counted and logged. The caller bounds it (the lease's validity).
    pub(crate) async fn put(
        &self,
        letters: &DeadLetters,
        letter: &DeadLetter,
        first: Duration,
        max: Duration,
    ) {
        let shard = self.shard.to_string();
        let backoff = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max.max(first))
            .without_max_times();
        let sink = &letters.sink;
        // A put that does not answer within the call timeout counts as a refusal: retried,
        // counted and shown, rather than a shard that waits on it silently.
        let deadline = self.call_timeout;
        let put = || async {
            match tokio::time::timeout(deadline, sink.put(letter)).await {
                Ok(result) => result,
                Err(_) => Err(BackendError::new(
                    crate::ErrorKind::Retryable,
                    "put_dead_letter",
                    format!(
                        "the dead-letter sink did not answer within {deadline:?} (call_timeout)"
                    ),
                )),
            }
        };
        // Refusals of this letter in a row: the shard is failing after a few (not after a few
        // letters' first refusals together, under `Parallel`).
        let refused = std::sync::atomic::AtomicU32::new(0);
        let _ = put
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .notify(|error: &BackendError, wait| {
                let n = refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                self.tally.sink_refused(n);
                ::metrics::counter!(crate::metrics::SINK_FAILURES, "shard" => shard.clone())
                    .increment(1);
                tracing::warn!(
                    error = %crate::error_chain(error),
                    sequence_number = %letter.record.position(),
                    retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    "the dead-letter sink refused a record; the checkpoint waits for it"
                );
            })
            .await;
        self.tally.sink_accepted();
    }
}

/// The lease row's entry for ordering key `key` parked behind `behind`
/// ([`Lease::parked_keys`](crate::Lease)): `{key:016x}/{sequence}/{sub-sequence}`.
pub(crate) fn park_entry(key: u64, behind: &ExtendedSequenceNumber) -> String {
    format!("{key:016x}/{}/{}", behind.sequence, behind.sub_sequence)
}

/// The key and position of a parked-key entry; `None` (logged by the caller) if malformed,
/// or if it is a redrive request ([`replay`](super::replay)).
pub(crate) fn parse_park_entry(entry: &str) -> Option<(u64, ExtendedSequenceNumber)> {
    match super::replay::parse_entry(entry)? {
        super::replay::Entry::Park(key, behind) => Some((key, behind)),
        super::replay::Entry::Redrive { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SequenceNumber;

    #[test]
    fn a_letter_names_the_shards_stream_before_the_workers() {
        let origin = |shard: &str| Origin {
            letters: Some(DeadLetters::new(crate::memory::MemorySink::new()).stream("set")),
            worker: WorkerId::new("w"),
            stream: shard.starts_with("123").then(|| "clicks".to_owned()),
            shard: ShardId::new(shard),
            row: None,
            poll: Duration::from_secs(1),
            tally: Arc::default(),
            call_timeout: Duration::from_secs(1),
        };
        let record = Record::new(SequenceNumber::from(1u128), "k", "v");
        let tries = Tries::default();
        let multi = origin("123456789012:clicks:1700000000:shardId-000000000001");
        let letter = multi.letter(record.clone(), &tries, Reason::Attempts);
        assert_eq!(letter.stream.as_deref(), Some("clicks"));
        let single = origin("shardId-000000000001").letter(record, &tries, Reason::Attempts);
        assert_eq!(single.stream.as_deref(), Some("set"));
    }

    #[test]
    fn a_park_entry_reads_back() {
        let at = ExtendedSequenceNumber {
            sequence: SequenceNumber::parse(
                "49590338271490256608559692538361571095921575989136588898",
            )
            .unwrap_or_else(|| SequenceNumber::from(1u128)),
            sub_sequence: 3,
        };
        let entry = park_entry(0xdead_beef, &at);
        assert_eq!(parse_park_entry(&entry), Some((0xdead_beef, at)));
        assert_eq!(parse_park_entry("zz/1/0"), None);
        assert_eq!(parse_park_entry("00ff/1/0/9"), None);
    }
}
