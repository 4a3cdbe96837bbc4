//! [`SqsSink`]: one message per letter, S3 for letters over the message limit; and reading a
//! queue's letters back without deleting them.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageAttributeValue;
use kcl_core::failure::{DeadLetter, DeadLetterSink};
use kcl_core::{BackendError, ErrorKind};
use md5::{Digest as _, Md5};

use super::S3Sink;
use super::format::{LetterId, pointer_json, reason_kind, to_json};
use super::s3;
use super::stored::{At, Listing, Stored, Unreadable};
use crate::error::backend_error;

/// The classic SQS message limit, 256 KiB (queues may now allow up to 1 MiB).
pub const DEFAULT_MESSAGE_LIMIT: usize = 256 * 1024;

/// The most characters of a FIFO queue's deduplication id.
const MAX_DEDUPLICATION_ID: usize = 128;

/// A [`DeadLetterSink`] that sends each letter to an SQS queue as one message: the letter's
/// JSON as the body, and message attributes to filter on without reading the body
/// (`kcl.shard`, `kcl.sequence_number`, `kcl.sub_sequence_number`, `kcl.partition_key`,
/// `kcl.reason`, `kcl.body` = `letter` or `pointer`).
///
/// A letter whose message (body and attributes) would be over the limit
/// ([`DEFAULT_MESSAGE_LIMIT`] unless [`with_message_limit`](Self::with_message_limit) says
/// otherwise) is written to S3 by the [overflow sink](Self::with_overflow), and the message is
/// a pointer to it (`{"version":1,"id":…,"pointer":{"bucket":…,"key":…},"size":…}`). Without
/// an overflow sink such a letter is refused with a [`ErrorKind::Fatal`] error, which the
/// worker retries for ever: give queues an overflow sink unless records are small.
///
/// On a FIFO queue (its URL ends in `.fifo`) each message's group is the shard and its
/// deduplication id the letter's id (`shard/sequence/subsequence`, hashed if over 128
/// characters), so a letter put twice within SQS's five-minute window is kept once. On a
/// standard queue a letter put twice is two messages with the same id: readers see both.
#[derive(Debug, Clone)]
pub struct SqsSink {
    client: Client,
    queue_url: String,
    fifo: bool,
    limit: usize,
    overflow: Option<S3Sink>,
}

impl SqsSink {
    /// A sink on the queue at `queue_url`, with the credentials, region, retries and endpoint
    /// (`AWS_ENDPOINT_URL_SQS`) of `sdk`, and kcl-aws's timeouts where `sdk` sets none (5 s
    /// an attempt, 15 s an operation).
    pub fn new(sdk: &SdkConfig, queue_url: impl Into<String>) -> Self {
        Self::from_client(client(sdk), queue_url)
    }

    /// A sink using an already built client.
    pub fn from_client(client: Client, queue_url: impl Into<String>) -> Self {
        let queue_url = queue_url.into();
        Self {
            client,
            fifo: queue_url.ends_with(".fifo"),
            queue_url,
            limit: DEFAULT_MESSAGE_LIMIT,
            overflow: None,
        }
    }

    /// Letters over the message limit go to `s3` (at the key it gives them), and the message
    /// points there.
    #[must_use]
    pub fn with_overflow(mut self, s3: S3Sink) -> Self {
        self.overflow = Some(s3);
        self
    }

    /// The largest message sent, body and attributes, in bytes (the queue's
    /// `MaximumMessageSize`).
    #[must_use]
    pub fn with_message_limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    async fn send(
        &self,
        letter: &DeadLetter,
        body: String,
        attributes: HashMap<String, MessageAttributeValue>,
    ) -> Result<(), BackendError> {
        let id = LetterId::of(letter).to_string();
        let mut request = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .set_message_attributes(Some(attributes));
        if self.fifo {
            request = request
                .message_group_id(letter.shard.as_str())
                .message_deduplication_id(deduplication_id(&id));
        }
        request
            .send()
            .await
            .map_err(|e| backend_error("send_message", format!("queue {}", self.queue_url), e))?;
        Ok(())
    }
}

impl DeadLetterSink for SqsSink {
    async fn put(&self, letter: &DeadLetter) -> Result<(), BackendError> {
        let json = sqs_safe(to_json(letter));
        let whole = attributes(letter, "letter")?;
        let size = json.len() + size_of(&whole);
        if size <= self.limit {
            return self.send(letter, json, whole).await;
        }
        let Some(s3) = &self.overflow else {
            let message = format!(
                "dead letter {} is {size} bytes, over the queue's limit of {} bytes, and the \
                 sink has no S3 overflow (SqsSink::with_overflow)",
                LetterId::of(letter),
                self.limit
            );
            return Err(BackendError::new(ErrorKind::Fatal, "send_message", message));
        };
        let length = json.len();
        let key = s3.store(letter, json).await?;
        let pointer = pointer_json(letter, s3.bucket(), &key, length);
        self.send(letter, pointer, attributes(letter, "pointer")?)
            .await
    }
}

/// An SQS client on `sdk`'s settings, with kcl-aws's timeouts where `sdk` sets none.
pub(crate) fn client(sdk: &SdkConfig) -> Client {
    let conf = aws_sdk_sqs::config::Builder::from(sdk)
        .timeout_config(crate::timeouts::with_defaults(sdk, crate::timeouts::SQS))
        .build();
    Client::from_conf(conf)
}

