//! The lease table's schema: attribute names, condition expressions, and row ⇄ [`Lease`].
//!
//! Names and types are KCL Java's (`DynamoDBLeaseSerializer`), so a fleet moving from KCL Java
//! keeps its checkpoints and could move back: `leaseKey` S (hash key), `leaseOwner` S (absent
//! when unowned), `leaseCounter` N, `checkpoint` S (a sequence number or a sentinel),
//! `checkpointSubSequenceNumber` N, `ownerSwitchesSinceCheckpoint` N, `parentShardId` SS
//! (singular, as KCL Java names it), `childShardIds` SS, `pendingCheckpoint` S,
//! `pendingCheckpointSubSequenceNumber` N, `startingHashKey` / `endingHashKey` S (decimal).
//! `handoffTo` S, `startingTimestamp` N (epoch milliseconds), `kclEndpoint` S, `parkedKeys`
//! SS, `restartGraceMillis` N (a duration) and `kclAcked` S are our own additions; KCL Java
//! ignores them.
//!
//! Every expression refers to attributes through `#name` placeholders (the placeholder is the
//! attribute name behind a `#`), because some of them, such as `owner` and `checkpoint`-like
//! words, collide with DynamoDB's reserved words.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use kcl_core::lease::load::Flow;
use kcl_core::multi_stream::StreamId;
use kcl_core::{Checkpoint, FencingToken, HashKeyRange, Lease, LeaseLoad, ShardId, WorkerId};

use crate::error::ParseError;

/// Hash key: the shard id (`S`).
pub(crate) const LEASE_KEY: &str = "leaseKey";
/// The owning worker (`S`); absent when nobody owns the lease.
pub(crate) const LEASE_OWNER: &str = "leaseOwner";
/// The fencing counter (`N`).
pub(crate) const LEASE_COUNTER: &str = "leaseCounter";
/// A sequence number or `TRIM_HORIZON` / `LATEST` / `AT_TIMESTAMP` / `SHARD_END` (`S`).
pub(crate) const CHECKPOINT: &str = "checkpoint";
/// KPL sub-sequence number of the checkpoint (`N`).
pub(crate) const CHECKPOINT_SUB_SEQUENCE_NUMBER: &str = "checkpointSubSequenceNumber";
/// Owner changes since the last checkpoint (`N`).
pub(crate) const OWNER_SWITCHES_SINCE_CHECKPOINT: &str = "ownerSwitchesSinceCheckpoint";
/// Parent shards (`SS`; singular name, as KCL Java writes it).
pub(crate) const PARENT_SHARD_ID: &str = "parentShardId";
/// Child shards, written at shard end (`SS`).
pub(crate) const CHILD_SHARD_IDS: &str = "childShardIds";
/// A prepared, uncommitted checkpoint (`S`).
pub(crate) const PENDING_CHECKPOINT: &str = "pendingCheckpoint";
/// Sub-sequence number of the pending checkpoint (`N`).
pub(crate) const PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER: &str =
    "pendingCheckpointSubSequenceNumber";
