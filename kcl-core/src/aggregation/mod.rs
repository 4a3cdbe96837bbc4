//! KPL aggregation: one Kinesis record carrying many user records.
//!
//! The Kinesis Producer Library packs user records into one Kinesis record: the magic bytes
//! `F3 89 9A C2`, a protobuf `AggregatedRecord` (a table of partition keys, a table of explicit
//! hash keys, and the records, each naming its keys by index), then the MD5 digest of the
//! protobuf bytes. [`deaggregate`] turns such a record back into its user records, each with
//! its own partition key and explicit hash key, the Kinesis record's sequence number and
//! arrival time, and its index in the aggregate as sub-sequence number, so that a processor
//! can checkpoint in the middle of an aggregate ([`ExtendedSequenceNumber`](crate::ExtendedSequenceNumber)).
//!
//! As KCL Java does: a record without the magic bytes is a user record itself; one with them
//! but nothing after them beyond a digest, a wrong digest or an unreadable body is passed
//! through whole, as it came. One deliberate difference: an aggregate whose user record names
//! a key index outside its tables, or an explicit hash key that is not a 128-bit number, is
//! also passed through whole, where KCL Java logs an error and drops that user record and
//! those after it; here nothing is lost, and the processor sees the record as it was written.
//!
//! **After a reshard**, also as KCL Java does (its `AggregatorUtil.deaggregate` with the
//! shard's hash-key range): an aggregate holding a user record whose hash key (the explicit
//! one, else the MD5 of its partition key) lies outside the shard's range is dropped whole,
//! with a warning and `kcl_aggregates_dropped_total`. Such an aggregate was put by a producer
//! whose shard map was stale; the KPL sees the record land in another shard than it predicted
//! and puts its user records again, so they arrive, in the right shards, a second time.
//! Producers that aggregate without that retry (other aggregation libraries) lose those
//! records under KCL Java and here alike: keep their shard maps current.

use bytes::Bytes;
use md5::{Digest, Md5};
use prost::Message;

use crate::types::{HashKeyRange, Record};

/// The first bytes of every aggregated record.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
const DIGEST_LEN: usize = 16;

/// The KPL's `AggregatedRecord` message.
#[derive(Clone, PartialEq, Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<UserRecord>,
}

/// One user record inside an [`AggregatedRecord`].
#[derive(Clone, PartialEq, Message)]
struct UserRecord {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(uint64, optional, tag = "2")]
    explicit_hash_key_index: Option<u64>,
    #[prost(bytes = "bytes", required, tag = "3")]
    data: Bytes,
}

/// Whether `data` starts with the aggregation magic bytes.
pub fn is_aggregated(data: &[u8]) -> bool {
    data.starts_with(&MAGIC)
}

/// Packs user records — `(partition key, explicit hash key, data)` — into one aggregated
/// record, as the KPL does: the tables in order of first use, then the digest. For tests and
/// simulations (feature `test-util`); the fixture's aggregates, made by the reference
/// library, come out byte for byte.
#[cfg(feature = "test-util")]
pub fn aggregate(records: &[(String, Option<String>, Bytes)]) -> Bytes {
    fn index(table: &mut Vec<String>, key: &str) -> u64 {
        let i = table.iter().position(|k| k == key).unwrap_or_else(|| {
            table.push(key.to_owned());
            table.len() - 1
        });
        u64::try_from(i).unwrap_or(u64::MAX)
    }
    let mut aggregate = AggregatedRecord {
        partition_key_table: Vec::new(),
        explicit_hash_key_table: Vec::new(),
        records: Vec::with_capacity(records.len()),
    };
    for (partition_key, hash_key, data) in records {
        let user = UserRecord {
            partition_key_index: index(&mut aggregate.partition_key_table, partition_key),
            explicit_hash_key_index: hash_key
                .as_deref()
                .map(|k| index(&mut aggregate.explicit_hash_key_table, k)),
            data: data.clone(),
        };
        aggregate.records.push(user);
    }
    let body = aggregate.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&body);
    out.extend_from_slice(&Md5::digest(&body));
    Bytes::from(out)
}

/// The user records in `record`, in order; `record` itself if it is not a valid aggregate.
/// No hash-key range is checked (see [`deaggregate_for_shard`]).
///
/// ```
/// use kcl_core::{Record, SequenceNumber, aggregation};
///
/// let plain = Record::new(SequenceNumber::from(7u128), "key", "not aggregated");
/// assert_eq!(aggregation::deaggregate(plain.clone()), vec![plain]);
/// ```
pub fn deaggregate(record: Record) -> Vec<Record> {
    deaggregate_in(record, None)
}

