//! Letters read back from where a sink put them, and what reading them can fail with.

use std::fmt;
use std::path::PathBuf;

use kcl_core::BackendError;
use kcl_core::failure::DeadLetter;

use super::format::LetterId;

/// A dead letter read back, with where it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Its id (`shard/sequence/subsequence`).
    pub id: LetterId,
    /// The letter.
    pub letter: DeadLetter,
    pub(crate) at: At,
}

impl Stored {
    pub(crate) fn new(letter: DeadLetter, at: At) -> Self {
        Self {
            id: LetterId::of(&letter),
            letter,
            at,
        }
    }

    /// Where it is kept: `sqs message ID` (with `, s3://bucket/key` for a pointer),
    /// `s3://bucket/key`, `kinesis shardId-…/sequence`, `line N of PATH`.
    pub fn place(&self) -> String {
        self.at.to_string()
    }
}

/// Where a letter read back is kept, as much as it takes to delete it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum At {
    /// A message of an SQS queue, and the S3 object it points to.
    Sqs {
        message_id: String,
        receipt_handle: String,
        object: Option<(String, String)>,
    },
    /// An S3 object.
    S3 { bucket: String, key: String },
    /// A record of a Kinesis stream (never deleted).
    Kinesis { shard: String, sequence: String },
    /// A line of a file (1-based).
    File { path: PathBuf, line: usize },
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqs {
                message_id,
                object: Some((bucket, key)),
                ..
            } => write!(f, "sqs message {message_id}, s3://{bucket}/{key}"),
            Self::Sqs { message_id, .. } => write!(f, "sqs message {message_id}"),
            Self::S3 { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            Self::Kinesis { shard, sequence } => write!(f, "kinesis {shard}/{sequence}"),
            Self::File { path, line } => write!(f, "line {line} of {}", path.display()),
        }
    }
}

/// A message, object, record or line that holds no readable letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Where it is (as [`Stored::place`] says it).
    pub place: String,
    /// Why it cannot be read.
    pub error: String,
    /// An SQS message's receipt, to make it visible again.
    pub(crate) at: Option<At>,
}

/// What a [`LetterStore`](super::LetterStore) holds: the letters, in the order of their ids
/// (shard, then sequence), and what could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The letters.
    pub letters: Vec<Stored>,
    /// What could not be read as a letter (left where it is).
    pub unreadable: Vec<Unreadable>,
    /// About how many messages of an SQS queue were in flight, received by another reader
    /// (a listing or a redrive elsewhere, a worker replaying a parked key) and so neither
    /// listed nor read (SQS's `ApproximateNumberOfMessagesNotVisible`, less those this
    /// listing holds); 0 for other stores.
    pub in_flight: u64,
}

impl Listing {
    /// Sorts the letters by id: a shard's letters in sequence order.
    pub(crate) fn sorted(mut self) -> Self {
        self.letters.sort_by(|a, b| a.id.cmp(&b.id));
        self
    }
}

/// Reading letters back, or deleting them, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// A call to SQS, S3 or Kinesis failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}