/// KCL Java's application state of a pending checkpoint (`B`); removed with the pending
/// checkpoint, as KCL Java does, and otherwise left alone.
pub(crate) const PENDING_CHECKPOINT_STATE: &str = "pendingCheckpointState";
/// KCL Java 3.x graceful-handoff marker (`S`). KCL Java's assignment removes it; so does
/// [`take`](kcl_core::LeaseStore::take), so that a KCL Java worker could renew the lease again.
pub(crate) const CHECKPOINT_OWNER: &str = "checkpointOwner";
/// KCL Java 3.5: what a row of the lease table holds (`S`): `LEASE`, or one of its other
/// entities kept in the same table (`WORKER_METRIC_STATS` rows keyed by worker id, `LEADER`,
/// `CLIENT_VERSION_MIGRATION`, `TABLE_MIGRATION`, `STREAM`). Leases written before 3.5 have
/// none.
pub(crate) const ENTITY_TYPE: &str = "entityType";
/// The [`ENTITY_TYPE`] of a lease.
pub(crate) const ENTITY_LEASE: &str = "LEASE";
/// First hash key of the shard, decimal (`S`).
pub(crate) const STARTING_HASH_KEY: &str = "startingHashKey";
/// Last hash key of the shard, decimal (`S`).
pub(crate) const ENDING_HASH_KEY: &str = "endingHashKey";
/// kcl extension: the worker that asked the owner to hand the lease over (`S`).
pub(crate) const HANDOFF_TO: &str = "handoffTo";
/// kcl extension: where a lease whose checkpoint is still `LATEST` or `AT_TIMESTAMP` starts
/// reading, in milliseconds since the Unix epoch (`N`); see
/// [`Lease::start_timestamp`](kcl_core::Lease::start_timestamp). KCL Java ignores it.
pub(crate) const START_TIMESTAMP: &str = "startingTimestamp";
/// Where a singleton's holder takes messages (kcl extension).
pub(crate) const ENDPOINT: &str = "kclEndpoint";
/// kcl extension: on a role row, the row whose renewals prove its holder alive (`S`; see
/// `Lease::carrier`).
pub(crate) const CARRIER: &str = "kclCarrier";
/// kcl extension: ordering keys parked behind a dead-lettered record (a string set; see
/// `Lease::parked_keys`).
pub(crate) const PARKED_KEYS: &str = "parkedKeys";
/// kcl extension: what the lease costs its holder, in thousandths (`N`; see
/// `kcl_core::lease::load`), written with renewals and checkpoints.
pub(crate) const LOAD: &str = "kclLoad";
/// kcl extension: the holder's declared capacity, in thousandths (`N`), written with `kclLoad`.
pub(crate) const CAPACITY: &str = "kclCapacity";
/// kcl extension: how records arrive at the shard and are read (`S`, four numbers, see
/// `kcl_core::lease::load::Flow`), written with `kclLoad`.
pub(crate) const FLOW: &str = "kclFlow";
/// kcl extension: the leader's fleet signals (`S`, see `kcl_core::FleetSignals::encode`), on
/// the fleet-signals row only.
pub(crate) const SIGNALS: &str = "kclSignals";
/// kcl extension: the fencing token of the tenure that took the row last (`N`, the counter
/// that take wrote; see `kcl_core::FencingToken`). Written by kcl's takes and resets, left
/// alone by renewals and checkpoints, and by KCL Java, which keeps attributes it does not
/// know.
pub(crate) const FENCE: &str = "kclFence";
/// kcl extension: the records past the checkpoint that finished already (`S`, see
/// `kcl_core::ack::SparseAcks`): the next holder does not deliver them again. Written with
/// every kcl checkpoint write (removed when none), read only with the checkpoint it was
/// written with: KCL Java leaves it on the row when it moves the checkpoint, and the value
/// is then stale and ignored.
pub(crate) const ACKED: &str = "kclAcked";
/// kcl extension: the lease is kept through its owner's restart, and others wait this many
/// milliseconds longer than the failover time before taking it (`N`; see
/// `Lease::restart_grace`). A duration, never a time. KCL Java ignores it (and its takes
/// leave it; kcl's takes and releases remove it).
pub(crate) const RESTART_GRACE: &str = "restartGraceMillis";
/// KCL Java's multi-stream rows: the stream (`account:stream:creationEpoch`; "streamName"
/// for historical reasons).
pub(crate) const STREAM_NAME: &str = "streamName";
/// KCL Java's multi-stream rows: the shard id without its stream.
pub(crate) const SHARD_ID: &str = "shardId";
/// The global secondary index from `leaseOwner` to `leaseKey` (keys only), as KCL Java 3.x
/// creates it: workers that do not read the whole table find their own leases with it.
pub(crate) const OWNER_INDEX: &str = "LeaseOwnerToLeaseKeyIndex";