/// `json` with the two characters SQS refuses in a body and JSON allows unescaped (U+FFFE,
/// U+FFFF, only ever inside strings) escaped.
fn sqs_safe(json: String) -> String {
    if json.contains(['\u{fffe}', '\u{ffff}']) {
        json.replace('\u{fffe}', "\\ufffe")
            .replace('\u{ffff}', "\\uffff")
    } else {
        json
    }
}

/// The letter's id as a deduplication id: itself, or its MD5 in hex if too long.
fn deduplication_id(id: &str) -> String {
    if id.len() <= MAX_DEDUPLICATION_ID {
        return id.to_owned();
    }
    Md5::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The message attributes of `letter`'s message (`body`: `letter` or `pointer`).
fn attributes(
    letter: &DeadLetter,
    body: &str,
) -> Result<HashMap<String, MessageAttributeValue>, BackendError> {
    let record = &letter.record;
    let reason = reason_kind(&letter.reason);
    let pairs = [
        ("kcl.shard", letter.shard.to_string()),
        ("kcl.sequence_number", record.sequence_number.to_string()),
        (
            "kcl.sub_sequence_number",
            record.sub_sequence_number.to_string(),
        ),
        ("kcl.partition_key", record.partition_key.clone()),
        ("kcl.reason", reason.to_owned()),
        ("kcl.body", body.to_owned()),
    ];
    let mut attributes = HashMap::new();
    // SQS refuses an empty attribute value.
    for (name, value) in pairs.into_iter().filter(|(_, v)| !v.is_empty()) {
        let value = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(sqs_safe(value))
            .build()
            .map_err(|e| BackendError::new(ErrorKind::Fatal, "send_message", e.to_string()))?;
        attributes.insert(name.to_owned(), value);
    }
    Ok(attributes)
}

/// What message attributes count towards a message's size: names, types and values.
fn size_of(attributes: &HashMap<String, MessageAttributeValue>) -> usize {
    attributes
        .iter()
        .map(|(name, value)| {
            name.len() + value.data_type().len() + value.string_value().map_or(0, str::len)
        })
        .sum()
}

/// Receives every message of `queue_url` (each hidden from other readers for `visibility`
/// once received, and never deleted), following pointers into S3.
pub(crate) async fn list(
    sqs: &Client,
    s3: &aws_sdk_s3::Client,
    queue_url: &str,
    visibility: Duration,
    wait: Duration,
) -> Result<Listing, BackendError> {
    let seconds = |d: Duration| i32::try_from(d.as_secs()).unwrap_or(i32::MAX);
    // By message id: a message received again (its visibility ran out) keeps its newest
    // receipt handle, which deletes it.
    let mut received: HashMap<String, (String, String)> = HashMap::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(seconds(visibility).max(1))
            .wait_time_seconds(seconds(wait).min(20))
            .send()
            .await
            .map_err(|e| backend_error("receive_message", format!("queue {queue_url}"), e))?;
        let mut new = 0;
        for message in out.messages() {
            let (Some(id), Some(receipt)) = (message.message_id(), message.receipt_handle()) else {
                continue;
            };
            let body = message.body().unwrap_or_default().to_owned();
            if received
                .insert(id.to_owned(), (receipt.to_owned(), body))
                .is_none()
            {
                new += 1;
            }
        }
        if new == 0 {
            break;
        }
    }
    let mut listing = Listing::default();
    for (message_id, (receipt_handle, body)) in received {
        match s3::letter_of(s3, body.as_bytes()).await {
            Ok((letter, object)) => {
                let at = At::Sqs {
                    message_id,
                    receipt_handle,
                    object,
                };
                listing.letters.push(Stored::new(letter, at));
            }
            Err(error) => listing.unreadable.push(Unreadable {
                place: format!("sqs message {message_id}"),
                error,
                at: Some(At::Sqs {
                    message_id,
                    receipt_handle,
                    object: None,
                }),
            }),
        }
    }
    Ok(listing)
}

/// Deletes a message received by [`list`], then the object it points to, if any.
pub(crate) async fn delete(
    sqs: &Client,
    s3: &aws_sdk_s3::Client,
    queue_url: &str,
    at: &At,
) -> Result<(), BackendError> {
    let At::Sqs {
        receipt_handle,
        object,
        ..
    } = at
    else {
        return Ok(());
    };
    sqs.delete_message()
        .queue_url(queue_url)
        .receipt_handle(receipt_handle)
        .send()
        .await
        .map_err(|e| backend_error("delete_message", format!("queue {queue_url}"), e))?;
    // The object after the message: a failure here leaves an object nothing points to,
    // never a pointer to nothing.
    if let Some((bucket, key)) = object {
        s3::delete(s3, bucket, key).await?;
    }
    Ok(())
}

/// Makes a message received by [`list`] visible to other readers again, at once.
pub(crate) async fn release(sqs: &Client, queue_url: &str, at: &At) -> Result<(), BackendError> {
    let At::Sqs { receipt_handle, .. } = at else {
        return Ok(());
    };
    sqs.change_message_visibility()
        .queue_url(queue_url)
        .receipt_handle(receipt_handle)
        .visibility_timeout(0)
        .send()
        .await
        .map_err(|e| backend_error("change_message_visibility", format!("queue {queue_url}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deduplication_ids_fit() {
        let short =
            "shardId-000000000001/49590338271490256608559692538361571095921575989136588898/0";
        assert_eq!(deduplication_id(short), short);
        let long = format!("{}/1/0", "s".repeat(200));
        assert_eq!(deduplication_id(&long).len(), 32);
        assert_eq!(sqs_safe("a\u{ffff}".into()), "a\\uffff");
    }
}
