//! What the lease table costs: requests and capacity units, by operation.
//!
//! The lease table is billed per request unit, so its bill follows from how often each
//! operation runs and how large the rows are. Both [`LeaseStore`](super::LeaseStore)
//! implementations count every request that reaches the table in a [`Usage`]: the in-memory
//! store computes the units DynamoDB would charge for the rows it touched (see
//! [`read_units`], [`write_units`] and [`item_size`]), the DynamoDB store records what
//! DynamoDB reports as consumed. [`Usage::record`] also feeds the
//! [`REQUESTS`](crate::metrics::STORE_REQUESTS) and capacity counters, so the bill of a running
//! fleet can be read off its metrics; [`LeaseStoreExtras::usage`](super::LeaseStoreExtras::usage) gives
//! the totals to code (benchmarks, tests of the request bound).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::Lease;
use crate::metrics;

/// A lease-table operation, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Creating or describing the table (control plane: no capacity units).
    EnsureTable,
    /// Reading every lease (a consistent Scan).
    List,
    /// Reading every lease cheaply (an eventually consistent Scan).
    Snapshot,
    /// Reading the table's change feed (DynamoDB Streams `GetRecords`, and the calls that
    /// find its shards): billed per request, not per row.
    ReadChanges,
    /// Reading one lease.
    Get,
    /// Reading one lease cheaply (an eventually consistent `GetItem`).
    Peek,
    /// Reading which leases name one owner (an index query).
    OwnedBy,
    /// Creating a lease.
    Create,
    /// Renewing a held lease.
    Renew,
    /// Taking a lease.
    Take,
    /// Releasing a held lease.
    Release,
    /// Asking for, or declining, a handoff.
    RequestHandoff,
    /// Writing a checkpoint.
    Checkpoint,
    /// An operator's reset (`kcl-admin reset`): a take and a checkpoint in one write.
    Reset,
    /// Deleting a lease.
    Delete,
    /// Removing parked-key entries (`kcl-admin dead-letters redrive`, or the holder after a
    /// redrive).
    Unpark,
    /// Asking a parked key's holder to replay its letters (`kcl-admin dead-letters redrive`).
    RequestRedrive,
    /// A processor's outputs committed with a checkpoint in one transaction
    /// ([`Transact::commit`](crate::outputs::Transact::commit)): on DynamoDB two write units
    /// per KB of each item written, the lease row's included.
    CommitOutputs,
}

impl Operation {
    /// Every operation, in order.
    pub const ALL: [Self; 18] = [
        Self::EnsureTable,
        Self::List,
        Self::Snapshot,
        Self::ReadChanges,
        Self::Get,
        Self::Peek,
        Self::OwnedBy,
        Self::Create,
        Self::Renew,
        Self::Take,
        Self::Release,
        Self::RequestHandoff,
        Self::Checkpoint,
        Self::Reset,
        Self::Delete,
        Self::Unpark,
        Self::RequestRedrive,
        Self::CommitOutputs,
    ];

    /// The name used in metric labels and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EnsureTable => "ensure_table",
            Self::List => "list",
            Self::Snapshot => "snapshot",
            Self::ReadChanges => "read_changes",
            Self::Get => "get",
            Self::Peek => "peek",
            Self::OwnedBy => "owned_by",
            Self::Create => "create",
            Self::Renew => "renew",
            Self::Take => "take",
            Self::Release => "release",
            Self::RequestHandoff => "request_handoff",
            Self::Checkpoint => "checkpoint",
            Self::Reset => "reset",
            Self::Delete => "delete",
            Self::Unpark => "unpark",
            Self::RequestRedrive => "request_redrive",
            Self::CommitOutputs => "commit_outputs",
        }
    }

    /// Whether the operation reads rows (its units are read units).
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Self::List
                | Self::Snapshot
                | Self::ReadChanges
                | Self::Get
                | Self::Peek
                | Self::OwnedBy
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Requests and capacity units of one operation, or of several summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Requests that reached the table (including those whose condition failed).
    pub requests: u64,
    /// Rows (or index entries) the reads returned.
    pub rows: u64,
    /// Read capacity units consumed.
    pub read_units: f64,
    /// Write capacity units consumed.
    pub write_units: f64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Self) {
        self.requests += other.requests;
        self.rows += other.rows;
        self.read_units += other.read_units;
        self.write_units += other.write_units;
    }
}