/// `create`: no row with this key yet.
pub(crate) const COND_ABSENT: &str = "attribute_not_exists(#leaseKey)";
/// Writes by or against an owner: counter and owner as observed.
pub(crate) const COND_OWNED: &str = "#leaseCounter = :counter AND #leaseOwner = :owner";
/// Writes against an unowned lease: counter as observed and still no owner.
pub(crate) const COND_UNOWNED: &str =
    "#leaseCounter = :counter AND attribute_not_exists(#leaseOwner)";
/// `request_handoff`: the owner as observed (the counter moves with every renewal).
pub(crate) const COND_OWNER: &str = "#leaseOwner = :owner";
/// `request_handoff` against an unowned lease.
pub(crate) const COND_NO_OWNER: &str = "attribute_not_exists(#leaseOwner)";
/// `delete`: nobody wrote the row since it was read.
pub(crate) const COND_COUNTER: &str = "#leaseCounter = :counter";

/// Value placeholder of the observed counter.
pub(crate) const VAL_COUNTER: &str = ":counter";
/// Value placeholder of the observed owner.
pub(crate) const VAL_OWNER: &str = ":owner";

/// The `#name` placeholder of an attribute.
pub(crate) fn placeholder(attribute: &str) -> String {
    format!("#{attribute}")
}

/// The condition that the row is as `observed` saw it (owner and counter), with its values.
pub(crate) fn held_condition(
    observed: &Lease,
) -> (&'static str, Vec<(&'static str, AttributeValue)>) {
    let counter = (VAL_COUNTER, number(observed.counter));
    match &observed.owner {
        Some(owner) => (
            COND_OWNED,
            vec![
                counter,
                (VAL_OWNER, AttributeValue::S(owner.as_str().to_owned())),
            ],
        ),
        None => (COND_UNOWNED, vec![counter]),
    }
}

/// A DynamoDB number.
pub(crate) fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

/// A string set; `None` for an empty list (DynamoDB has no empty sets).
pub(crate) fn string_set(ids: &[ShardId]) -> Option<AttributeValue> {
    (!ids.is_empty())
        .then(|| AttributeValue::Ss(ids.iter().map(|s| s.as_str().to_owned()).collect()))
}

/// The parent or child ids of lease `key` as KCL Java stores them: in a multi-stream row,
/// without the stream (KCL Java keys the related leases by its own stream), so that a table
/// moves between KCL Java and kcl either way.
pub(crate) fn related_set(key: &ShardId, ids: &[ShardId]) -> Option<AttributeValue> {
    let Some((stream, _)) = StreamId::split_key(key) else {
        return string_set(ids);
    };
    let stored: Vec<ShardId> = ids
        .iter()
        .map(|id| match StreamId::split_key(id) {
            Some((s, shard)) if s == stream => shard,
            _ => id.clone(),
        })
        .collect();
    string_set(&stored)
}

/// The ids stored by [`related_set`], with the stream of a multi-stream lease put back.
fn related_ids(key: &ShardId, stored: Vec<ShardId>) -> Vec<ShardId> {
    let Some((stream, _)) = StreamId::split_key(key) else {
        return stored;
    };
    stored
        .into_iter()
        .map(|id| {
            if StreamId::split_key(&id).is_some() {
                id
            } else {
                stream.lease_key(&id)
            }
        })
        .collect()
}

