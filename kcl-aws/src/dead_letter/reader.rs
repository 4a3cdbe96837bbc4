//! [`SinkReader`]: a sink's letters read back by the worker, for a redrive through the holder
//! ([`kcl_core::failure::LetterReader`]).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use kcl_core::failure::{Kept, LetterReader};
use kcl_core::{BackendError, ErrorKind};

use super::format::LetterId;
use super::sqs_hold::Hold;
use super::store::Location;
use super::stored::{At, Listing, ReadError};
use super::{file, s3, sqs};

/// Reads a parked key's letters back where a sink put them, and removes each once its record
/// ran again: what a worker's [`DeadLetters::reader`](kcl_core::failure::DeadLetters::reader)
/// takes, so that `kcl-admin dead-letters redrive` of a parked key goes through the shard's
/// holder, which replays the key's letters before any later record of the key. Built from a
/// [`Location`] ([`Location::reader`]) on an SQS queue, S3 or a file; not on a Kinesis stream,
/// whose records cannot be deleted.
///
/// - SQS: [`parked`](LetterReader::parked) receives the whole queue, makes every other
///   message visible again at once, and holds the key's letters (every copy) hidden from
///   other readers: for the [visibility timeout](Self::with_visibility_timeout) (60 s), which
///   each later call extends for the key's letters held half of it or more.
///   [`remove`](LetterReader::remove) deletes the letter's messages (and the S3 objects of
///   pointers) with their receipts while those are fresh (under three quarters of the
///   timeout), else receives the queue again to find them by id (a letter whose replay took
///   longer than that), then deletes them. A key's replay that stops leaves its letters
///   hidden until the timeout ends.
/// - S3: lists the prefix and reads every object (the key is in the letter, not in the
///   object's name); `remove` deletes the letter's object.
/// - A file: reads its lines; `remove` rewrites it without the letter's lines, under the lock
///   `FileSink` writers take.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use kcl_aws::dead_letter::Location;
/// use kcl_core::failure::DeadLetters;
///
/// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let location: Location = "sqs:https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq".parse()?;
/// let mut letters = DeadLetters::new(location.sink(&sdk)).application("orders-app");
/// if let Some(reader) = location.reader(&sdk) {
///     letters = letters.reader(reader);
/// }
/// # let _ = letters;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SinkReader {
    at: Reading,
}

#[derive(Debug, Clone)]
enum Reading {
    Sqs(Arc<Hold>),
    S3 {
        client: aws_sdk_s3::Client,
        bucket: String,
        prefix: String,
    },
    File(PathBuf),
}

impl SinkReader {
    /// The letters of the SQS queue `queue_url` (and the S3 objects its pointers name), read
    /// with the settings of `sdk`.
    pub fn sqs(sdk: &SdkConfig, queue_url: impl Into<String>) -> Self {
        Self::sqs_from_clients(sqs::client(sdk), s3::client(sdk), queue_url)
    }

    /// As [`sqs`](Self::sqs), with clients already built.
    pub fn sqs_from_clients(
        sqs: aws_sdk_sqs::Client,
        s3: aws_sdk_s3::Client,
        queue_url: impl Into<String>,
    ) -> Self {
        Self {
            at: Reading::Sqs(Arc::new(Hold::new(sqs, s3, queue_url.into()))),
        }
    }

