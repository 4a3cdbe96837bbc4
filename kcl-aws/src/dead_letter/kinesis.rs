//! [`KinesisSink`]: letters into another Kinesis stream; reading that stream back; and
//! [`Redriver`], which puts a letter's record back into its stream.

use aws_config::SdkConfig;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::StreamStatus;
use kcl_core::failure::{DeadLetter, DeadLetterSink, RETENTION_FLOOR};
use kcl_core::{BackendError, ErrorKind, ShardSource as _, StartingPosition};

use super::S3Sink;
use super::check::{days, refused};
use super::format::{LetterId, pointer_json, to_json};
use super::s3;
use super::stored::{At, Listing, Stored, Unreadable};
use crate::error::backend_error;
use crate::kinesis::{KinesisShardSource, StreamRef};

/// The most a Kinesis record holds: data and partition key, 1 MiB.
pub const MAX_RECORD: usize = 1024 * 1024;

/// The most characters of a partition key.
const MAX_PARTITION_KEY: usize = 256;

/// `GetRecords` calls on one shard when reading a stream back, at most (1,000 records each).
const MAX_READS: usize = 10_000;

/// A [`DeadLetterSink`] that puts each letter (its JSON) into another Kinesis stream, with the
/// record's partition key (its first 256 characters; the shard id if it has none), so that
/// a key's letters keep their order in one shard.
///
/// A record holds 1 MiB: a letter is the payload in base64 (4/3 of its size) plus about a
/// kilobyte, so records over about 760 KiB do not fit. Such a letter goes to the [overflow
/// sink](Self::with_overflow) in S3 and the record points to it, as [`SqsSink`](super::SqsSink)
/// does; without one it is refused with an [`ErrorKind::Fatal`] error naming its size, which
/// the worker retries for ever. A letter put twice is two records with the same id.
#[derive(Debug, Clone)]
pub struct KinesisSink {
    client: Client,
    stream: StreamRef,
    overflow: Option<S3Sink>,
}

impl KinesisSink {
    /// A sink on `stream` (name or ARN), with the settings of `sdk` (endpoint:
    /// `AWS_ENDPOINT_URL_KINESIS`) and kcl-aws's Kinesis timeouts where `sdk` sets none.
    pub fn new(sdk: &SdkConfig, stream: impl Into<StreamRef>) -> Self {
        Self::from_client(client(sdk), stream)
    }

    /// A sink using an already built client.
    pub fn from_client(client: Client, stream: impl Into<StreamRef>) -> Self {
        Self {
            client,
            stream: stream.into(),
            overflow: None,
        }
    }

    /// Letters too large for a record go to `s3`, and the record points there.
    #[must_use]
    pub fn with_overflow(mut self, s3: S3Sink) -> Self {
        self.overflow = Some(s3);
        self
    }

    /// [`DeadLetterSink::check`]: the stream exists and is `ACTIVE` or `UPDATING`
    /// (`DescribeStreamSummary`; [`check_status`]) and keeps records at least
    /// [`RETENTION_FLOOR`]; the overflow bucket is reachable.
    async fn check_stream(&self) -> Result<Vec<String>, BackendError> {
        let what = format!("the Kinesis {}", self.stream);
        let request = self.client.describe_stream_summary();
        let request = match &self.stream {
            StreamRef::Name(name) => request.stream_name(name),
            StreamRef::Arn(arn) => request.stream_arn(arn),
        };
        let out = request.send().await.map_err(|e| {
            refused(
                &backend_error("describe_stream_summary", &what, e),
                &what,
                "create it, or fix the dead-letter sink's stream",
                "kinesis:DescribeStreamSummary",
            )
        })?;
        let mut warnings = Vec::new();
        if let Some(summary) = out.stream_description_summary {
            check_status(&what, &summary.stream_status)?;
            let hours = u64::try_from(summary.retention_period_hours).unwrap_or(0);
            if hours * 3600 < RETENTION_FLOOR.as_secs() {
                warnings.push(format!(
                    "{what} keeps records {} (retention period {hours} hours), less than the \
                     {} dead letters should be kept (RETENTION_FLOOR): a letter counted \
                     finished can expire before anyone redrives it; raise it with \
                     IncreaseStreamRetentionPeriod (up to 8760 hours)",
                    days(hours * 3600),
                    days(RETENTION_FLOOR.as_secs()),
                ));
            }
        }
        if let Some(s3) = &self.overflow {
            warnings.extend(s3.check().await?);
        }
        Ok(warnings)
    }
}

