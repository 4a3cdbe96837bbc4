//! Redrive through the holder: a parked key's letters are replayed by the worker that holds
//! its shard, before any later record of the key, instead of being put back into the stream.
//!
//! Putting letters back into the stream cannot keep a parked key's order while records of the
//! key keep arriving: the copies land at the stream's end, after live records that arrived
//! since; and the holder must learn of the unpark before the copies arrive, which only a wait
//! could promise. So a redrive of a parked key is a *request*, written into the lease row that
//! parks it (`{key}/redrive/{letters}/{shards}`, beside the key's `{key}/{sequence}/{sub}`
//! entry). The holder sees it (its renewals read the row back; under heartbeats it reads the
//! row every renewal interval while it parks keys), holds the key's later records, reads the
//! key's letters back from the sink ([`LetterReader`]), runs each through the handler in
//! order (with the policy's tries), removes each from the sink once it succeeded, and then
//! removes both entries: the key's records run again, after its letters. Nothing depends on
//! when anyone looks.
//!
//! A letter that fails again stops the replay: the key stays parked behind its record, the
//! letters from it on stay in the sink, and the request is removed (a new redrive tries
//! again). A replay that finds fewer letters than the request counted (another reader holds
//! some: SQS hides a message it handed out) tries again a few times, then stops the same way.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::DeadLetter;
use crate::error::BackendError;
use crate::types::{ExtendedSequenceNumber, ShardId};

/// A letter kept at a sink, and what removing it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Kept {
    /// The letter.
    pub letter: DeadLetter,
    /// The reader's handle for it (a message's receipt, an object's key, a line's id).
    pub handle: String,
}

impl Kept {
    /// A letter kept under `handle`.
    pub fn new(letter: DeadLetter, handle: impl Into<String>) -> Self {
        Self {
            letter,
            handle: handle.into(),
        }
    }
}

/// Reads a sink's letters back and removes them, for a redrive through the holder (see the
/// docs/when-a-record-fails.md, "Redriving a parked key"); given with
/// [`DeadLetters::reader`](super::DeadLetters::reader). kcl-aws implements it on every sink
/// that can delete a letter (SQS, S3, a file; not a Kinesis stream).
pub trait LetterReader: Send + Sync + 'static {
    /// Every letter kept whose [`parked_key`](DeadLetter::parked_key) is `key` (16 hex
    /// digits), in any order, copies included.
    fn parked(&self, key: &str) -> impl Future<Output = Result<Vec<Kept>, BackendError>> + Send;

    /// Removes `kept` from the sink. Called once its record succeeded again; a letter
    /// removed twice is not an error.
    fn remove(&self, kept: &Kept) -> impl Future<Output = Result<(), BackendError>> + Send;
}

/// A reader without its type, as the worker keeps it.
pub(crate) trait AnyReader: Send + Sync {
    fn parked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<Kept>, BackendError>>;
    fn remove<'a>(&'a self, kept: &'a Kept) -> BoxFuture<'a, Result<(), BackendError>>;
}

impl<T: LetterReader> AnyReader for T {
    fn parked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<Kept>, BackendError>> {
        Box::pin(LetterReader::parked(self, key))
    }

    fn remove<'a>(&'a self, kept: &'a Kept) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(LetterReader::remove(self, kept))
    }
}

/// A shared reader.
pub(crate) type Reader = Arc<dyn AnyReader>;

/// The lease row a replay reads its request from and writes back, and the lease's validity,
/// without the store's type (the shard's tenure).
pub(crate) trait Row: Send + Sync + std::fmt::Debug {
    /// The row's parked-key entries as last read or written; `None` while a write is under
    /// way, or once the tenure is over.
    fn entries(&self) -> Option<Vec<String>>;
    /// Removes `entries` from the row.
    fn unpark<'a>(&'a self, entries: &'a [String]) -> BoxFuture<'a, Result<(), BackendError>>;
    /// Replaces the entry `old` by `new`.
    fn replace<'a>(&'a self, old: &'a str, new: &'a str)
    -> BoxFuture<'a, Result<(), BackendError>>;
    /// Runs `work` while the lease is valid: `false` (and `work` dropped) once another worker
    /// may hold it.
    fn while_valid<'a>(&'a self, work: BoxFuture<'a, ()>) -> BoxFuture<'a, bool>;
}

/// One entry of a lease row's [`parked_keys`](crate::Lease::parked_keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `{key}/{sequence}/{sub-sequence}`: the key is parked behind that record.
    Park(u64, ExtendedSequenceNumber),
    /// `{key}/redrive/{letters}/{shard}+{shard}…`: replay the key's letters read from these
    /// shards (at least `letters` of them), then unpark it.
    Redrive {
        key: u64,
        letters: usize,
        shards: Vec<ShardId>,
    },
}

/// The entry that asks the holder to replay the letters of the parked key `key` (16 hex
/// digits) read from `shards` (at least `letters` of them), then unpark it; see the
/// docs/when-a-record-fails.md, "Redriving a parked key".
pub fn redrive_entry(key: &str, letters: usize, shards: &[ShardId]) -> String {
    let shards: Vec<&str> = shards.iter().map(ShardId::as_str).collect();
    format!("{key}/redrive/{letters}/{}", shards.join("+"))
}

/// An entry of a row's parked keys; `None` (logged by the caller) if malformed.
pub(crate) fn parse_entry(entry: &str) -> Option<Entry> {
    let mut parts = entry.splitn(4, '/');
    let key = u64::from_str_radix(parts.next()?, 16).ok()?;
    let second = parts.next()?;
    if second == "redrive" {
        let letters = parts.next()?.parse().ok()?;
        let shards = parts.next()?.split('+').filter(|s| !s.is_empty());
        let shards: Vec<ShardId> = shards.map(ShardId::from).collect();
        // No shard: nothing to replay here (the key's letters are another row's), unpark.
        return (letters == 0 || !shards.is_empty()).then_some(Entry::Redrive {
            key,
            letters,
            shards,
        });
    }
    let sequence = crate::types::SequenceNumber::parse(second)?;
    let rest = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let sub_sequence = rest.parse().ok()?;
    let position = ExtendedSequenceNumber {
        sequence,
        sub_sequence,
    };
    Some(Entry::Park(key, position))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_entry_reads_back_and_is_no_park_entry() {
        let shards = [
            ShardId::from("shardId-000000000001"),
            ShardId::from("123456789012:orders:1700000000:shardId-000000000004"),
        ];
        let entry = redrive_entry("00000000deadbeef", 7, &shards);
        assert_eq!(
            parse_entry(&entry),
            Some(Entry::Redrive {
                key: 0xdead_beef,
                letters: 7,
                shards: shards.to_vec()
            })
        );
        assert_eq!(super::super::parse_park_entry(&entry), None);
        assert_eq!(
            parse_entry("00ff/redrive/3/"),
            None,
            "3 letters from no shard"
        );
        assert!(matches!(
            parse_entry("00ff/redrive/0/"),
            Some(Entry::Redrive { letters: 0, .. })
        ));
        assert!(matches!(
            parse_entry("00ff/12/0"),
            Some(Entry::Park(0xff, _))
        ));
    }
}