/// Counts of lease-table requests by operation. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    tallies: Arc<Mutex<BTreeMap<Operation, Tally>>>,
}

impl Usage {
    /// Counts one request of `operation` that consumed `read_units` and `write_units` (zero
    /// where unknown), here and in the metrics.
    pub fn record(&self, operation: Operation, read_units: f64, write_units: f64) {
        self.record_read(operation, 0, read_units, write_units);
    }

    /// As [`record`](Self::record), for a read that returned `rows` rows.
    pub fn record_read(&self, operation: Operation, rows: u64, read_units: f64, write_units: f64) {
        let (read_before, write_before, read_after, write_after) = {
            let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
            let tally = tallies.entry(operation).or_default();
            let before = (tally.read_units, tally.write_units);
            *tally += Tally {
                requests: 1,
                rows,
                read_units,
                write_units,
            };
            (before.0, before.1, tally.read_units, tally.write_units)
        };
        let op = operation.as_str();
        ::metrics::counter!(metrics::STORE_REQUESTS, "operation" => op).increment(1);
        // Counters are whole numbers: each moves by the whole units this request completed,
        // so over time the counter tracks the exact total to within one unit.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // whole, ≥ 0, < 2^53
        let whole = |before: f64, after: f64| (after.floor() - before.floor()).max(0.0) as u64;
        let read = whole(read_before, read_after);
        if read > 0 {
            ::metrics::counter!(metrics::STORE_READ_UNITS, "operation" => op).increment(read);
        }
        let write = whole(write_before, write_after);
        if write > 0 {
            ::metrics::counter!(metrics::STORE_WRITE_UNITS, "operation" => op).increment(write);
        }
    }

