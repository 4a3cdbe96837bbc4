//! Dead letters on AWS: where a worker puts the records its failure policy gave up on
//! ([`kcl_core::failure`]), in one JSON format, and how they are read back to be redriven.
//!
//! # Sinks
//!
//! Each implements [`DeadLetterSink`](kcl_core::failure::DeadLetterSink): `put` returns `Ok`
//! only once the letter is stored (the worker retries a failure, and the shard's checkpoint
//! waits), and a letter put twice (after a failover, or a timeout that hid a success) is
//! harmless: the same key, a FIFO queue's deduplication, or two copies with the same
//! [`LetterId`] that readers and redrives treat as one.
//!
//! | sink | one letter is | a letter put twice | too large |
//! | --- | --- | --- | --- |
//! | [`SqsSink`] | a message: the JSON as body, attributes `kcl.shard`, `kcl.sequence_number`, `kcl.sub_sequence_number`, `kcl.partition_key`, `kcl.reason`, `kcl.body` | FIFO queue (`.fifo`): deduplicated within 5 minutes (deduplication id = the letter's id; each letter a message group of its own); standard queue: two messages | over 256 KiB ([`with_message_limit`](SqsSink::with_message_limit)): the letter in S3, a pointer in the queue ([`with_overflow`](SqsSink::with_overflow)) |
//! | [`S3Sink`] | an object at `{prefix}{stream}/{shard}/{sequence}-{subsequence}.json` | the same key, replaced | never |
//! | [`KinesisSink`] | a record of another stream, partition key = the record's | two records | over a record's 1 MiB: in S3 with a pointer record ([`with_overflow`](KinesisSink::with_overflow)), or refused |
//! | [`FileSink`] | a line of a local file, synced before `Ok` (development) | two lines | never |
//!
//! A program whose settings name the sink builds it from a [`Location`] (`sqs:QUEUE-URL`,
//! `s3://BUCKET/PREFIX`, `kinesis:STREAM`, `file:PATH`) with [`Location::sink`], an
//! [`AnySink`].
//!
//! Each checks at start ([`check`](kcl_core::failure::DeadLetterSink::check)) that it can
//! work: the queue, bucket or stream exists (`GetQueueAttributes`, `HeadBucket`,
//! `DescribeStreamSummary`; an overflow bucket too), or the file's folder does and a file may
//! be created there; it warns when a queue or stream keeps letters less than
//! [`RETENTION_FLOOR`](kcl_core::failure::RETENTION_FLOOR).
//!
//! A letter too large for its queue or stream with no overflow sink is refused with an
//! [`ErrorKind::Fatal`](kcl_core::ErrorKind::Fatal) error that says its size; the worker
//! retries it for ever, so give [`SqsSink`] and [`KinesisSink`] an overflow unless records
//! are small. Errors of SQS and S3 are classified as those of Kinesis and DynamoDB are
//! (throttling is `Throttled`, a missing queue or bucket `NotFound`, 5xx `Retryable`).
//!
//! ```no_run
//! # async fn demo() {
//! use kcl_aws::dead_letter::{S3Sink, SqsSink};
//! use kcl_core::failure::DeadLetters;
//!
//! let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dead-letters";
//! let sink = SqsSink::new(&sdk, queue)
//!     .with_overflow(S3Sink::new(&sdk, "orders-dead-letters", "large/"));
//! let letters = DeadLetters::new(sink).application("orders-app").stream("orders");
//! // Worker::builder(source, leases).dead_letters(letters) …
//! # let _ = letters;
//! # }
//! ```
//!
//! # The format, version 1
//!
//! A letter is one JSON object, on one line ([`to_json`], [`from_json`]):
//!
//! ```json
//! {
//!   "version": 1,
//!   "application": "orders-app",
//!   "stream": "orders",
//!   "worker": "ip-10-0-0-7-4242",
//!   "shard": "shardId-000000000001",
//!   "record": {
//!     "sequence_number": "49590338271490256608559692538361571095921575989136588898",
//!     "sub_sequence_number": 0,
//!     "partition_key": "user-7",
//!     "explicit_hash_key": null,
//!     "approximate_arrival": "2025-06-01T12:00:00.123Z",
//!     "data": "eyJvcmRlciI6IDQyfQ=="
//!   },
//!   "attempts": 3,
//!   "first_error": "timeout",
//!   "last_error": "permanent failure: missing field `total`",
//!   "first_failed": "2025-06-01T12:00:01.5Z",
//!   "dead_lettered": "2025-06-01T12:00:09.5Z",
//!   "reason": { "kind": "attempts" },
//!   "parked_key": null
//! }
//! ```
//!
//! - `data` is the payload in standard base64 (with padding), so any bytes survive;
//! - times are RFC 3339 in UTC, to the nanosecond kcl had;
//! - `application`, `stream`, `explicit_hash_key` and `parked_key` are `null` when unknown;
//! - `reason.kind` is `attempts` (failed every attempt), `age` (older than the policy's
//!   maximum record age), `permanent` (a `Permanent` error) or `parked`, which has
//!   `"behind": {"sequence_number": "…", "sub_sequence_number": 0}`, the record whose key
//!   it was parked behind.
//!
//! A letter stored in S3 because it was too large for its queue or stream leaves a pointer
//! there instead ([`Message::Pointer`]):
//! `{"version": 1, "id": "shardId-…/4959…/0", "pointer": {"bucket": "…", "key": "…"}, "size": 312345}`.
//!
//! Readers ignore fields they do not know, so version 1 may gain fields; a change of meaning
//! is a new version, which this crate refuses to read ([`DecodeError::Version`]) rather than
//! misread.
//!
//! A letter's id, [`LetterId`], is `shard/sequence/subsequence`: what `kcl-admin
//! dead-letters show` and `redrive --id` take.
//!
//! # Reading letters back
//!
//! A [`LetterStore`] opened on a [`Location`] (`sqs:URL`, `s3://bucket/prefix`,
//! `kinesis:STREAM`, `file:PATH`) lists the letters there, and deletes them once redriven;
//! [`Redriver`] puts a letter's record back into a stream, with its partition key and
//! explicit hash key. `kcl-admin dead-letters list|show|redrive` is built on them
//! (`docs/dead-letters.md`).
//!
//! A worker reads a parked key's letters back itself when `kcl-admin dead-letters redrive`
//! asks its shard's holder to replay them: give its
//! [`DeadLetters`](kcl_core::failure::DeadLetters) a [`SinkReader`] ([`Location::reader`]; SQS,
//! S3 or a file).

mod any;
mod check;
mod file;
mod format;
mod kinesis;
mod reader;
mod s3;
mod sqs;
mod sqs_hold;
mod sqs_read;
mod store;
mod stored;

pub use any::AnySink;
pub use file::FileSink;
pub use format::{
    DecodeError, LetterId, Message, Pointer, VERSION, decode_message, from_json, to_json,
};
pub use kinesis::{KinesisSink, MAX_RECORD, Redriven, Redriver};
pub use reader::SinkReader;
pub use s3::S3Sink;
pub use sqs::{DEFAULT_MESSAGE_LIMIT, SqsSink};
pub use store::{LetterStore, Location, LocationError};
pub use stored::{Listing, ReadError, Stored, Unreadable};
