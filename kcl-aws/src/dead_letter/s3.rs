//! [`S3Sink`]: one object per letter; and reading a bucket's letters back.

use aws_config::SdkConfig;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use kcl_core::failure::{DeadLetter, DeadLetterSink};
use kcl_core::{BackendError, ErrorKind};

use super::check::refused;
use super::format::{Message, decode_message, from_json, to_json};
use super::stored::{At, Listing, Stored, Unreadable};
use crate::error::backend_error;

/// A [`DeadLetterSink`] that writes each letter to an S3 object of its own, at
/// `{prefix}{stream}/{shard}/{sequence}-{subsequence}.json` (`stream`: the letter's stream
/// name, the name part of an ARN, or `stream` when the letter has none). A letter put twice
/// lands on the same key: the second put replaces the first, so duplicates cost nothing.
///
/// ```no_run
/// # async fn demo() {
/// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let sink = kcl_aws::dead_letter::S3Sink::new(&sdk, "orders-dead-letters", "orders-app/");
/// # let _ = sink;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct S3Sink {
    client: Client,
    bucket: String,
    prefix: String,
}

impl S3Sink {
    /// A sink on `bucket`, its keys starting with `prefix` (end it with `/` for a folder; may
    /// be empty), with the settings of `sdk`, kcl-aws's timeouts where `sdk` sets none (15 s an
    /// attempt, 30 s an operation), and path-style addressing (`http://host/bucket/key`) when an
    /// endpoint is set (`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`), as emulators need.
    pub fn new(sdk: &SdkConfig, bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self::from_client(client(sdk), bucket, prefix)
    }

    /// A sink using an already built client.
    pub fn from_client(
        client: Client,
        bucket: impl Into<String>,
        prefix: impl Into<String>,
    ) -> Self {
        Self {
            client,
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key `letter` is stored at.
    pub fn key(&self, letter: &DeadLetter) -> String {
        let stream = letter
            .stream
            .as_deref()
            .map(|s| s.rsplit('/').next().unwrap_or(s))
            .filter(|s| !s.is_empty())
            .unwrap_or("stream");
        let position = letter.record.position();
        format!(
            "{}{stream}/{}/{}-{}.json",
            self.prefix, letter.shard, position.sequence, position.sub_sequence
        )
    }

    /// Stores `json` (the letter's) at the letter's key; returns the key.
    pub(crate) async fn store(
        &self,
        letter: &DeadLetter,
        json: String,
    ) -> Result<String, BackendError> {
        let key = self.key(letter);
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_type("application/json")
            .body(ByteStream::from(json.into_bytes()))
            .send()
            .await
            .map_err(|e| backend_error("put_object", self.place(&key), e))?;
        Ok(key)
    }

    fn place(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// [`DeadLetterSink::check`]: the bucket exists and may be reached (`HeadBucket`, allowed
    /// by `s3:ListBucket`). How long its objects stay is the bucket's lifecycle rules' to say,
    /// which this does not read (`docs/dead-letters.md`).
    async fn check_bucket(&self) -> Result<Vec<String>, BackendError> {
        let what = format!(
            "the S3 bucket {} (dead letters under `{}`)",
            self.bucket, self.prefix
        );
        let head = self.client.head_bucket().bucket(&self.bucket).send().await;
        let Err(e) = head else {
            return Ok(Vec::new());
        };
        // A HEAD answer has no body: a missing bucket is the modelled `NotFound`, a 404.
        let missing = e.as_service_error().is_some_and(|s| s.is_not_found())
            || e.raw_response().is_some_and(|r| r.status().as_u16() == 404);
        let error = backend_error("head_bucket", &what, e);
        let error = if missing {
            BackendError::new(ErrorKind::NotFound, "head_bucket", error.to_string())
        } else {
            error
        };
        Err(refused(
            &error,
            &what,
            "create it, or fix the dead-letter sink's bucket",
            "s3:ListBucket",
        ))
    }
}

impl DeadLetterSink for S3Sink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        self.store(letter, to_json(letter)).await.map(drop)
    }

    async fn check(&self) -> Result<Vec<String>, BackendError> {
        self.check_bucket().await
    }
}

/// An S3 client on `sdk`'s settings, with kcl-aws's timeouts where `sdk` sets none (15 s an
/// attempt, 30 s an operation) and path-style addressing (`http://host/bucket/key`) when an
/// endpoint is set (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`), as emulators need.
pub(crate) fn client(sdk: &SdkConfig) -> Client {
    let endpoint = sdk.endpoint_url().is_some()
        || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some_and(|v| !v.is_empty());
    let conf = aws_sdk_s3::config::Builder::from(sdk)
        .timeout_config(crate::timeouts::with_defaults(sdk, crate::timeouts::S3))
        .force_path_style(endpoint)
        .build();
    Client::from_conf(conf)
}

/// The object at `bucket`/`key`, whole.
pub(crate) async fn get(client: &Client, bucket: &str, key: &str) -> Result<Vec<u8>, BackendError> {
    let place = || format!("s3://{bucket}/{key}");
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| backend_error("get_object", place(), e))?;
    let body = out.body.collect().await.map_err(|e| {
        BackendError::new(
            ErrorKind::Retryable,
            "get_object",
            format!("{}: {e}", place()),
        )
    })?;
    Ok(body.into_bytes().to_vec())
}

/// Deletes the object at `bucket`/`key` (done if it is gone already).
pub(crate) async fn delete(client: &Client, bucket: &str, key: &str) -> Result<(), BackendError> {
    client
        .delete_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| backend_error("delete_object", format!("s3://{bucket}/{key}"), e))?;
    Ok(())
}

/// Every letter under `prefix` in `bucket` (objects whose key ends in `.json`).
pub(crate) async fn list(
    client: &Client,
    bucket: &str,
    prefix: &str,
) -> Result<Listing, BackendError> {
    let mut listing = Listing::default();
    let mut token: Option<String> = None;
    loop {
        let out = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|e| backend_error("list_objects_v2", format!("s3://{bucket}/{prefix}"), e))?;
        for key in out.contents().iter().filter_map(|o| o.key()) {
            if !key.ends_with(".json") {
                continue;
            }
            let at = At::S3 {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            };
            match from_json(&get(client, bucket, key).await?) {
                Ok(letter) => listing.letters.push(Stored::new(letter, at)),
                Err(e) => listing.unreadable.push(Unreadable {
                    place: at.to_string(),
                    error: e.to_string(),
                    at: None,
                }),
            }
        }
        match out.next_continuation_token() {
            Some(next) if out.is_truncated() == Some(true) => token = Some(next.to_owned()),
            _ => break,
        }
    }
    Ok(listing)
}

/// The letter of a queue's message or a stream's record: itself, or read from the S3 object
/// it points to (then named in the answer).
pub(crate) async fn letter_of(
    client: &Client,
    body: &[u8],
) -> Result<(DeadLetter, Option<(String, String)>), String> {
    match decode_message(body).map_err(|e| e.to_string())? {
        Message::Letter(letter) => Ok((*letter, None)),
        Message::Pointer(pointer) => {
            let json = get(client, &pointer.bucket, &pointer.key)
                .await
                .map_err(|e| e.to_string())?;
            let letter = from_json(&json).map_err(|e| e.to_string())?;
            Ok((letter, Some((pointer.bucket, pointer.key))))
        }
    }
}