/// The full item `create` writes: every attribute of `lease` that has a value.
pub(crate) fn to_item(lease: &Lease) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::new();
    let mut put = |name: &str, value: AttributeValue| {
        item.insert(name.to_owned(), value);
    };
    put(LEASE_KEY, AttributeValue::S(lease.key.as_str().to_owned()));
    if let Some((stream, shard)) = StreamId::split_key(&lease.key) {
        put(STREAM_NAME, AttributeValue::S(stream.to_string()));
        put(SHARD_ID, AttributeValue::S(shard.as_str().to_owned()));
    }
    if let Some(owner) = &lease.owner {
        put(LEASE_OWNER, AttributeValue::S(owner.as_str().to_owned()));
    }
    put(LEASE_COUNTER, number(lease.counter));
    put(
        CHECKPOINT,
        AttributeValue::S(lease.checkpoint.as_str().to_owned()),
    );
    put(
        CHECKPOINT_SUB_SEQUENCE_NUMBER,
        number(lease.checkpoint.sub_sequence()),
    );
    put(
        OWNER_SWITCHES_SINCE_CHECKPOINT,
        number(lease.owner_switches_since_checkpoint),
    );
    if let Some(pending) = &lease.pending_checkpoint {
        put(
            PENDING_CHECKPOINT,
            AttributeValue::S(pending.as_str().to_owned()),
        );
        put(
            PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER,
            number(pending.sub_sequence()),
        );
    }
    if let Some(parents) = related_set(&lease.key, &lease.parent_shard_ids) {
        put(PARENT_SHARD_ID, parents);
    }
    if let Some(children) = related_set(&lease.key, &lease.child_shard_ids) {
        put(CHILD_SHARD_IDS, children);
    }
    if let Some(range) = lease.hash_key_range {
        put(
            STARTING_HASH_KEY,
            AttributeValue::S(range.start.to_string()),
        );
        put(ENDING_HASH_KEY, AttributeValue::S(range.end.to_string()));
    }
    // kcl's extensions.
    let text = |t: &str| AttributeValue::S(t.to_owned());
    for (name, value) in [
        (
            HANDOFF_TO,
            lease.handoff_to.as_ref().map(|to| text(to.as_str())),
        ),
        (START_TIMESTAMP, lease.start_timestamp.map(timestamp)),
        (ENDPOINT, lease.endpoint.as_deref().map(text)),
        (SIGNALS, lease.signals.as_deref().map(text)),
        (RESTART_GRACE, lease.restart_grace.map(millis)),
        (FENCE, lease.fence.map(|f| number(f.0))),
        (CARRIER, lease.carrier.as_ref().map(|c| text(c.as_str()))),
        (ACKED, lease.acked.as_deref().map(text)),
    ] {
        if let Some(value) = value {
            put(name, value);
        }
    }
    if !lease.parked_keys.is_empty() {
        put(PARKED_KEYS, AttributeValue::Ss(lease.parked_keys.clone()));
    }
    if let Some(load) = lease.load {
        put(LOAD, number(load.milli.into()));
        put(CAPACITY, number(load.capacity_milli.into()));
        if let Some(flow) = load.flow {
            put(FLOW, AttributeValue::S(flow.encode()));
        }
    }
    item
}

/// The load figure of a row: a hint for balancing, so a figure that does not parse (or is out
/// of range) is left out rather than making the row unreadable.
fn load(item: &Item) -> Option<LeaseLoad> {
    let figure = |name| {
        optional_n(item, name)
            .ok()
            .flatten()
            .and_then(|n| u32::try_from(n).ok())
    };
    let load = LeaseLoad::new(figure(LOAD)?, figure(CAPACITY).unwrap_or(1000));
    let flow = optional_s(item, FLOW).ok().flatten().and_then(Flow::decode);
    Some(match flow {
        Some(flow) => load.with_flow(flow),
        None => load,
    })
}

