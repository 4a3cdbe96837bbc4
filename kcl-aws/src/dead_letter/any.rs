//! [`AnySink`]: the sink a [`Location`] names, for programs whose settings choose it (a
//! configuration file's `sqs:…`, `s3://…`, `kinesis:…` or `file:…`).

use aws_config::SdkConfig;
use kcl_core::BackendError;
use kcl_core::failure::{DeadLetter, DeadLetterSink};

use super::store::Location;
use super::{FileSink, KinesisSink, S3Sink, SqsSink};

/// One of the four sinks, as a [`Location`] names it ([`Location::sink`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnySink {
    /// An SQS queue.
    Sqs(SqsSink),
    /// S3 objects.
    S3(S3Sink),
    /// A Kinesis stream.
    Kinesis(KinesisSink),
    /// A local file.
    File(FileSink),
}

impl AnySink {
    /// An SQS or Kinesis sink with `s3` for letters too large for a message or a record (see
    /// [`SqsSink::with_overflow`]); the others as they are.
    #[must_use]
    pub fn with_overflow(self, s3: S3Sink) -> Self {
        match self {
            Self::Sqs(sink) => Self::Sqs(sink.with_overflow(s3)),
            Self::Kinesis(sink) => Self::Kinesis(sink.with_overflow(s3)),
            other => other,
        }
    }
}

impl DeadLetterSink for AnySink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        match self {
            Self::Sqs(sink) => sink.put(letter).await,
            Self::S3(sink) => sink.put(letter).await,
            Self::Kinesis(sink) => sink.put(letter).await,
            Self::File(sink) => sink.put(letter).await,
        }
    }

    async fn check(&self) -> Result<Vec<String>, BackendError> {
        match self {
            Self::Sqs(sink) => sink.check().await,
            Self::S3(sink) => sink.check().await,
            Self::Kinesis(sink) => sink.check().await,
            Self::File(sink) => sink.check().await,
        }
    }
}

impl Location {
    /// The sink that puts letters here, with the settings of `sdk`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use kcl_aws::dead_letter::{Location, S3Sink};
    ///
    /// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let location: Location = "sqs:https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq".parse()?;
    /// let sink = location.sink(&sdk).with_overflow(S3Sink::new(&sdk, "orders-dlq", "large/"));
    /// # let _ = sink;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sink(&self, sdk: &SdkConfig) -> AnySink {
        match self {
            Self::Sqs { queue_url } => AnySink::Sqs(SqsSink::new(sdk, queue_url.clone())),
            Self::S3 { bucket, prefix } => {
                AnySink::S3(S3Sink::new(sdk, bucket.clone(), prefix.clone()))
            }
            Self::Kinesis(stream) => AnySink::Kinesis(KinesisSink::new(sdk, stream.clone())),
            Self::File(path) => AnySink::File(FileSink::new(path.clone())),
        }
    }
}