    /// The counts so far, by operation.
    pub fn by_operation(&self) -> BTreeMap<Operation, Tally> {
        self.tallies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The counts so far, all operations summed.
    pub fn total(&self) -> Tally {
        let mut total = Tally::default();
        for tally in self.by_operation().into_values() {
            total += tally;
        }
        total
    }

    /// The counts of one operation so far.
    pub fn of(&self, operation: Operation) -> Tally {
        self.by_operation()
            .get(&operation)
            .copied()
            .unwrap_or_default()
    }
}

/// DynamoDB's read units for reading `bytes` in one request: 4 KiB per unit, rounded up,
/// halved when eventually consistent; at least one (half) unit.
pub fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

/// DynamoDB's write units for writing an item of `bytes` (the larger of its size before and
/// after): 1 KiB per unit, rounded up, at least one. A write whose condition fails costs the
/// same.
pub fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// The size DynamoDB would bill for `lease`'s row in KCL Java's schema: attribute names plus
/// values (strings their length, numbers about one byte per two digits), plus a few bytes per
/// attribute.
pub fn item_size(lease: &Lease) -> usize {
    const HASH_KEY_DIGITS: usize = 39; // 2^128 has 39 decimal digits
    fn text(name: &str, value: &str) -> usize {
        name.len() + value.len() + 3
    }
    fn number(name: &str, value: u64) -> usize {
        let digits = value.checked_ilog10().map_or(1, |d| d as usize + 1);
        name.len() + digits.div_ceil(2) + 2
    }
    let ids = |ids: &[crate::ShardId]| ids.iter().map(|id| id.as_str().len() + 1).sum::<usize>();
    let mut size = text("leaseKey", lease.key.as_str())
        + number("leaseCounter", lease.counter)
        + text("checkpoint", lease.checkpoint.as_str())
        + number(
            "checkpointSubSequenceNumber",
            lease.checkpoint.sub_sequence(),
        )
        + number(
            "ownerSwitchesSinceCheckpoint",
            lease.owner_switches_since_checkpoint,
        );
    if let Some(owner) = &lease.owner {
        size += text("leaseOwner", owner.as_str());
    }
    if let Some(pending) = &lease.pending_checkpoint {
        size += text("pendingCheckpoint", pending.as_str());
    }
    if let Some(to) = &lease.handoff_to {
        size += text("handoffTo", to.as_str());
    }
    if !lease.parent_shard_ids.is_empty() {
        size += "parentShardId".len() + ids(&lease.parent_shard_ids) + 3;
    }
    if !lease.child_shard_ids.is_empty() {
        size += "childShardIds".len() + ids(&lease.child_shard_ids) + 3;
    }
    if lease.hash_key_range.is_some() {
        size += "startingHashKey".len() + "endingHashKey".len() + 2 * (HASH_KEY_DIGITS + 3);
    }
    if lease.start_timestamp.is_some() {
        size += number("startingTimestamp", 1_800_000_000_000);
    }
    if let Some(grace) = lease.restart_grace {
        let millis = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        size += number("restartGraceMillis", millis);
    }
    // Up to 2 KB while records wait past the checkpoint (see `ack::SparseAcks`).
    if let Some(acked) = &lease.acked {
        size += text("kclAcked", acked);
    }
    size + kcl_attributes(lease)
}

/// The size of kcl's own attributes other than `kclAcked`, as [`item_size`] counts.
fn kcl_attributes(lease: &Lease) -> usize {
    let text = |name: &str, value: &str| name.len() + value.len() + 3;
    let number = |name: &str, value: u64| {
        let digits = value.checked_ilog10().map_or(1, |d| d as usize + 1);
        name.len() + digits.div_ceil(2) + 2
    };
    let mut size = 0;
    if let Some(fence) = lease.fence {
        size += number("kclFence", fence.0);
    }
    for (name, value) in [
        ("kclEndpoint", &lease.endpoint),
        ("kclSignals", &lease.signals),
    ] {
        size += value.as_deref().map_or(0, |v| text(name, v));
    }
    if let Some(carrier) = &lease.carrier {
        size += text("kclCarrier", carrier.as_str());
    }
    if !lease.parked_keys.is_empty() {
        let entries: usize = lease.parked_keys.iter().map(|k| k.len() + 1).sum();
        size += "parkedKeys".len() + entries + 3;
    }
    if let Some(load) = &lease.load {
        size += number("kclLoad", load.milli.into())
            + number("kclCapacity", load.capacity_milli.into());
        if let Some(flow) = &load.flow {
            size += text("kclFlow", &flow.encode());
        }
    }
    size
}

/// Registers the lease table's request and capacity counters, one series per
/// [`Operation`] (at zero on the first call), and keeps them fresh beside the worker's own
/// (`metrics::refresh_worker_series`).
pub(crate) fn refresh_series() {
    for operation in Operation::ALL {
        let op = operation.as_str();
        ::metrics::counter!(metrics::STORE_REQUESTS, "operation" => op).increment(0);
        let units = if operation.is_read() {
            metrics::STORE_READ_UNITS
        } else {
            metrics::STORE_WRITE_UNITS
        };
        if operation != Operation::EnsureTable {
            ::metrics::counter!(units, "operation" => op).increment(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checkpoint, ShardId};

    #[test]
    fn units_follow_dynamodbs_rounding() {
        assert_eq!(read_units(1, true), 1.0);
        assert_eq!(read_units(4096, true), 1.0);
        assert_eq!(read_units(4097, true), 2.0);
        assert_eq!(read_units(10_000, false), 1.5);
        assert_eq!(write_units(300), 1.0);
        assert_eq!(write_units(1025), 2.0);
    }

    #[test]
    fn a_typical_row_is_a_few_hundred_bytes() {
        let mut lease = Lease::new(
            ShardId::from("shardId-000000000042"),
            Checkpoint::TrimHorizon,
        );
        lease.owner = Some(crate::WorkerId::from("worker-7f3a9c"));
        lease.counter = 123_456;
        let size = item_size(&lease);
        assert!((120..400).contains(&size), "{size} bytes");
    }

    #[test]
    fn usage_sums_by_operation() {
        let usage = Usage::default();
        usage.record(Operation::List, 3.0, 0.0);
        usage.record(Operation::Renew, 0.0, 1.0);
        let shared = usage.clone();
        shared.record(Operation::Renew, 0.0, 1.0);
        assert_eq!(usage.of(Operation::Renew).requests, 2);
        let total = usage.total();
        assert_eq!(
            (total.requests, total.read_units, total.write_units),
            (3, 3.0, 2.0)
        );
    }
}