/// A duration as whole milliseconds (`N`).
pub(crate) fn millis(duration: std::time::Duration) -> AttributeValue {
    number(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// A timestamp as whole milliseconds since the Unix epoch, rounded down (a pin read back
/// never lies after the time it pins), never before the epoch.
pub(crate) fn timestamp(at: DateTime<Utc>) -> AttributeValue {
    number(u64::try_from(at.timestamp_millis()).unwrap_or(0))
}

/// The lease key of a row, if it has a readable one (for log lines about bad rows).
pub(crate) fn key_of(item: &HashMap<String, AttributeValue>) -> Option<&str> {
    item.get(LEASE_KEY)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// Whether `item` is a row of KCL Java 3.5 that is not a lease (an [`ENTITY_TYPE`] other than
/// `LEASE`): kcl skips it without a word, and never writes it.
pub(crate) fn is_foreign_entity(item: &HashMap<String, AttributeValue>) -> bool {
    item.get(ENTITY_TYPE)
        .and_then(|v| v.as_s().ok())
        .is_some_and(|t| t != ENTITY_LEASE)
}

/// Parses a row. Attributes we do not know are ignored (and kept in the table by our writes).
pub(crate) fn from_item(item: &HashMap<String, AttributeValue>) -> Result<Lease, ParseError> {
    let key = ShardId::new(required_s(item, LEASE_KEY)?);
    let parent_shard_ids = related_ids(&key, optional_ss(item, PARENT_SHARD_ID)?);
    let child_shard_ids = related_ids(&key, optional_ss(item, CHILD_SHARD_IDS)?);
    let counter = required_n(item, LEASE_COUNTER)?;
    let checkpoint = parse_checkpoint(
        item,
        CHECKPOINT,
        required_s(item, CHECKPOINT)?,
        CHECKPOINT_SUB_SEQUENCE_NUMBER,
    )?;
    let pending_checkpoint = optional_s(item, PENDING_CHECKPOINT)?
        .map(|p| {
            parse_checkpoint(
                item,
                PENDING_CHECKPOINT,
                p,
                PENDING_CHECKPOINT_SUB_SEQUENCE_NUMBER,
            )
        })
        .transpose()?;
    let hash_key_range = match (
        optional_s(item, STARTING_HASH_KEY)?,
        optional_s(item, ENDING_HASH_KEY)?,
    ) {
        (Some(start), Some(end)) => Some(HashKeyRange {
            start: parse_u128(STARTING_HASH_KEY, start)?,
            end: parse_u128(ENDING_HASH_KEY, end)?,
        }),
        _ => None,
    };
    let mut lease = Lease::new(key, checkpoint);
    lease.owner = optional_s(item, LEASE_OWNER)?.map(WorkerId::new);
    lease.counter = counter;
    lease.pending_checkpoint = pending_checkpoint;
    lease.owner_switches_since_checkpoint =
        optional_n(item, OWNER_SWITCHES_SINCE_CHECKPOINT)?.unwrap_or(0);
    lease.parent_shard_ids = parent_shard_ids;
    lease.child_shard_ids = child_shard_ids;
    lease.hash_key_range = hash_key_range;
    lease.handoff_to = optional_s(item, HANDOFF_TO)?.map(WorkerId::new);
    lease.start_timestamp = optional_n(item, START_TIMESTAMP)?
        .map(|ms| {
            i64::try_from(ms)
                .ok()
                .and_then(DateTime::from_timestamp_millis)
                .ok_or(ParseError::Invalid {
                    name: START_TIMESTAMP,
                    value: ms.to_string(),
                })
        })
        .transpose()?;
    lease.endpoint = optional_s(item, ENDPOINT)?.map(str::to_owned);
    lease.carrier = optional_s(item, CARRIER)?.map(ShardId::new);
    lease.signals = optional_s(item, SIGNALS)?.map(str::to_owned);
    lease.parked_keys = optional_ss(item, PARKED_KEYS)?
        .into_iter()
        .map(|entry| entry.as_str().to_owned())
        .collect();
    lease.load = load(item);
    lease.restart_grace = optional_n(item, RESTART_GRACE)?.map(std::time::Duration::from_millis);
    // Rewritten by the next take; a value that does not parse fails every commit's
    // condition, so it is no reason to leave the row unread.
    lease.fence = optional_n(item, FENCE).ok().flatten().map(FencingToken);
    // A hint like the load: a value of the wrong type is ignored (everything past the
    // checkpoint is delivered again), not a reason to leave the row unread.
    lease.acked = optional_s(item, ACKED).ok().flatten().map(str::to_owned);
    Ok(lease)
}

type Item = HashMap<String, AttributeValue>;

fn optional_s<'a>(item: &'a Item, name: &'static str) -> Result<Option<&'a str>, ParseError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(None),
        Some(AttributeValue::S(s)) => Ok(Some(s)),
        Some(_) => Err(ParseError::WrongType {
            name,
            expected: "S",
        }),
    }
}

fn required_s<'a>(item: &'a Item, name: &'static str) -> Result<&'a str, ParseError> {
    optional_s(item, name)?.ok_or(ParseError::Missing(name))
}

fn optional_n(item: &Item, name: &'static str) -> Result<Option<u64>, ParseError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(None),
        Some(AttributeValue::N(n)) => n.parse().map(Some).map_err(|_| ParseError::Invalid {
            name,
            value: n.clone(),
        }),
        Some(_) => Err(ParseError::WrongType {
            name,
            expected: "N",
        }),
    }
}

