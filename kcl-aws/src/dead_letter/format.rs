//! The JSON of a dead letter and of a pointer to one, version 1 (see the module docs).

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use kcl_core::failure::{DeadLetter, Reason};
use kcl_core::{ExtendedSequenceNumber, Record, SequenceNumber, ShardId, WorkerId};
use serde::{Deserialize, Serialize};

/// The format version written, and the only one read.
pub const VERSION: u64 = 1;

/// A letter or pointer that cannot be read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, or JSON of another shape.
    #[error("not a dead letter: {0}")]
    Json(#[from] serde_json::Error),
    /// A version this crate does not read.
    #[error("format version {0} is unknown to this kcl-aws (it reads version {VERSION})")]
    Version(u64),
    /// A field with a value that cannot be used.
    #[error("field `{field}`: {reason}")]
    Field {
        /// The field, as named in the JSON.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A pointer to a letter stored in S3, where a letter was expected.
    #[error("a pointer to s3://{bucket}/{key}, not a letter")]
    Pointer {
        /// The bucket.
        bucket: String,
        /// The object's key.
        key: String,
    },
}

/// What identifies a dead letter, and is written `shard/sequence/subsequence`: the record's
/// shard, sequence number and sub-sequence number (0 unless it came out of a KPL aggregate).
/// Letters put twice for one record have the same id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LetterId {
    /// The shard the record was read from.
    pub shard: String,
    /// The record's position in it.
    pub position: ExtendedSequenceNumber,
}

impl LetterId {
    /// The id of `letter`.
    pub fn of(letter: &DeadLetter) -> Self {
        Self {
            shard: letter.shard.to_string(),
            position: letter.record.position(),
        }
    }
}

impl fmt::Display for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ExtendedSequenceNumber {
            sequence,
            sub_sequence,
        } = &self.position;
        write!(f, "{}/{sequence}/{sub_sequence}", self.shard)
    }
}

impl FromStr for LetterId {
    type Err = DecodeError;

    /// Reads `shard/sequence/subsequence`; `shard/sequence` means sub-sequence 0.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| DecodeError::Field {
            field: "id",
            reason: format!("`{s}`: {reason} (expected shard/sequence/subsequence)"),
        };
        let mut parts = s.split('/');
        let (Some(shard), Some(sequence)) = (parts.next(), parts.next()) else {
            return Err(invalid("no sequence number"));
        };
        let sub_sequence = match parts.next() {
            Some(sub) => sub
                .parse()
                .map_err(|_| invalid("the sub-sequence number is not a number"))?,
            None => 0,
        };
        if parts.next().is_some() || shard.is_empty() {
            return Err(invalid("not three parts"));
        }
        let sequence =
            SequenceNumber::parse(sequence).ok_or_else(|| invalid("not a sequence number"))?;
        Ok(Self {
            shard: shard.to_owned(),
            position: ExtendedSequenceNumber {
                sequence,
                sub_sequence,
            },
        })
    }
}

/// Where a letter too large for its queue or stream was stored: an S3 object, whose key is
/// the one [`S3Sink`](super::S3Sink) would give the letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// The letter's id.
    pub id: LetterId,
    /// The bucket.
    pub bucket: String,
    /// The object's key.
    pub key: String,
    /// The letter's size in bytes (its JSON).
    pub size: u64,
}

/// A message of a queue or stream of dead letters: a letter, or a pointer to one in S3.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Message {
    /// The letter itself.
    Letter(Box<DeadLetter>),
    /// Where the letter is.
    Pointer(Pointer),
}