/// A sink stream's status, checked at start: `ACTIVE` and `UPDATING` take records;
/// `CREATING` will, so the worker waits ([`ErrorKind::Retryable`]); `DELETING` (or a status
/// this SDK does not know) never will, so the worker stops saying what to fix
/// ([`ErrorKind::Fatal`]) instead of waiting for ever.
fn check_status(what: &str, status: &StreamStatus) -> Result<(), BackendError> {
    let (kind, fix) = match status {
        StreamStatus::Active | StreamStatus::Updating => return Ok(()),
        StreamStatus::Creating => (ErrorKind::Retryable, "wait until it is ACTIVE"),
        StreamStatus::Deleting => (
            ErrorKind::Fatal,
            "it is being deleted and will take no letter: create it again once it is gone, or \
             fix the dead-letter sink's stream",
        ),
        _ => (
            ErrorKind::Fatal,
            "make it ACTIVE, or fix the dead-letter sink's stream",
        ),
    };
    let message = format!(
        "{what} is {}, not ACTIVE: the dead-letter sink cannot put letters into it; {fix}",
        status.as_str()
    );
    Err(BackendError::new(kind, "describe_stream_summary", message))
}

impl DeadLetterSink for KinesisSink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        let json = to_json(letter);
        let key = partition_key(letter);
        let size = json.len() + key.len();
        let data = if size <= MAX_RECORD {
            json
        } else {
            let Some(s3) = &self.overflow else {
                let message = format!(
                    "dead letter {} is {size} bytes, over a Kinesis record's {MAX_RECORD}, and \
                     the sink has no S3 overflow (KinesisSink::with_overflow)",
                    LetterId::of(letter)
                );
                return Err(BackendError::new(ErrorKind::Fatal, "put_record", message));
            };
            let length = json.len();
            let object = s3.store(letter, json).await?;
            pointer_json(letter, s3.bucket(), &object, length)
        };
        put(&self.client, &self.stream, &key, None, data.into_bytes()).await?;
        Ok(())
    }

    async fn check(&self) -> Result<Vec<String>, BackendError> {
        self.check_stream().await
    }
}

/// A letter's record back in a stream: where it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The shard it landed in.
    pub shard: String,
    /// Its new sequence number.
    pub sequence_number: String,
}

/// Puts the records of dead letters back into a Kinesis stream, each with its payload,
/// partition key and explicit hash key, so that it lands where a producer would have put it.
#[derive(Debug, Clone)]
pub struct Redriver {
    client: Client,
}

impl Redriver {
    /// A redriver with the settings of `sdk`, as [`KinesisSink::new`].
    pub fn new(sdk: &SdkConfig) -> Self {
        Self::from_client(client(sdk))
    }

    /// A redriver using an already built client.
    pub fn from_client(client: Client) -> Self {
        Self { client }
    }

    /// Puts `letter`'s record into `stream` (one `PutRecord`).
    pub async fn put(
        &self,
        letter: &DeadLetter,
        stream: &StreamRef,
    ) -> Result<Redriven, BackendError> {
        let record = &letter.record;
        put(
            &self.client,
            stream,
            &record.partition_key,
            record.explicit_hash_key.as_deref(),
            record.data.to_vec(),
        )
        .await
    }
}

/// A Kinesis client on `sdk`'s settings, with kcl-aws's Kinesis timeouts where it sets none.
pub(crate) fn client(sdk: &SdkConfig) -> Client {
    let conf = aws_sdk_kinesis::config::Builder::from(sdk)
        .timeout_config(crate::timeouts::with_defaults(
            sdk,
            crate::timeouts::KINESIS,
        ))
        .build();
    Client::from_conf(conf)
}

async fn put(
    client: &Client,
    stream: &StreamRef,
    key: &str,
    hash_key: Option<&str>,
    data: Vec<u8>,
) -> Result<Redriven, BackendError> {
    let request = client
        .put_record()
        .partition_key(key)
        .set_explicit_hash_key(hash_key.map(str::to_owned))
        .data(Blob::new(data));
    let request = match stream {
        StreamRef::Name(name) => request.stream_name(name),
        StreamRef::Arn(arn) => request.stream_arn(arn),
    };
    let out = request
        .send()
        .await
        .map_err(|e| backend_error("put_record", stream, e))?;
    Ok(Redriven {
        shard: out.shard_id,
        sequence_number: out.sequence_number,
    })
}

