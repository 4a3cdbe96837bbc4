//! A stream record both ways: written into a kcl [`Record`] as the Java adapter's JSON (so
//! processors written for the adapter, and `kcl-multilang`'s clients, read what they did),
//! and read back as a typed [`Change`] with the SDK's attribute values.
//!
//! Attribute values cross JSON through `serde_dynamo` (DynamoDB JSON: `{"S": "…"}`,
//! `{"N": "…"}`, `{"B": base64}`, …), never by hand.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodbstreams::types::{self as sdk, Identity, OperationType, StreamViewType};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use kcl_core::{Record, SequenceNumber};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// An item, its keys or one of its images, in the SDK's attribute values.
pub type Item = HashMap<String, sdk::AttributeValue>;

/// One change to one item: a typed view of a record read from a
/// [`DynamoDbStreamsSource`](super::DynamoDbStreamsSource).
///
/// ```
/// # fn demo(record: &kcl_core::Record) -> Result<(), kcl_aws::streams::ChangeError> {
/// use kcl_aws::streams::Change;
/// use aws_sdk_dynamodbstreams::types::OperationType;
///
/// let change = Change::parse(record)?;
/// if change.event == OperationType::Remove && change.is_ttl_deletion() {
///     // expired, not deleted by a user
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The record's unique id (`eventID`).
    pub event_id: String,
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event: OperationType,
    /// The item's primary key attributes.
    pub keys: Item,
    /// The item after the change, if the stream's view type includes it.
    pub new_image: Option<Item>,
    /// The item before the change, if the stream's view type includes it.
    pub old_image: Option<Item>,
    /// The record's sequence number, as the stream gives it (also the kcl record's).
    pub sequence_number: String,
    /// When the change was made, to the second (`ApproximateCreationDateTime`).
    pub approximate_creation: DateTime<Utc>,
    /// The size of the stream record in bytes, as the stream reports it.
    pub size_bytes: Option<i64>,
    /// The stream's view type: which images records carry.
    pub view_type: Option<StreamViewType>,
    /// Who made the change, when it was the service: `type` `Service` and principal
    /// `dynamodb.amazonaws.com` for a deletion by Time to Live.
    pub user_identity: Option<Identity>,
}

/// A record that is not a DynamoDB stream record in the adapter's JSON, or an image that
/// does not fit the type asked for.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The record's data is not a stream record.
    #[error("record {sequence} is not a DynamoDB stream record: {source}")]
    NotAChange {
        /// The record's sequence number.
        sequence: String,
        /// Why it could not be read.
        #[source]
        source: serde_json::Error,
    },
    /// An image does not deserialize into the type asked for.
    #[error("the {image} of record {sequence} does not fit: {source}")]
    Image {
        /// `new image` or `old image`.
        image: &'static str,
        /// The record's sequence number.
        sequence: String,
        /// What serde_dynamo reported.
        #[source]
        source: serde_dynamo::Error,
    },
}

impl Change {
    /// Reads `record`'s data, as a `DynamoDbStreamsSource` (or the Java adapter) wrote it.
    pub fn parse(record: &Record) -> Result<Self, ChangeError> {
        let wire: Wire =
            serde_json::from_slice(&record.data).map_err(|source| ChangeError::NotAChange {
                sequence: record.sequence_number.to_string(),
                source,
            })?;
        let d = wire.dynamodb;
        let approximate_creation = d
            .approximate_creation_date_time
            .and_then(DateTime::from_timestamp_millis)
            .unwrap_or(record.approximate_arrival);
        Ok(Self {
            event_id: wire.event_id.unwrap_or_default(),
            event: OperationType::from(wire.event_name.as_str()),
            keys: d.keys.map(to_sdk).unwrap_or_default(),
            new_image: d.new_image.map(to_sdk),
            old_image: d.old_image.map(to_sdk),
            sequence_number: d.sequence_number,
            approximate_creation,
            size_bytes: d.size_bytes,
            view_type: d.stream_view_type.as_deref().map(StreamViewType::from),
            user_identity: wire.user_identity.map(|i| {
                Identity::builder()
                    .set_principal_id(i.principal_id)
                    .set_type(i.kind)
                    .build()
            }),
        })
    }