/// Every record of `records` read from a shard serving `range` (if known), deaggregated, in
/// order; aggregates with a user record outside `range` dropped (see the module docs).
pub fn deaggregate_for_shard(records: Vec<Record>, range: Option<&HashKeyRange>) -> Vec<Record> {
    if !records.iter().any(|r| is_aggregated(&r.data)) {
        return records;
    }
    records
        .into_iter()
        .flat_map(|r| deaggregate_in(r, range))
        .collect()
}

fn deaggregate_in(record: Record, range: Option<&HashKeyRange>) -> Vec<Record> {
    let Some(aggregate) = parse(&record.data) else {
        return vec![record];
    };
    let users = split(&record, aggregate);
    if let Some(range) = range
        && let Some(outside) = users
            .iter()
            .find(|u| !range.contains(effective_hash_key(u)))
    {
        tracing::warn!(
            sequence = %record.sequence_number,
            user_records = users.len(),
            partition_key = %outside.partition_key,
            "aggregated record with a user record outside this shard's hash-key range \
             (a producer's stale shard map): dropped whole, as KCL Java does"
        );
        ::metrics::counter!(crate::metrics::AGGREGATES_DROPPED).increment(1);
        return Vec::new();
    }
    users
}

/// Where Kinesis routes a user record: its explicit hash key, else the MD5 digest of its
/// partition key as a 128-bit number. (An explicit key that is not a number makes [`split`]
/// pass its aggregate through whole; it would count as 0 here.)
fn effective_hash_key(record: &Record) -> u128 {
    match &record.explicit_hash_key {
        Some(key) => key.parse().unwrap_or(0),
        None => u128::from_be_bytes(Md5::digest(record.partition_key.as_bytes()).into()),
    }
}

/// The aggregate in `data`, if it has the magic bytes, a non-empty body that decodes, and
/// the right digest; else `None`.
fn parse(data: &Bytes) -> Option<AggregatedRecord> {
    // More than a digest after the magic, as KCL Java requires: the magic and the digest of
    // an empty body alone are a user record, not an aggregate of none.
    if !is_aggregated(data) || data.len() <= MAGIC.len() + DIGEST_LEN {
        return None;
    }
    let (body, digest) = data[MAGIC.len()..].split_at(data.len() - MAGIC.len() - DIGEST_LEN);
    if Md5::digest(body).as_slice() != digest {
        tracing::debug!("aggregated record with a wrong digest: delivered whole");
        return None;
    }
    match AggregatedRecord::decode(data.slice(MAGIC.len()..data.len() - DIGEST_LEN)) {
        Ok(aggregate) => Some(aggregate),
        Err(error) => {
            tracing::warn!(%error, "aggregated record that does not decode: delivered whole");
            None
        }
    }
}

/// The user records of `aggregate`, stamped with `outer`'s sequence number and arrival.
/// A user record naming a key index outside the tables makes the whole aggregate pass
/// through undivided (the producer wrote something this format does not allow).
fn split(outer: &Record, aggregate: AggregatedRecord) -> Vec<Record> {
    let key = |table: &[String], index: u64| {
        usize::try_from(index)
            .ok()
            .and_then(|i| table.get(i))
            .cloned()
    };
    let mut records = Vec::with_capacity(aggregate.records.len());
    for (sub, user) in (0u64..).zip(aggregate.records) {
        let Some(partition_key) = key(&aggregate.partition_key_table, user.partition_key_index)
        else {
            tracing::warn!("aggregated record with a bad partition key index: delivered whole");
            return vec![outer.clone()];
        };
        let mut record = Record::new(outer.sequence_number.clone(), partition_key, user.data)
            .with_sub_sequence_number(sub)
            .with_approximate_arrival(outer.approximate_arrival);
        if let Some(index) = user.explicit_hash_key_index {
            let Some(hash_key) = key(&aggregate.explicit_hash_key_table, index)
                .filter(|k| k.parse::<u128>().is_ok())
            else {
                tracing::warn!(
                    "aggregated record with a bad explicit hash key or index: delivered whole"
                );
                return vec![outer.clone()];
            };
            record = record.with_explicit_hash_key(hash_key);
        }
        records.push(record);
    }
    records
}

#[cfg(test)]
mod tests;
