//! Where a sink put its letters ([`Location`]), and reading them back from there
//! ([`LetterStore`]).

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use aws_config::SdkConfig;

use super::format::LetterId;
use super::stored::{At, Listing, ReadError, Stored};
use super::{file, kinesis, s3, sqs, sqs_read};
use crate::kinesis::StreamRef;

/// Where dead letters are kept, written as `kcl-admin dead-letters --from` takes it:
/// `sqs:QUEUE-URL`, `s3://BUCKET/PREFIX`, `kinesis:STREAM` (a name or an ARN) or
/// `file:PATH`.
///
/// ```
/// use kcl_aws::dead_letter::Location;
///
/// let s3: Location = "s3://orders-dead-letters/orders-app/".parse()?;
/// assert_eq!(s3, Location::S3 { bucket: "orders-dead-letters".into(), prefix: "orders-app/".into() });
/// let file: Location = "file:dead-letters.jsonl".parse()?;
/// assert_eq!(file.to_string(), "file:dead-letters.jsonl");
/// # Ok::<(), kcl_aws::dead_letter::LocationError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// An SQS queue, by its URL ([`SqsSink`](super::SqsSink)).
    Sqs {
        /// The queue's URL.
        queue_url: String,
    },
    /// Objects in S3 ([`S3Sink`](super::S3Sink)).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix of the keys (may be empty).
        prefix: String,
    },
    /// A Kinesis stream ([`KinesisSink`](super::KinesisSink)).
    Kinesis(StreamRef),
    /// A local file of JSON lines ([`FileSink`](super::FileSink)).
    File(PathBuf),
}

/// A [`Location`] that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a dead-letter location (sqs:QUEUE-URL, s3://BUCKET/PREFIX, kinesis:STREAM or \
     file:PATH)"
)]
pub struct LocationError(String);