fn required_n(item: &Item, name: &'static str) -> Result<u64, ParseError> {
    optional_n(item, name)?.ok_or(ParseError::Missing(name))
}

fn optional_ss(item: &Item, name: &'static str) -> Result<Vec<ShardId>, ParseError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(Vec::new()),
        Some(AttributeValue::Ss(ids)) => {
            let mut ids: Vec<ShardId> = ids.iter().map(|s| ShardId::new(s.as_str())).collect();
            ids.sort();
            Ok(ids)
        }
        Some(_) => Err(ParseError::WrongType {
            name,
            expected: "SS",
        }),
    }
}

fn parse_checkpoint(
    item: &Item,
    name: &'static str,
    value: &str,
    sub_name: &'static str,
) -> Result<Checkpoint, ParseError> {
    let sub = optional_n(item, sub_name)?.unwrap_or(0);
    Checkpoint::parse(value, sub).ok_or_else(|| ParseError::Invalid {
        name,
        value: value.to_owned(),
    })
}

fn parse_u128(name: &'static str, value: &str) -> Result<u128, ParseError> {
    value.parse().map_err(|_| ParseError::Invalid {
        name,
        value: value.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use kcl_core::{ExtendedSequenceNumber, SequenceNumber};

    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    /// A row as KCL Java 3.1.3 wrote it (see the fixture in tests/fixtures).
    fn kcl_java_row() -> Item {
        [
            ("checkpoint", s("103")),
            ("checkpointSubSequenceNumber", n("0")),
            (
                "endingHashKey",
                s("170141183460469231731687303715884105727"),
            ),
            ("leaseCounter", n("6")),
            ("leaseKey", s("shardId-000000000000")),
            ("leaseOwner", s("kclj-worker-1")),
            ("ownerSwitchesSinceCheckpoint", n("0")),
            ("startingHashKey", s("0")),
            ("throughputKBps", n("0.48651")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    #[test]
    fn multi_stream_rows_are_kcl_javas_both_ways() {
        // As KCL Java's multi-stream serializer writes a child lease: the stream and the
        // shard in attributes of their own, the parent without its stream.
        let item: Item = [
            (
                "leaseKey",
                s("123456789012:orders:1700000000:shardId-000000000002"),
            ),
            ("leaseCounter", n("4")),
            ("checkpoint", s("TRIM_HORIZON")),
            ("streamName", s("123456789012:orders:1700000000")),
            ("shardId", s("shardId-000000000002")),
            (
                "parentShardId",
                AttributeValue::Ss(vec!["shardId-000000000000".into()]),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let lease = from_item(&item).unwrap();
        assert_eq!(
            lease.parent_shard_ids,
            [ShardId::new(
                "123456789012:orders:1700000000:shardId-000000000000"
            )],
            "the parent is the lease of the same stream"
        );
        let written = to_item(&lease);
        for attribute in [LEASE_KEY, STREAM_NAME, SHARD_ID, PARENT_SHARD_ID] {
            assert_eq!(written.get(attribute), item.get(attribute), "{attribute}");
        }
        // A single-stream row has neither attribute.
        let single = to_item(&Lease::new(
            ShardId::new("shardId-000000000002"),
            Checkpoint::TrimHorizon,
        ));
        assert!(!single.contains_key(STREAM_NAME) && !single.contains_key(SHARD_ID));
    }

    #[test]
    fn parses_a_kcl_java_row() {
        let lease = from_item(&kcl_java_row()).unwrap();
        assert_eq!(lease.key.as_str(), "shardId-000000000000");
        assert_eq!(lease.owner, Some(WorkerId::new("kclj-worker-1")));
        assert_eq!(lease.counter, 6);
        assert_eq!(
            lease.checkpoint,
            Checkpoint::Sequence(ExtendedSequenceNumber::new(
                SequenceNumber::parse("103").unwrap()
            ))
        );
        assert_eq!(
            lease.hash_key_range,
            Some(HashKeyRange {
                start: 0,
                end: u128::MAX / 2
            })
        );
        assert!(lease.parent_shard_ids.is_empty());
        assert_eq!(lease.handoff_to, None);
    }

    #[test]
    fn round_trips_every_field() {
        let mut lease = Lease::new(ShardId::new("shardId-000000000007"), Checkpoint::ShardEnd);
        lease.owner = Some(WorkerId::new("w1"));
        lease.counter = 42;
        lease.pending_checkpoint = Some(Checkpoint::Sequence(ExtendedSequenceNumber {
            sequence: SequenceNumber::parse("4959").unwrap(),
            sub_sequence: 3,
        }));
        lease.owner_switches_since_checkpoint = 2;
        lease.parent_shard_ids = vec![ShardId::new("a"), ShardId::new("b")];
        lease.child_shard_ids = vec![ShardId::new("c")];
        lease.hash_key_range = Some(HashKeyRange::FULL);
        lease.handoff_to = Some(WorkerId::new("w2"));
        lease.start_timestamp = DateTime::from_timestamp_millis(1_763_000_000_123);
        lease.restart_grace = Some(std::time::Duration::from_secs(60));
        let item = to_item(&lease);
        assert_eq!(item.get(RESTART_GRACE), Some(&n("60000")));
        lease.endpoint = Some("http://10.0.0.7:8125".to_owned());
        lease.parked_keys = vec!["00000000000000ab/4959/0".to_owned()];
        lease.carrier = Some(ShardId::new("shardId-000000000003"));
        lease.acked = Some("AToFlZVlnw".to_owned());
        let item = to_item(&lease);
        assert_eq!(
            item.get(ACKED),
            Some(&AttributeValue::S("AToFlZVlnw".into()))
        );
        assert_eq!(
            item.get(CARRIER),
            Some(&AttributeValue::S("shardId-000000000003".into()))
        );
        assert!(matches!(
            item.get(PARENT_SHARD_ID),
            Some(AttributeValue::Ss(_))
        ));
        assert_eq!(item.get(START_TIMESTAMP), Some(&n("1763000000123")));
        assert_eq!(from_item(&item).unwrap(), lease);
    }

    #[test]
    fn a_start_timestamp_is_stored_in_whole_milliseconds_rounded_down() {
        let at = DateTime::from_timestamp(1_763_000_000, 999_999_999).unwrap();
        assert_eq!(timestamp(at), n("1763000000999"));
        let pinned = DateTime::from_timestamp_millis(1_763_000_000_999).unwrap();
        assert!(
            pinned <= at,
            "a pin read back is never after the time it pins"
        );
    }

    #[test]
    fn rejects_missing_and_mistyped_attributes() {
        let mut row = kcl_java_row();
        row.remove(LEASE_COUNTER);
        assert_eq!(from_item(&row), Err(ParseError::Missing(LEASE_COUNTER)));
        let mut row = kcl_java_row();
        row.insert(LEASE_OWNER.to_owned(), n("1"));
        assert!(matches!(
            from_item(&row),
            Err(ParseError::WrongType {
                name: LEASE_OWNER,
                ..
            })
        ));
        let mut row = kcl_java_row();
        row.insert(CHECKPOINT.to_owned(), s("bogus"));
        assert!(matches!(
            from_item(&row),
            Err(ParseError::Invalid {
                name: CHECKPOINT,
                ..
            })
        ));
        assert_eq!(key_of(&row), Some("shardId-000000000000"));
    }
}