    /// Whether Time to Live deleted the item (not a user or an application).
    pub fn is_ttl_deletion(&self) -> bool {
        self.event == OperationType::Remove
            && self.user_identity.as_ref().is_some_and(|i| {
                i.r#type() == Some("Service") && i.principal_id() == Some("dynamodb.amazonaws.com")
            })
    }

    /// The item as the change leaves it (its new image; its old one for a removal) as plain
    /// JSON ([`to_json`]); `None` if the stream's records carry neither image (`KEYS_ONLY`).
    ///
    /// It never fails, whatever the item's shape: a processor can print, forward or park any
    /// item of the table, and type the ones it knows with [`new_image_as`](Self::new_image_as)
    /// as a second step, without one odd item failing its shard.
    pub fn item_json(&self) -> Option<Value> {
        let (first, second) = if self.event == OperationType::Remove {
            (&self.old_image, &self.new_image)
        } else {
            (&self.new_image, &self.old_image)
        };
        first.as_ref().or(second.as_ref()).map(to_json)
    }

    /// The new image as a `T` (through `serde_dynamo`); `None` without one.
    pub fn new_image_as<T: DeserializeOwned>(&self) -> Result<Option<T>, ChangeError> {
        self.image_as("new image", self.new_image.as_ref())
    }

    /// The old image as a `T` (through `serde_dynamo`); `None` without one.
    pub fn old_image_as<T: DeserializeOwned>(&self) -> Result<Option<T>, ChangeError> {
        self.image_as("old image", self.old_image.as_ref())
    }

    fn image_as<T: DeserializeOwned>(
        &self,
        image: &'static str,
        item: Option<&Item>,
    ) -> Result<Option<T>, ChangeError> {
        item.map(|item| {
            serde_dynamo::aws_sdk_dynamodbstreams_1::from_item(item.clone()).map_err(|source| {
                ChangeError::Image {
                    image,
                    sequence: self.sequence_number.clone(),
                    source,
                }
            })
        })
        .transpose()
    }
}

/// An item (or keys, or an image) as plain JSON: strings, booleans, null, lists and maps as
/// themselves; numbers as JSON numbers when they fit one exactly (integers in 64 bits,
/// decimals an `f64` writes back the same), otherwise as the string DynamoDB holds, so no
/// digit is lost; sets as arrays; binary values as base64 strings. Map keys are sorted.
pub fn to_json(item: &Item) -> Value {
    Value::Object(
        item.iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &sdk::AttributeValue) -> Value {
    use base64::Engine as _;
    use sdk::AttributeValue as A;
    let base64 = |b: &aws_smithy_types::Blob| {
        Value::String(base64::engine::general_purpose::STANDARD.encode(b.as_ref()))
    };
    match v {
        A::S(s) => Value::String(s.clone()),
        A::N(n) => number_json(n),
        A::Bool(b) => Value::Bool(*b),
        A::B(b) => base64(b),
        A::Ss(set) => set.iter().cloned().map(Value::String).collect(),
        A::Ns(set) => set.iter().map(|n| number_json(n)).collect(),
        A::Bs(set) => set.iter().map(base64).collect(),
        A::L(list) => list.iter().map(value_json).collect(),
        A::M(map) => to_json(map),
        // `Null`, and a type newer than this SDK.
        _ => Value::Null,
    }
}

/// A DynamoDB number (up to 38 digits) as a JSON number if one holds it exactly.
fn number_json(n: &str) -> Value {
    if let Ok(i) = n.parse::<i64>() {
        return i.into();
    }
    if let Ok(u) = n.parse::<u64>() {
        return u.into();
    }
    match n.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
        Some(f) if f.to_string() == n => Value::Number(f),
        _ => Value::String(n.to_owned()),
    }
}

