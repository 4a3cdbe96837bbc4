//! Identifiers and values that travel through the whole crate.
//!
//! Ids are newtypes so that a shard id can never be passed where a worker id is expected.
//! Sequence numbers are kept as the decimal strings Kinesis returns (they exceed `u128`) and
//! compared numerically, which is what every checkpoint rule depends on.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use chrono::{DateTime, Utc};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

string_id!(
    /// A Kinesis shard id, e.g. `shardId-000000000003`. Also the lease key.
    ShardId
);
string_id!(
    /// The identity of one worker process; the `leaseOwner` of the leases it holds.
    WorkerId
);
string_id!(
    /// An enhanced fan-out consumer of a stream, as the source names it once registered (its
    /// ARN on Kinesis); see [`ShardSource::subscribe`](crate::ShardSource::subscribe).
    ConsumerId
);

impl WorkerId {
    /// `<hostname>-<pid>-<4 random hex digits>`, the default id of a worker: readable in
    /// the lease table (on Kubernetes the hostname is the pod's name, on ECS the task's) and
    /// unique even where every container runs as pid 1 under one hostname (two containers of
    /// one pod). Two workers with one id would both believe they own the same leases.
    pub fn for_this_process() -> Self {
        let host = ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .map(|h| h.trim().to_owned())
            .find(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let salt = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::time::SystemTime::now(),
        );
        Self(format!(
            "{host}-{}-{:04x}",
            std::process::id(),
            salt & 0xffff
        ))
    }
}

/// A hash that is the same in every process, run and build: SipHash-1-3 with both keys 0
/// (the `siphasher` crate, whose algorithm is fixed; std's `DefaultHasher` is today the same
/// function but may change between Rust releases). Seeds for jitter and a per-worker order
/// over leases, the same fleet-wide and reproducible in the simulation.
pub(crate) fn stable_hash(value: impl Hash) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0, 0);
    value.hash(&mut h);
    h.finish()
}

/// The ordering key of a partition key, as parked-key entries store it in the lease row
/// (`docs/lease-table.md`): SipHash-1-3 with both keys 0 over the key's UTF-8 bytes followed
/// by the byte `0xff`, fixed so that a rebuilt binary (any Rust release) still matches the
/// entries an older one wrote. (Equal to what std's `DefaultHasher` gives a `String` today,
/// so entries written before it was pinned still match.)
pub(crate) fn key_hash(key: &str) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0, 0);
    h.write(key.as_bytes());
    h.write_u8(0xff);
    h.finish()
}

/// A number that grows with every change of holder of a lease row: the lease counter the
/// holder's take wrote (kcl extension `kclFence` on a shard's row).
///
/// Every write to a lease row bumps its counter, KCL Java's included, so each take stores
/// a counter higher than every earlier one: a tenure's token is higher than the token of
/// every tenure of that row before it, across restarts, handoffs, takeovers and round
/// trips through KCL Java (whose takes leave `kclFence` alone; kcl writes it at its own
/// next take, from the counter KCL Java left). Renewals and checkpoints leave it as it is.
/// A shard's processor gets it in
/// [`InitializationInput::fencing_token`](crate::InitializationInput) and from
/// [`Checkpointer::fencing_token`](crate::Checkpointer::fencing_token); a singleton's task
/// from its [`TaskContext`](crate::singleton::TaskContext). An instance that carries it into
/// its writes to an external system lets that system refuse a former holder that still
/// thinks it runs:
///
/// ```sql
/// -- the external table keeps the highest token it has seen
/// UPDATE report SET body = :body, fence = :token WHERE id = :id AND fence <= :token
/// ```
///
/// or, on DynamoDB, a `ConditionExpression` of `attribute_not_exists(fence) OR fence <= :token`.
/// A write carrying an older token then fails instead of overwriting the new holder's work,
/// once the new holder has written. A row deleted and created again starts its counter
/// over (kcl deletes a shard's row only once the shard and its children are done, and
/// never a singleton's). See `docs/exactly-once.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A Kinesis sequence number: a decimal string of up to 128 digits, ordered numerically.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Wraps a decimal sequence number. Returns `None` if it is empty or not all digits.
    pub fn parse(s: impl Into<String>) -> Option<Self> {
        let s = s.into();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then_some(Self(s))
    }

    /// The sequence number as Kinesis wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn significant(&self) -> &str {
        let t = self.0.trim_start_matches('0');
        if t.is_empty() { "0" } else { t }
    }
}

