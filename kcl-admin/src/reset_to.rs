//! `reset --to SEQUENCE`: the sequence number must be a record of the shard reset (its
//! holder could not read on from another, and the shard would stop). The stream is asked
//! (an iterator after the record); when it refuses, the shard the record is of is named: by
//! the number's layout when it has Kinesis's ([`crate::sequence`]), else by asking the
//! stream's other shards for it. The layout is read only once the stream has refused: a
//! number the stream takes is never refused by it.

use kcl_core::multi_stream::StreamId;
use kcl_core::{SequenceNumber, Shard, ShardId, ShardSource, StartingPosition};

use crate::sequence;

/// How many other shards are asked for a record the shard reset does not have.
const ASKED: usize = 50;

/// Refuses a sequence number that `key`'s shard does not have, naming the shard of `listed`
/// it is of, if it is one's.
pub(crate) async fn has_record(
    source: &impl ShardSource,
    key: &ShardId,
    sequence: &SequenceNumber,
    listed: &[Shard],
) -> anyhow::Result<()> {
    let shard = StreamId::split_key(key).map_or_else(|| key.clone(), |(_, shard)| shard);
    let position = StartingPosition::AfterSequence(sequence.clone());
    let Err(e) = source.shard_iterator(&shard, &position).await else {
        return Ok(());
    };
    let by_layout = sequence::origin(sequence.as_str())
        .map(|origin| origin.shard())
        .filter(|of| *of != shard && listed.iter().any(|s| s.id == *of));
    let of = match by_layout {
        Some(of) => Some(of),
        None => asked(source, &shard, &position, listed).await,
    };
    if let Some(of) = of {
        anyhow::bail!(
            "invalid --to {sequence}: it is a record of {of}, not of {shard} (which has no \
             such record); to resume {of} after it, reset --shard {of}"
        );
    }
    anyhow::bail!(
        "invalid --to {sequence}: {shard} has no such record, nor has any other shard of the \
         stream (the stream answered: {}); a reset to it would stop the shard",
        kcl_core::error_chain(&e)
    )
}

/// The first shard of `listed` other than `shard` that has the record, asked one by one.
async fn asked(
    source: &impl ShardSource,
    shard: &ShardId,
    position: &StartingPosition,
    listed: &[Shard],
) -> Option<ShardId> {
    for other in listed.iter().filter(|s| s.id != *shard).take(ASKED) {
        if source.shard_iterator(&other.id, position).await.is_ok() {
            return Some(other.id.clone());
        }
    }
    None
}