    /// The letters `S3Sink` put under `prefix` in `bucket`.
    pub fn s3(sdk: &SdkConfig, bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            at: Reading::S3 {
                client: s3::client(sdk),
                bucket: bucket.into(),
                prefix: prefix.into(),
            },
        }
    }

    /// The letters of the file `FileSink` appends to at `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            at: Reading::File(path.into()),
        }
    }

    /// SQS: how long the key's letters stay hidden from other readers between two calls
    /// (default 60 s, at least 2 s). Longer keeps a slow replay's receipts working; shorter
    /// shows a stopped replay's letters sooner.
    #[must_use]
    pub fn with_visibility_timeout(self, timeout: Duration) -> Self {
        self.with_hold(|hold| hold.visibility = timeout.max(Duration::from_secs(2)))
    }

    /// SQS: how long each `ReceiveMessage` waits for messages (default 1 s, at most 20 s); a
    /// listing ends at the first receive that brings no new message.
    #[must_use]
    pub fn with_receive_wait(self, wait: Duration) -> Self {
        self.with_hold(|hold| hold.wait = wait)
    }

    fn with_hold(mut self, set: impl FnOnce(&mut Hold)) -> Self {
        if let Reading::Sqs(hold) = &mut self.at
            && let Some(hold) = Arc::get_mut(hold)
        {
            set(hold);
        }
        self
    }

    /// Where it reads.
    pub fn location(&self) -> Location {
        match &self.at {
            Reading::Sqs(hold) => Location::Sqs {
                queue_url: hold.queue_url().to_owned(),
            },
            Reading::S3 { bucket, prefix, .. } => Location::S3 {
                bucket: bucket.clone(),
                prefix: prefix.clone(),
            },
            Reading::File(path) => Location::File(path.clone()),
        }
    }
}

impl Location {
    /// A reader of the letters kept here, for a worker's
    /// [`DeadLetters::reader`](kcl_core::failure::DeadLetters::reader): on SQS, S3 and a
    /// file; `None` for a Kinesis stream (its records cannot be deleted).
    pub fn reader(&self, sdk: &SdkConfig) -> Option<SinkReader> {
        match self {
            Self::Sqs { queue_url } => Some(SinkReader::sqs(sdk, queue_url.clone())),
            Self::S3 { bucket, prefix } => {
                Some(SinkReader::s3(sdk, bucket.clone(), prefix.clone()))
            }
            Self::Kinesis(_) => None,
            Self::File(path) => Some(SinkReader::file(path.clone())),
        }
    }
}

impl LetterReader for SinkReader {
    async fn parked(&self, key: &str) -> Result<Vec<Kept>, BackendError> {
        let listing = match &self.at {
            Reading::Sqs(hold) => return hold.parked(key).await,
            Reading::S3 {
                client,
                bucket,
                prefix,
            } => s3::list(client, bucket, prefix).await?,
            Reading::File(path) => {
                let path = path.clone();
                blocking(&self.at, move || file::list(&path)).await?
            }
        };
        Ok(of_key(listing, key))
    }

    async fn remove(&self, kept: &Kept) -> Result<(), BackendError> {
        match &self.at {
            Reading::Sqs(hold) => hold.remove(kept).await,
            Reading::S3 { client, bucket, .. } => s3::delete(client, bucket, &kept.handle).await,
            Reading::File(path) => {
                let path = path.clone();
                let ids = HashSet::from([LetterId::of(&kept.letter)]);
                blocking(&self.at, move || file::remove(&path, &ids))
                    .await
                    .map(drop)
            }
        }
    }
}

/// The letters of `listing` parked behind `key`, each with its handle: an object's key, or
/// the letter's id for a file's lines.
fn of_key(listing: Listing, key: &str) -> Vec<Kept> {
    let of_key = listing
        .letters
        .into_iter()
        .filter(|s| s.letter.parked_key.as_deref() == Some(key));
    of_key
        .map(|s| {
            let handle = match &s.at {
                At::S3 { key, .. } => key.clone(),
                _ => s.id.to_string(),
            };
            Kept::new(s.letter, handle)
        })
        .collect()
}

/// Runs a file's work on the blocking pool.
async fn blocking<T: Send + 'static>(
    at: &Reading,
    work: impl FnOnce() -> Result<T, ReadError> + Send + 'static,
) -> Result<T, BackendError> {
    let done = tokio::task::spawn_blocking(work).await;
    let what = || match at {
        Reading::File(path) => path.display().to_string(),
        _ => String::new(),
    };
    match done {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(ReadError::Backend(e))) => Err(e),
        Ok(Err(e)) => Err(BackendError::new(
            ErrorKind::Retryable,
            "read_letters",
            e.to_string(),
        )),
        Err(e) => Err(BackendError::new(
            ErrorKind::Retryable,
            "read_letters",
            format!("{}: {e}", what()),
        )),
    }
}