impl From<u128> for SequenceNumber {
    fn from(n: u128) -> Self {
        Self(n.to_string())
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.significant(), other.significant());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A position inside a shard: a sequence number plus the sub-sequence number of a record
/// inside an aggregated (KPL) record; `0` for ordinary records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtendedSequenceNumber {
    /// The Kinesis sequence number.
    pub sequence: SequenceNumber,
    /// The sub-sequence number (KPL aggregation), `0` otherwise.
    pub sub_sequence: u64,
}

impl ExtendedSequenceNumber {
    /// A position with sub-sequence `0`.
    pub fn new(sequence: SequenceNumber) -> Self {
        Self {
            sequence,
            sub_sequence: 0,
        }
    }
}

impl fmt::Display for ExtendedSequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.sub_sequence == 0 {
            write!(f, "{}", self.sequence)
        } else {
            write!(f, "{}.{}", self.sequence, self.sub_sequence)
        }
    }
}

/// Where a lease's processing stands, as stored in the lease's `checkpoint` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// Nothing processed yet; start at the oldest record still in the shard.
    TrimHorizon,
    /// Nothing processed yet; start after the newest record.
    Latest,
    /// Nothing processed yet; start at the lease's configured timestamp.
    AtTimestamp,
    /// Everything up to and including this record has been processed.
    Sequence(ExtendedSequenceNumber),
    /// The shard is closed and every record in it has been processed.
    ShardEnd,
}

impl Checkpoint {
    /// The sentinel strings KCL Java writes.
    pub const TRIM_HORIZON: &'static str = "TRIM_HORIZON";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const LATEST: &'static str = "LATEST";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const AT_TIMESTAMP: &'static str = "AT_TIMESTAMP";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const SHARD_END: &'static str = "SHARD_END";

    /// Parses the stored form: a sentinel or a sequence number, plus the sub-sequence.
    pub fn parse(value: &str, sub_sequence: u64) -> Option<Self> {
        Some(match value {
            Self::TRIM_HORIZON => Self::TrimHorizon,
            Self::LATEST => Self::Latest,
            Self::AT_TIMESTAMP => Self::AtTimestamp,
            Self::SHARD_END => Self::ShardEnd,
            s => Self::Sequence(ExtendedSequenceNumber {
                sequence: SequenceNumber::parse(s)?,
                sub_sequence,
            }),
        })
    }

    /// The stored string form.
    pub fn as_str(&self) -> &str {
        match self {
            Self::TrimHorizon => Self::TRIM_HORIZON,
            Self::Latest => Self::LATEST,
            Self::AtTimestamp => Self::AT_TIMESTAMP,
            Self::ShardEnd => Self::SHARD_END,
            Self::Sequence(s) => s.sequence.as_str(),
        }
    }

    /// The stored sub-sequence number (`0` for sentinels).
    pub fn sub_sequence(&self) -> u64 {
        match self {
            Self::Sequence(s) => s.sub_sequence,
            _ => 0,
        }
    }

    /// The checkpoint a new lease starts with.
    pub fn initial(position: &InitialPosition) -> Self {
        match position {
            InitialPosition::TrimHorizon => Self::TrimHorizon,
            InitialPosition::Latest => Self::Latest,
            InitialPosition::AtTimestamp(_) => Self::AtTimestamp,
        }
    }

    /// True once processing of the lease has begun (a sequence) or finished (shard end).
    pub fn has_progress(&self) -> bool {
        matches!(self, Self::Sequence(_) | Self::ShardEnd)
    }