/// The partition key of a letter's record in the dead-letter stream.
fn partition_key(letter: &DeadLetter) -> String {
    let key = &letter.record.partition_key;
    if key.is_empty() {
        return letter.shard.to_string();
    }
    key.chars().take(MAX_PARTITION_KEY).collect()
}

/// Every letter of `stream`, read from `TRIM_HORIZON` to the end of each shard, following
/// pointers into S3.
pub(crate) async fn list(
    kinesis: &Client,
    s3: &aws_sdk_s3::Client,
    stream: &StreamRef,
) -> Result<Listing, BackendError> {
    let source = KinesisShardSource::from_client(kinesis.clone(), stream.clone());
    let mut listing = Listing::default();
    for shard in source.list_shards().await? {
        let mut iterator = source
            .shard_iterator(&shard.id, &StartingPosition::TrimHorizon)
            .await?;
        for _ in 0..MAX_READS {
            let batch = source.get_records(&iterator, 1000).await?;
            let empty = batch.records.is_empty();
            for record in batch.records {
                let at = At::Kinesis {
                    shard: shard.id.to_string(),
                    sequence: record.sequence_number.to_string(),
                };
                match s3::letter_of(s3, &record.data).await {
                    Ok((letter, _)) => listing.letters.push(Stored::new(letter, at)),
                    Err(error) => listing.unreadable.push(Unreadable {
                        place: at.to_string(),
                        error,
                        at: None,
                    }),
                }
            }
            let caught_up = empty && batch.millis_behind_latest.unwrap_or(0) == 0;
            match batch.next_iterator {
                Some(next) if !caught_up => iterator = next,
                _ => break,
            }
        }
    }
    Ok(listing)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use aws_sdk_kinesis::config::retry::RetryConfig;
    use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_kinesis::operation::describe_stream_summary::DescribeStreamSummaryOutput;
    use aws_sdk_kinesis::types::StreamDescriptionSummary;
    use aws_smithy_mocks::{MockResponseInterceptor, RuleMode, create_mock_http_client, mock};

    use super::*;

    /// A sink on a mocked client whose `DescribeStreamSummary` says `status`.
    fn sink(status: StreamStatus) -> KinesisSink {
        let rule = mock!(Client::describe_stream_summary).then_output(move || {
            let summary = StreamDescriptionSummary::builder()
                .stream_name("letters")
                .stream_arn("arn:aws:kinesis:us-east-1:123456789012:stream/letters")
                .stream_status(status.clone())
                .retention_period_hours(168)
                .stream_creation_timestamp(aws_smithy_types::DateTime::from_secs(0))
                .enhanced_monitoring(aws_sdk_kinesis::types::EnhancedMetrics::builder().build())
                .open_shard_count(1)
                .build()
                .unwrap();
            DescribeStreamSummaryOutput::builder()
                .stream_description_summary(summary)
                .build()
        });
        let interceptor = MockResponseInterceptor::new()
            .rule_mode(RuleMode::MatchAny)
            .with_rule(&rule);
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .retry_config(RetryConfig::disabled())
            .http_client(create_mock_http_client())
            .interceptor(interceptor)
            .build();
        KinesisSink::from_client(Client::from_conf(config), "letters")
    }

    /// A stream being created is waited for; one being deleted never takes a letter, so the
    /// worker stops and says what to fix instead of waiting for ever.
    #[tokio::test]
    async fn a_deleting_stream_is_fatal_and_a_creating_one_retried() {
        for status in [StreamStatus::Active, StreamStatus::Updating] {
            assert_eq!(sink(status).check().await.unwrap(), Vec::<String>::new());
        }
        let creating = sink(StreamStatus::Creating).check().await.unwrap_err();
        assert_eq!(creating.kind(), ErrorKind::Retryable, "{creating}");
        assert!(creating.to_string().contains("is CREATING"), "{creating}");
        let deleting = sink(StreamStatus::Deleting).check().await.unwrap_err();
        assert_eq!(deleting.kind(), ErrorKind::Fatal, "{deleting}");
        assert!(
            deleting.to_string().contains("is DELETING")
                && deleting.to_string().contains("being deleted")
                && deleting.to_string().contains("create it again"),
            "{deleting}"
        );
    }
}
