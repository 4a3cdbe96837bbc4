//! [`SqsSink`]: one message per letter, S3 for letters over the message limit (reading a
//! queue's letters back is in `sqs_read`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_config::SdkConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use kcl_core::failure::{DeadLetter, DeadLetterSink, RETENTION_FLOOR};
use kcl_core::{BackendError, ErrorKind};
use md5::{Digest as _, Md5};

use super::S3Sink;
use super::check::{days, refused};
use super::format::{LetterId, pointer_json, reason_kind, to_json};
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
/// An attribute value with characters SQS refuses in text (control characters but tab, line
/// feed and carriage return; U+FFFE, U+FFFF) is sent as a `Binary.utf8` attribute holding its
/// UTF-8 bytes, so that every partition key is carried (readers read the body, which JSON
/// escapes).
///
/// On a FIFO queue (its URL ends in `.fifo`) each message's deduplication id is the letter's
/// id (`shard/sequence/subsequence`, hashed if over 128 characters), so a letter put twice
/// within SQS's five-minute window is kept once (with the queue's default deduplication
/// scope), and each message has a group of its own (`kcl-letter-…`): SQS hides a group's
/// later messages while one of it is received and not deleted, so letters sharing a group
/// could not all be held by a reader at once. On a standard queue a letter put twice is two
/// messages with the same id: readers see both.
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
                .message_group_id(own_group(&id))
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

    async fn check(&self) -> Result<Vec<String>, BackendError> {
        self.check_queue().await
    }
}

impl SqsSink {
    /// [`DeadLetterSink::check`]: the queue exists (`GetQueueAttributes`) and keeps messages
    /// at least [`RETENTION_FLOOR`]; the overflow bucket is reachable.
    async fn check_queue(&self) -> Result<Vec<String>, BackendError> {
        let url = &self.queue_url;
        let what = format!("the SQS queue {url}");
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::MessageRetentionPeriod)
            .send()
            .await
            .map_err(|e| {
                refused(
                    &backend_error("get_queue_attributes", &what, e),
                    &what,
                    "create it, or fix the dead-letter sink's queue URL",
                    "sqs:GetQueueAttributes",
                )
            })?;
        let mut warnings = Vec::new();
        let retention = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::MessageRetentionPeriod))
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(seconds) = retention.filter(|s| *s < RETENTION_FLOOR.as_secs()) {
            warnings.push(format!(
                "{what} keeps messages {} (MessageRetentionPeriod {seconds} s), less than the \
                 {} dead letters should be kept (RETENTION_FLOOR): a letter counted finished \
                 can expire before anyone redrives it; raise MessageRetentionPeriod (at most \
                 14 days, 1209600 s)",
                days(seconds),
                days(RETENTION_FLOOR.as_secs()),
            ));
        }
        if let Some(s3) = &self.overflow {
            warnings.extend(s3.check().await?);
        }
        Ok(warnings)
    }
}

/// An SQS client on `sdk`'s settings, with kcl-aws's timeouts where `sdk` sets none.
pub(crate) fn client(sdk: &SdkConfig) -> Client {
    let conf = aws_sdk_sqs::config::Builder::from(sdk)
        .timeout_config(crate::timeouts::with_defaults(sdk, crate::timeouts::SQS))
        .build();
    Client::from_conf(conf)
}

/// The group of a message of a FIFO queue: one of its own, `kcl-letter-` and an MD5 in hex
/// of `seed` (the letter's id, or the message it is a copy of), this process and the time.
pub(crate) fn own_group(seed: &str) -> String {
    static PUTS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let unique = format!(
        "{seed}/{}/{nanos}/{}",
        std::process::id(),
        PUTS.fetch_add(1, Ordering::Relaxed)
    );
    format!("{OWN_GROUP}{}", hex_md5(&unique))
}

/// How the groups of [`own_group`] start: a message in such a group is alone in it.
pub(crate) const OWN_GROUP: &str = "kcl-letter-";

fn hex_md5(text: &str) -> String {
    Md5::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
    hex_md5(id)
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
        attributes.insert(name.to_owned(), attribute(value)?);
    }
    Ok(attributes)
}

/// `value` as a `String` attribute, or, if it has characters SQS refuses in text, as a
/// `Binary.utf8` one holding its UTF-8 bytes.
fn attribute(value: String) -> Result<MessageAttributeValue, BackendError> {
    let builder = MessageAttributeValue::builder();
    let builder = if value.chars().all(sqs_allows) {
        builder.data_type("String").string_value(value)
    } else {
        builder
            .data_type(BINARY_UTF8)
            .binary_value(Blob::new(value.into_bytes()))
    };
    builder
        .build()
        .map_err(|e| BackendError::new(ErrorKind::Fatal, "send_message", e.to_string()))
}

/// The data type of an attribute whose text SQS refuses: its UTF-8 bytes.
pub(crate) const BINARY_UTF8: &str = "Binary.utf8";

/// Whether SQS takes `c` in a message's text: `#x9 | #xA | #xD | #x20-#xD7FF |
/// #xE000-#xFFFD | #x10000-#x10FFFF` (surrogates cannot be in a Rust string).
fn sqs_allows(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{fffd}' | '\u{10000}'..)
}

/// What message attributes count towards a message's size: names, types and values.
fn size_of(attributes: &HashMap<String, MessageAttributeValue>) -> usize {
    attributes
        .iter()
        .map(|(name, value)| {
            let bytes = value.binary_value().map_or(0, |b| b.as_ref().len());
            name.len() + value.data_type().len() + value.string_value().map_or(0, str::len) + bytes
        })
        .sum()
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
        assert!(own_group("x").starts_with(OWN_GROUP) && own_group("x").len() <= 128);
        assert_ne!(own_group("x"), own_group("x"));
    }

    /// Every partition key is carried: a key SQS refuses as text goes as its UTF-8 bytes,
    /// and no `String` value has a character SQS refuses.
    #[test]
    fn attributes_carry_keys_with_control_characters() {
        let mut letter = super::super::format::tests::sample(kcl_core::failure::Reason::Attempts);
        for key in [
            "a\u{1}b\u{1f}",
            "\u{0}",
            "x\u{b}\u{c}\u{e}",
            "z\u{fffe}\u{ffff}",
        ] {
            key.clone_into(&mut letter.record.partition_key);
            let all = attributes(&letter, "letter").unwrap_or_default();
            for value in all.values() {
                let text = value.string_value().unwrap_or_default();
                assert!(text.chars().all(sqs_allows), "{key:?}: {value:?}");
            }
            let carried = &all["kcl.partition_key"];
            assert_eq!(carried.data_type(), BINARY_UTF8);
            assert_eq!(
                carried.binary_value().map(|b| b.as_ref()),
                Some(key.as_bytes())
            );
        }
        "tab\there é".clone_into(&mut letter.record.partition_key);
        let all = attributes(&letter, "letter").unwrap_or_default();
        assert_eq!(all["kcl.partition_key"].string_value(), Some("tab\there é"));
    }
}