    /// Orders checkpoints along a shard's life: sentinels < sequences < shard end.
    /// Returns `None` between two different start sentinels.
    pub fn progress_cmp(&self, other: &Self) -> Option<Ordering> {
        let rank = |c: &Self| match c {
            Self::TrimHorizon | Self::Latest | Self::AtTimestamp => 0,
            Self::Sequence(_) => 1,
            Self::ShardEnd => 2,
        };
        match (self, other) {
            (Self::Sequence(a), Self::Sequence(b)) => Some(a.cmp(b)),
            (a, b) if rank(a) == 0 && rank(b) == 0 => (a == b).then_some(Ordering::Equal),
            (a, b) => Some(rank(a).cmp(&rank(b))),
        }
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sequence(s) => write!(f, "{s}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Where a worker starts reading a shard that has no checkpoint yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(
        rename_all = "SCREAMING_SNAKE_CASE",
        tag = "type",
        content = "timestamp"
    )
)]
#[doc(
    alias = "InitialPositionInStream",
    alias = "InitialPositionInStreamExtended"
)]
pub enum InitialPosition {
    /// The oldest record still retained (KCL Java's default is LATEST; ours is the safer choice
    /// of losing nothing that is still in the stream).
    #[default]
    TrimHorizon,
    /// Only records written after the lease is first processed.
    Latest,
    /// The first record at or after this time.
    AtTimestamp(DateTime<Utc>),
}

/// Where a [`ShardSource`](crate::ShardSource) iterator starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartingPosition {
    /// The oldest retained record.
    TrimHorizon,
    /// Just after the newest record.
    Latest,
    /// The first record at or after a time.
    AtTimestamp(DateTime<Utc>),
    /// At this record.
    AtSequence(SequenceNumber),
    /// Just after this record.
    AfterSequence(SequenceNumber),
}

/// As Kinesis names the iterator types: `AFTER_SEQUENCE_NUMBER 4968…`.
impl fmt::Display for StartingPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TrimHorizon => f.write_str("TRIM_HORIZON"),
            Self::Latest => f.write_str("LATEST"),
            Self::AtTimestamp(at) => write!(f, "AT_TIMESTAMP {}", at.to_rfc3339()),
            Self::AtSequence(seq) => write!(f, "AT_SEQUENCE_NUMBER {seq}"),
            Self::AfterSequence(seq) => write!(f, "AFTER_SEQUENCE_NUMBER {seq}"),
        }
    }
}

/// The inclusive range of 128-bit hash keys a shard serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashKeyRange {
    /// First hash key of the range.
    pub start: u128,
    /// Last hash key of the range (inclusive).
    pub end: u128,
}

impl HashKeyRange {
    /// The full key space, served by a stream with one shard.
    pub const FULL: Self = Self {
        start: 0,
        end: u128::MAX,
    };

    /// True if `key` falls in the range.
    pub fn contains(&self, key: u128) -> bool {
        (self.start..=self.end).contains(&key)
    }
}

/// One Kinesis record as handed to a processor.
///
/// Built by the sources; [`Record::new`] and the `with_` setters build one for a test.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[doc(alias = "KinesisClientRecord")]
pub struct Record {
    /// The payload.
    pub data: Bytes,
    /// The partition key the producer chose.
    pub partition_key: String,
    /// The record's sequence number within its shard.
    pub sequence_number: SequenceNumber,
    /// Sub-sequence number inside an aggregated record, `0` otherwise.
    pub sub_sequence_number: u64,
    /// When Kinesis accepted the record.
    pub approximate_arrival: DateTime<Utc>,
    /// The explicit hash key the producer set, if any.
    pub explicit_hash_key: Option<String>,
}

impl Record {
    /// A record at `sequence_number` with `partition_key` and `data`, arrived now, not
    /// aggregated (sub-sequence 0), without an explicit hash key.
    ///
    /// ```
    /// use kcl_core::{Record, SequenceNumber};
    ///
    /// let record = Record::new(SequenceNumber::from(42u128), "user-7", "payload")
    ///     .with_explicit_hash_key("1234");
    /// assert_eq!(record.partition_key, "user-7");
    /// ```
    pub fn new(
        sequence_number: SequenceNumber,
        partition_key: impl Into<String>,
        data: impl Into<Bytes>,
    ) -> Self {
        Self {
            data: data.into(),
            partition_key: partition_key.into(),
            sequence_number,
            sub_sequence_number: 0,
            approximate_arrival: Utc::now(),
            explicit_hash_key: None,
        }
    }