#[derive(Serialize, Deserialize)]
struct WireLetter {
    version: u64,
    application: Option<String>,
    stream: Option<String>,
    worker: String,
    shard: String,
    record: WireRecord,
    attempts: u32,
    first_error: String,
    last_error: String,
    first_failed: DateTime<Utc>,
    dead_lettered: DateTime<Utc>,
    reason: WireReason,
    parked_key: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct WireRecord {
    sequence_number: String,
    sub_sequence_number: u64,
    partition_key: String,
    explicit_hash_key: Option<String>,
    approximate_arrival: DateTime<Utc>,
    data: String,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireReason {
    Attempts,
    Age,
    Permanent,
    Parked {
        behind: WirePosition,
    },
    /// A reason of a newer kcl-core than this format knows: written, never read back.
    Other {
        description: String,
    },
}

#[derive(Serialize, Deserialize)]
struct WirePosition {
    sequence_number: String,
    sub_sequence_number: u64,
}

#[derive(Serialize, Deserialize)]
struct WirePointer {
    version: u64,
    id: String,
    pointer: WireLocation,
    size: u64,
}

#[derive(Serialize, Deserialize)]
struct WireLocation {
    bucket: String,
    key: String,
}

/// The `kind` tag of `reason` in the JSON (`attempts`, `age`, `permanent`, `parked`).
pub(crate) fn reason_kind(reason: &Reason) -> &'static str {
    match reason {
        Reason::Attempts => "attempts",
        Reason::Age => "age",
        Reason::Permanent => "permanent",
        Reason::Parked { .. } => "parked",
        _ => "other",
    }
}

/// `letter` as JSON, version 1, on one line.
pub fn to_json(letter: &DeadLetter) -> String {
    let record = &letter.record;
    let reason = match &letter.reason {
        Reason::Attempts => WireReason::Attempts,
        Reason::Age => WireReason::Age,
        Reason::Permanent => WireReason::Permanent,
        Reason::Parked { behind } => WireReason::Parked {
            behind: WirePosition {
                sequence_number: behind.sequence.to_string(),
                sub_sequence_number: behind.sub_sequence,
            },
        },
        other => WireReason::Other {
            description: other.to_string(),
        },
    };
    let wire = WireLetter {
        version: VERSION,
        application: letter.application.clone(),
        stream: letter.stream.clone(),
        worker: letter.worker.to_string(),
        shard: letter.shard.to_string(),
        record: WireRecord {
            sequence_number: record.sequence_number.to_string(),
            sub_sequence_number: record.sub_sequence_number,
            partition_key: record.partition_key.clone(),
            explicit_hash_key: record.explicit_hash_key.clone(),
            approximate_arrival: record.approximate_arrival,
            data: BASE64.encode(&record.data),
        },
        attempts: letter.attempts,
        first_error: letter.first_error.clone(),
        last_error: letter.last_error.clone(),
        first_failed: letter.first_failed,
        dead_lettered: letter.dead_lettered,
        reason,
        parked_key: letter.parked_key.clone(),
    };
    // Strings, numbers and timestamps only: serializing cannot fail.
    serde_json::to_string(&wire).unwrap_or_default()
}

/// The pointer to `letter`, stored as `s3://bucket/key`, as JSON on one line.
pub(crate) fn pointer_json(letter: &DeadLetter, bucket: &str, key: &str, size: usize) -> String {
    let wire = WirePointer {
        version: VERSION,
        id: LetterId::of(letter).to_string(),
        pointer: WireLocation {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        },
        size: u64::try_from(size).unwrap_or(u64::MAX),
    };
    serde_json::to_string(&wire).unwrap_or_default()
}

/// Reads a letter written by [`to_json`]. A pointer is an error ([`DecodeError::Pointer`]).
pub fn from_json(json: &[u8]) -> Result<DeadLetter, DecodeError> {
    match decode_message(json)? {
        Message::Letter(letter) => Ok(*letter),
        Message::Pointer(p) => Err(DecodeError::Pointer {
            bucket: p.bucket,
            key: p.key,
        }),
    }
}

/// Reads a message of a dead-letter queue or stream: a letter or a pointer to one.
pub fn decode_message(json: &[u8]) -> Result<Message, DecodeError> {
    let value: serde_json::Value = serde_json::from_slice(json)?;
    let version = value.get("version").and_then(serde_json::Value::as_u64);
    match version {
        Some(VERSION) => {}
        Some(other) => return Err(DecodeError::Version(other)),
        None => {
            return Err(DecodeError::Field {
                field: "version",
                reason: "missing, or not a number".into(),
            });
        }
    }
    if value.get("pointer").is_some() {
        let wire: WirePointer = serde_json::from_value(value)?;
        return Ok(Message::Pointer(Pointer {
            id: wire.id.parse()?,
            bucket: wire.pointer.bucket,
            key: wire.pointer.key,
            size: wire.size,
        }));
    }
    let wire: WireLetter = serde_json::from_value(value)?;
    Ok(Message::Letter(Box::new(letter(wire)?)))
}

fn sequence(field: &'static str, value: &str) -> Result<SequenceNumber, DecodeError> {
    SequenceNumber::parse(value).ok_or_else(|| DecodeError::Field {
        field,
        reason: format!("`{value}` is not a sequence number"),
    })
}

fn letter(wire: WireLetter) -> Result<DeadLetter, DecodeError> {
    let r = wire.record;
    let data = BASE64
        .decode(r.data.as_bytes())
        .map_err(|e| DecodeError::Field {
            field: "record.data",
            reason: format!("not base64: {e}"),
        })?;
    let mut record = Record::new(
        sequence("record.sequence_number", &r.sequence_number)?,
        r.partition_key,
        data,
    )
    .with_sub_sequence_number(r.sub_sequence_number)
    .with_approximate_arrival(r.approximate_arrival);
    record.explicit_hash_key = r.explicit_hash_key;
    let reason = match wire.reason {
        WireReason::Attempts => Reason::Attempts,
        WireReason::Age => Reason::Age,
        WireReason::Permanent => Reason::Permanent,
        WireReason::Parked { behind } => Reason::Parked {
            behind: ExtendedSequenceNumber {
                sequence: sequence("reason.behind.sequence_number", &behind.sequence_number)?,
                sub_sequence: behind.sub_sequence_number,
            },
        },
        WireReason::Other { description } => {
            return Err(DecodeError::Field {
                field: "reason",
                reason: format!("a reason this kcl-aws does not know ({description})"),
            });
        }
    };
    let mut letter = DeadLetter::new(
        WorkerId::new(wire.worker),
        ShardId::new(wire.shard),
        record,
        reason,
    );
    letter.application = wire.application;
    letter.stream = wire.stream;
    letter.attempts = wire.attempts;
    letter.first_error = wire.first_error;
    letter.last_error = wire.last_error;
    letter.first_failed = wire.first_failed;
    letter.dead_lettered = wire.dead_lettered;
    letter.parked_key = wire.parked_key;
    Ok(letter)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use chrono::TimeZone as _;

    use super::*;

    pub(crate) fn sample(reason: Reason) -> DeadLetter {
        let at = |s: i64| Utc.timestamp_opt(1_700_000_000 + s, 123_456_789).unwrap();
        let record = Record::new(
            SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898")
                .unwrap(),
            "user-7",
            vec![0u8, 159, 146, 150, b'\n', 255],
        )
        .with_sub_sequence_number(3)
        .with_approximate_arrival(at(0))
        .with_explicit_hash_key("1234");
        let mut letter = DeadLetter::new(
            WorkerId::new("worker-a"),
            ShardId::new("shardId-000000000001"),
            record,
            reason,
        );
        letter.application = Some("orders-app".into());
        letter.stream = Some("orders".into());
        letter.attempts = 3;
        letter.first_error = "timeout \"quoted\"".into();
        letter.last_error = "refused: é ✓".into();
        letter.first_failed = at(5);
        letter.dead_lettered = at(9);
        letter.parked_key = Some("user-7".into());
        letter
    }

    #[test]
    fn every_field_and_reason_round_trips() {
        let behind = ExtendedSequenceNumber {
            sequence: SequenceNumber::from(42u128),
            sub_sequence: 1,
        };
        for reason in [
            Reason::Attempts,
            Reason::Age,
            Reason::Permanent,
            Reason::Parked { behind },
        ] {
            let letter = sample(reason);
            let json = to_json(&letter);
            assert!(!json.contains('\n'), "one line: {json}");
            assert_eq!(from_json(json.as_bytes()).unwrap(), letter, "{json}");
        }
    }

    #[test]
    fn the_json_is_the_documented_one() {
        let json: serde_json::Value =
            serde_json::from_str(&to_json(&sample(Reason::Attempts))).unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["reason"], serde_json::json!({"kind": "attempts"}));
        assert_eq!(json["record"]["data"], "AJ+Slgr/");
        assert_eq!(json["record"]["sub_sequence_number"], 3);
        assert_eq!(
            json["record"]["approximate_arrival"],
            "2023-11-14T22:13:20.123456789Z"
        );
    }

    #[test]
    fn pointers_ids_and_versions() {
        let letter = sample(Reason::Age);
        let json = pointer_json(&letter, "b", "dlq/orders/x.json", 300_000);
        let Message::Pointer(p) = decode_message(json.as_bytes()).unwrap() else {
            unreachable!("a pointer")
        };
        assert_eq!(
            (p.bucket.as_str(), p.key.as_str()),
            ("b", "dlq/orders/x.json")
        );
        assert_eq!(p.id, LetterId::of(&letter));
        assert!(matches!(
            from_json(json.as_bytes()),
            Err(DecodeError::Pointer { .. })
        ));
        let id = LetterId::of(&letter).to_string();
        assert_eq!(
            id,
            "shardId-000000000001/49590338271490256608559692538361571095921575989136588898/3"
        );
        assert_eq!(id.parse::<LetterId>().unwrap(), LetterId::of(&letter));
        assert!("shard".parse::<LetterId>().is_err());
        assert!("s/12x/0".parse::<LetterId>().is_err());
        assert!(matches!(
            decode_message(br#"{"version": 2}"#),
            Err(DecodeError::Version(2))
        ));
    }
}