impl FromStr for Location {
    type Err = LocationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || LocationError(s.to_owned());
        let nonempty = |v: &str| (!v.is_empty()).then(|| v.to_owned()).ok_or_else(invalid);
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            return Ok(Self::S3 {
                bucket: nonempty(bucket)?,
                prefix: prefix.to_owned(),
            });
        }
        if let Some(url) = s.strip_prefix("sqs:") {
            return Ok(Self::Sqs {
                queue_url: nonempty(url)?,
            });
        }
        if let Some(stream) = s.strip_prefix("kinesis:") {
            return Ok(Self::Kinesis(StreamRef::from(nonempty(stream)?)));
        }
        if let Some(path) = s.strip_prefix("file:") {
            return Ok(Self::File(PathBuf::from(nonempty(path)?)));
        }
        Err(invalid())
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqs { queue_url } => write!(f, "sqs:{queue_url}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            Self::Kinesis(StreamRef::Name(s) | StreamRef::Arn(s)) => write!(f, "kinesis:{s}"),
            Self::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// The letters a sink put somewhere, read back: listed, and deleted once redriven.
///
/// - SQS: `ReceiveMessage` until no new message comes, each message hidden from other readers
///   for the [visibility timeout](Self::with_visibility_timeout) (30 s by default) and never
///   deleted but by [`remove`](Self::remove) ([`release`](Self::release) shows them again at
///   once); pointers are followed into S3. Messages another reader holds at the time are not
///   seen, and a listing longer than the timeout may end before the queue's end. On a FIFO
///   queue a message in a group shared with others (SQS hides the rest of a group while one
///   of its messages is held) is first moved into a group of its own: sent again, body and
///   attributes, then deleted; so every letter is listed, at any count.
/// - S3: `ListObjectsV2` under the prefix, then `GetObject` of each `.json` object.
/// - Kinesis: every shard from `TRIM_HORIZON` to its end. Records cannot be deleted:
///   [`remove`](Self::remove) removes nothing, and a redrive's record file says what went.
/// - A file: its lines; [`remove`](Self::remove) rewrites it without them.
#[derive(Debug, Clone)]
pub struct LetterStore {
    location: Location,
    backend: Backend,
    visibility: Duration,
    wait: Duration,
}

#[derive(Debug, Clone)]
enum Backend {
    Sqs(aws_sdk_sqs::Client, aws_sdk_s3::Client),
    S3(aws_sdk_s3::Client),
    Kinesis(aws_sdk_kinesis::Client, aws_sdk_s3::Client),
    File,
}

impl LetterStore {
    /// The letters at `location`, read with the settings of `sdk` (for S3, path-style
    /// addressing when an endpoint is set).
    pub fn open(sdk: &SdkConfig, location: Location) -> Self {
        let backend = match &location {
            Location::Sqs { .. } => Backend::Sqs(sqs::client(sdk), s3::client(sdk)),
            Location::S3 { .. } => Backend::S3(s3::client(sdk)),
            Location::Kinesis(_) => Backend::Kinesis(kinesis::client(sdk), s3::client(sdk)),
            Location::File(_) => Backend::File,
        };
        Self {
            location,
            backend,
            visibility: Duration::from_secs(30),
            wait: Duration::from_secs(1),
        }
    }

    /// SQS: how long a message received while listing stays hidden from other readers (at
    /// least 1 s); a redrive must delete it within that time.
    #[must_use]
    pub fn with_visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility = timeout;
        self
    }

    /// SQS: how long each `ReceiveMessage` waits for messages (long polling; 1 s by default,
    /// at most 20 s). Listing ends at the first receive that brings no new message.
    #[must_use]
    pub fn with_receive_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Reads S3 (the bucket, or the objects an SQS queue's or a Kinesis stream's pointers
    /// name) with `client` instead of one built from the `SdkConfig` (another endpoint or
    /// region than the queue's or stream's).
    #[must_use]
    pub fn with_s3_client(mut self, client: aws_sdk_s3::Client) -> Self {
        match &mut self.backend {
            Backend::Sqs(_, s3) | Backend::S3(s3) | Backend::Kinesis(_, s3) => *s3 = client,
            Backend::File => {}
        }
        self
    }

    /// Where the letters are.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Whether [`remove`](Self::remove) deletes letters (not from a Kinesis stream).
    pub fn removes(&self) -> bool {
        !matches!(self.backend, Backend::Kinesis(..))
    }

    /// Every letter, in the order of their ids, and what could not be read as one.
    pub async fn list(&self) -> Result<Listing, ReadError> {
        let listing = match (&self.backend, &self.location) {
            (Backend::Sqs(client, s3), Location::Sqs { queue_url }) => {
                sqs_read::list_counted(client, s3, queue_url, self.visibility, self.wait).await?
            }
            (Backend::S3(client), Location::S3 { bucket, prefix }) => {
                s3::list(client, bucket, prefix).await?
            }
            (Backend::Kinesis(client, s3), Location::Kinesis(stream)) => {
                kinesis::list(client, s3, stream).await?
            }
            (Backend::File, Location::File(path)) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || file::list(&path))
                    .await
                    .map_err(|e| io_failure(&self.location, &e))??
            }
            _ => Listing::default(),
        };
        Ok(listing.sorted())
    }

    /// Deletes `letters` (read by [`list`](Self::list)) from where they are kept: their SQS
    /// messages and the S3 objects those point to, their S3 objects, or their lines of the
    /// file. Returns how many were deleted: none from a Kinesis stream.
    pub async fn remove(&self, letters: &[&Stored]) -> Result<usize, ReadError> {
        match (&self.backend, &self.location) {
            (Backend::Sqs(client, s3), Location::Sqs { queue_url }) => {
                for stored in letters {
                    sqs_read::delete(client, s3, queue_url, &stored.at).await?;
                }
                Ok(letters.len())
            }
            (Backend::S3(client), Location::S3 { .. }) => {
                for stored in letters {
                    if let At::S3 { bucket, key } = &stored.at {
                        s3::delete(client, bucket, key).await?;
                    }
                }
                Ok(letters.len())
            }
            (Backend::File, Location::File(path)) => {
                let path = path.clone();
                let ids: HashSet<LetterId> = letters.iter().map(|s| s.id.clone()).collect();
                tokio::task::spawn_blocking(move || file::remove(&path, &ids))
                    .await
                    .map_err(|e| io_failure(&self.location, &e))?
            }
            _ => Ok(0),
        }
    }
}

impl LetterStore {
    /// SQS: makes the messages of `listing` (its letters but those of `except`, and the
    /// messages that hold none) visible to other readers again at once, instead of when their
    /// visibility timeout ends. Elsewhere it does nothing. Returns how many it released.
    pub async fn release(
        &self,
        listing: &Listing,
        except: &HashSet<LetterId>,
    ) -> Result<usize, ReadError> {
        let (Backend::Sqs(client, _), Location::Sqs { queue_url }) =
            (&self.backend, &self.location)
        else {
            return Ok(0);
        };
        let letters = listing.letters.iter().filter(|s| !except.contains(&s.id));
        let places = letters
            .map(|s| &s.at)
            .chain(listing.unreadable.iter().filter_map(|u| u.at.as_ref()));
        let mut released = 0;
        for at in places {
            sqs_read::release(client, queue_url, at).await?;
            released += 1;
        }
        Ok(released)
    }
}

/// A blocking file task that did not finish (it panicked, or the runtime is shutting down).
fn io_failure(location: &Location, e: &tokio::task::JoinError) -> ReadError {
    let path = match location {
        Location::File(path) => path.clone(),
        other => PathBuf::from(other.to_string()),
    };
    ReadError::Io {
        path,
        source: std::io::Error::other(e.to_string()),
    }
}