    /// The same record, as the user record at `sub_sequence` of an aggregated record.
    #[must_use]
    pub fn with_sub_sequence_number(mut self, sub_sequence: u64) -> Self {
        self.sub_sequence_number = sub_sequence;
        self
    }

    /// The same record, arrived at `at`.
    #[must_use]
    pub fn with_approximate_arrival(mut self, at: DateTime<Utc>) -> Self {
        self.approximate_arrival = at;
        self
    }

    /// The same record, with the explicit hash key (a decimal 128-bit number) set.
    #[must_use]
    pub fn with_explicit_hash_key(mut self, key: impl Into<String>) -> Self {
        self.explicit_hash_key = Some(key.into());
        self
    }

    /// The record's position, for checkpoints.
    pub fn position(&self) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber {
            sequence: self.sequence_number.clone(),
            sub_sequence: self.sub_sequence_number,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap_or_else(|| unreachable!("valid in test"))
    }

    #[test]
    fn a_partition_keys_hash_is_fixed_across_builds() {
        // Parked-key entries in lease rows hold these values: they must never change.
        let golden: [(&str, u64); 3] = [
            ("", 0x3040_6ea5_23c5_3def),
            ("user-7", 0x58a1_ce3a_13a1_b0fe),
            ("ü", 0x8395_4d64_990a_5314),
        ];
        for (key, want) in golden {
            assert_eq!(key_hash(key), want, "{key:?}");
            // What entries written before the hash was pinned hold (std's hasher today).
            let mut std = std::hash::DefaultHasher::new();
            key.to_owned().hash(&mut std);
            assert_eq!(std.finish(), want, "{key:?} (std)");
        }
    }

    #[test]
    fn sequence_numbers_order_numerically_beyond_u128() {
        assert!(seq("9") < seq("10"));
        assert!(seq("0010") == seq("10").max(seq("0010")).min(seq("0010")));
        assert_eq!(seq("0010").cmp(&seq("10")), Ordering::Equal);
        let big = "49590338271490256608559692538361571095921575989136588898";
        let bigger = "49590338271490256608559692538361571095921575989136588899";
        assert!(seq(big) < seq(bigger));
        assert!(seq("100000000000000000000000000000000000000000000000000000000") > seq(bigger));
        assert!(SequenceNumber::parse("12a").is_none());
        assert!(SequenceNumber::parse("").is_none());
    }

    #[test]
    fn checkpoint_round_trips_and_orders() {
        for c in [
            Checkpoint::TrimHorizon,
            Checkpoint::Latest,
            Checkpoint::AtTimestamp,
            Checkpoint::ShardEnd,
            Checkpoint::Sequence(ExtendedSequenceNumber {
                sequence: seq("42"),
                sub_sequence: 3,
            }),
        ] {
            assert_eq!(
                Checkpoint::parse(c.as_str(), c.sub_sequence()),
                Some(c.clone())
            );
        }
        let a = Checkpoint::Sequence(ExtendedSequenceNumber::new(seq("5")));
        let b = Checkpoint::Sequence(ExtendedSequenceNumber::new(seq("7")));
        assert_eq!(a.progress_cmp(&b), Some(Ordering::Less));
        assert_eq!(
            Checkpoint::ShardEnd.progress_cmp(&b),
            Some(Ordering::Greater)
        );
        assert_eq!(
            Checkpoint::TrimHorizon.progress_cmp(&a),
            Some(Ordering::Less)
        );
        assert_eq!(
            Checkpoint::TrimHorizon.progress_cmp(&Checkpoint::Latest),
            None
        );
        assert!(Checkpoint::parse("bogus", 0).is_none());
    }
}