/// The adapter's JSON, as read back.
#[derive(Deserialize)]
struct Wire {
    #[serde(rename = "eventID")]
    event_id: Option<String>,
    #[serde(rename = "eventName")]
    event_name: String,
    dynamodb: WireRecord,
    #[serde(rename = "userIdentity")]
    user_identity: Option<WireIdentity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireRecord {
    approximate_creation_date_time: Option<i64>,
    keys: Option<HashMap<String, serde_dynamo::AttributeValue>>,
    new_image: Option<HashMap<String, serde_dynamo::AttributeValue>>,
    old_image: Option<HashMap<String, serde_dynamo::AttributeValue>>,
    sequence_number: String,
    size_bytes: Option<i64>,
    stream_view_type: Option<String>,
}

#[derive(Deserialize)]
struct WireIdentity {
    #[serde(rename = "principalId")]
    principal_id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

fn to_sdk(item: HashMap<String, serde_dynamo::AttributeValue>) -> Item {
    item.into_iter().map(|(k, v)| (k, v.into())).collect()
}

/// A stream record as a kcl record; `None` without a sequence number. Its partition key is
/// the item's key in canonical JSON (attributes sorted), so that `kcl_core::Parallel`
/// orders records per item.
pub(super) fn record(r: &sdk::Record) -> Option<Record> {
    let change = r.dynamodb.as_ref()?;
    let sequence = SequenceNumber::parse(change.sequence_number.as_deref()?)?;
    let created = change
        .approximate_creation_date_time
        .and_then(|t| DateTime::from_timestamp_millis(t.to_millis().ok()?))
        .unwrap_or_else(Utc::now);
    let keys = change.keys.as_ref().map(item);
    let partition_key = keys.as_ref().map(Value::to_string).unwrap_or_default();
    let data = adapter_json(r, change, keys, created);
    Some(
        Record::new(sequence, partition_key, Bytes::from(data.to_string()))
            .with_approximate_arrival(created),
    )
}

/// The record as the Java adapter's JSON (its creation time in epoch milliseconds).
fn adapter_json(
    r: &sdk::Record,
    change: &sdk::StreamRecord,
    keys: Option<Value>,
    created: DateTime<Utc>,
) -> Value {
    let mut dynamodb = Map::new();
    dynamodb.insert(
        "ApproximateCreationDateTime".into(),
        json!(created.timestamp_millis()),
    );
    if let Some(keys) = keys {
        dynamodb.insert("Keys".into(), keys);
    }
    for (name, image) in [
        ("NewImage", &change.new_image),
        ("OldImage", &change.old_image),
    ] {
        if let Some(image) = image {
            dynamodb.insert(name.into(), item(image));
        }
    }
    dynamodb.insert("SequenceNumber".into(), json!(change.sequence_number));
    if let Some(size) = change.size_bytes {
        dynamodb.insert("SizeBytes".into(), json!(size));
    }
    if let Some(view) = &change.stream_view_type {
        dynamodb.insert("StreamViewType".into(), json!(view.as_str()));
    }
    let mut out = Map::new();
    let mut put = |k: &str, v: Option<&str>| {
        if let Some(v) = v {
            out.insert(k.into(), json!(v));
        }
    };
    put("eventID", r.event_id.as_deref());
    put(
        "eventName",
        r.event_name.as_ref().map(OperationType::as_str),
    );
    put("eventVersion", r.event_version.as_deref());
    put("eventSource", r.event_source.as_deref());
    put("awsRegion", r.aws_region.as_deref());
    out.insert("dynamodb".into(), Value::Object(dynamodb));
    if let Some(identity) = &r.user_identity {
        out.insert(
            "userIdentity".into(),
            json!({"principalId": identity.principal_id, "type": identity.r#type}),
        );
    }
    Value::Object(out)
}

/// An item (keys or an image) in DynamoDB JSON, its attributes sorted by name. An attribute
/// of a type this SDK does not know is left out (`serde_dynamo` panics on one).
fn item(attributes: &Item) -> Value {
    let sorted: BTreeMap<&String, Value> = attributes
        .iter()
        .filter(|(name, v)| {
            let known = known(v);
            if !known {
                tracing::warn!(attribute = %name, "an attribute of a type this SDK does not know is left out of the record");
            }
            known
        })
        .map(|(k, v)| {
            let value = serde_dynamo::AttributeValue::from(v.clone());
            (k, serde_json::to_value(value).unwrap_or(Value::Null))
        })
        .collect();
    serde_json::to_value(sorted).unwrap_or(Value::Null)
}

/// Whether `value` holds no variant this SDK does not know.
fn known(value: &sdk::AttributeValue) -> bool {
    match value {
        sdk::AttributeValue::M(map) => map.values().all(known),
        sdk::AttributeValue::L(list) => list.iter().all(known),
        other => !other.is_unknown(),
    }
}
