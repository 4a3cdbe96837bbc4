//! Whether the stream named (`--stream`) is the one a lease table's leases are of, before
//! `leases` shows it or `reset` moves a checkpoint by it: a reset of the orders table by the
//! payments stream would move orders' checkpoints to positions of payments (its shard ids,
//! `shardId-000000000001`, are the same).
//!
//! A single-stream table does not record its stream's name (neither kcl's nor KCL Java's);
//! a multi-stream table's keys do (`account:stream:creationEpoch:shardId`). So the table is
//! compared with what the stream lists:
//!
//! - in a multi-stream table, a lease key must name the stream;
//! - every unfinished lease must be of a shard the stream lists (or the parent of one: a
//!   closed shard aged out of the stream), and at least one lease of a listed shard;
//! - a lease's hash keys (written with it from `ListShards`) must be its shard's;
//! - on a Kinesis stream, a lease's checkpoint (a sequence number) must come from its shard:
//!   a sequence number carries its shard's creation time and index ([`crate::sequence`]),
//!   and so does the shard's starting sequence number in `ListShards`. Two streams made in
//!   the same second with the same shards, and tables without a checkpoint yet, cannot be
//!   told apart by this.
//!
//! On a mismatch, the Kinesis streams of the account (the first 500 `ListStreams` names) are
//! searched for the one whose shards the checkpoints come from, to name it.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_kinesis::Client;
use kcl_aws::{AnySource, StreamRef};
use kcl_core::multi_stream::StreamId;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{Checkpoint, Lease, Shard, ShardId};

use crate::sequence::{self, Origin};
use crate::source::StreamArgs;

/// How many stream names the search for the table's stream reads, at most.
const SEARCHED: usize = 500;

/// How many keys a message names (the rest are counted).
const NAMED: usize = 5;

/// Refuses `stream` (opened as `source`, listing `listed`) if `leases`, the rows of
/// `application`'s table, are not of it, naming what they are of.
pub(crate) async fn check(
    sdk: &aws_config::SdkConfig,
    application: &str,
    stream: &StreamArgs,
    source: &AnySource,
    listed: &[Shard],
    leases: &[Lease],
) -> anyhow::Result<()> {
    let shard_leases: Vec<&Lease> = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key))
        .collect();
    let streams: BTreeSet<String> = shard_leases
        .iter()
        .filter_map(|l| StreamId::split_key(&l.key))
        .map(|(id, _)| id.name)
        .collect();
    if !streams.is_empty() {
        // A DynamoDB stream's multi-stream id is not matched (see `StreamArgs::names`).
        if stream.is_kinesis() && !streams.iter().any(|name| stream.names(name)) {
            let text = format!(
                "--stream {} is not a stream of {application}: its leases are of {} (a \
                 multi-stream table; its lease keys name their streams)",
                stream.name(),
                list(&streams.iter().collect::<Vec<_>>())
            );
            return refuse(stream, &text);
        }
        return Ok(());
    }
    if shard_leases.is_empty() {
        return Ok(()); // no lease yet: of no stream
    }
    let kinesis = match source {
        AnySource::Kinesis(k) => Some((Client::new(sdk), k.stream().clone())),
        _ => None,
    };
    let starts = match &kinesis {
        Some((client, stream)) => starting_origins(client, stream).await?,
        None => BTreeMap::new(),
    };
    let mut evidence = shard_evidence(stream.name(), listed, &shard_leases);
    evidence.extend(checkpoint_evidence(stream.name(), &starts, &shard_leases));
    if evidence.is_empty() {
        return Ok(());
    }
    let owner = match &kinesis {
        Some((client, named)) => search(client, named, &shard_leases).await,
        None => Vec::new(),
    };
    let text = format!(
        "--stream {} is not the stream of {application}'s leases: {}. {}",
        stream.name(),
        evidence.join("; "),
        owner_text(application, &owner, &shard_leases)
    );
    refuse(stream, &text)
}

/// A mismatch: an error, or with `--force-stream` a warning.
fn refuse(stream: &StreamArgs, text: &str) -> anyhow::Result<()> {
    anyhow::ensure!(stream.forced(), "{text}");
    warn(&format!(
        "kcl-admin: --force-stream: going on although {text}"
    ));
    Ok(())
}

#[allow(clippy::print_stderr)]
fn warn(line: &str) {
    eprintln!("{line}");
}

/// What the shards a stream lists say against the leases.
fn shard_evidence(name: &str, listed: &[Shard], leases: &[&Lease]) -> Vec<String> {
    let by_id: BTreeMap<&ShardId, &Shard> = listed.iter().map(|s| (&s.id, s)).collect();
    let parents: BTreeSet<&ShardId> = listed.iter().flat_map(|s| &s.parent_shard_ids).collect();
    let mut evidence = Vec::new();
    let of_listed = leases.iter().filter(|l| by_id.contains_key(&l.key)).count();
    if of_listed == 0 {
        evidence.push(format!(
            "none of its {} lease(s) is of a shard {name} lists ({} shard(s))",
            leases.len(),
            listed.len()
        ));
        return evidence;
    }
    let strangers: Vec<&ShardId> = leases
        .iter()
        .filter(|l| !l.is_finished() && !by_id.contains_key(&l.key) && !parents.contains(&l.key))
        .map(|l| &l.key)
        .collect();
    if !strangers.is_empty() {
        evidence.push(format!(
            "it has unfinished leases of shards {name} does not have: {}",
            list(&strangers)
        ));
    }
    let ranges: Vec<&ShardId> = leases
        .iter()
        .filter(|l| {
            let shard = by_id.get(&l.key);
            matches!((l.hash_key_range, shard), (Some(r), Some(s)) if r != s.hash_key_range)
        })
        .map(|l| &l.key)
        .collect();
    if !ranges.is_empty() {
        evidence.push(format!(
            "its leases of {} serve other hash keys than {name}'s shards of those ids",
            list(&ranges)
        ));
    }
    evidence
}

/// The leases whose checkpoints are records of another shard than the stream's of their id.
fn checkpoint_evidence(
    name: &str,
    starts: &BTreeMap<ShardId, Origin>,
    leases: &[&Lease],
) -> Vec<String> {
    let (mut keys, mut theirs, mut ours) = (Vec::new(), BTreeSet::new(), BTreeSet::new());
    for lease in leases {
        let (Some(origin), Some(start)) = (checkpoint_origin(lease), starts.get(&lease.key)) else {
            continue;
        };
        if origin != *start {
            keys.push(&lease.key);
            theirs.insert(format!(
                "{} created {}",
                origin.shard(),
                origin.created_text()
            ));
            ours.insert(format!(
                "{} created {}",
                start.shard(),
                start.created_text()
            ));
        }
    }
    if keys.is_empty() {
        return Vec::new();
    }
    let theirs: Vec<String> = theirs.into_iter().collect();
    let ours: Vec<String> = ours.into_iter().collect();
    vec![format!(
        "the checkpoints of its leases of {} are records of another stream's shards ({}), \
         not of {name}'s ({})",
        list(&keys),
        list(&theirs),
        list(&ours)
    )]
}

/// Where `lease`'s checkpoint (or pending checkpoint) comes from, if it is a sequence number
/// of Kinesis's layout.
fn checkpoint_origin(lease: &Lease) -> Option<Origin> {
    [Some(&lease.checkpoint), lease.pending_checkpoint.as_ref()]
        .into_iter()
        .flatten()
        .find_map(|c| match c {
            Checkpoint::Sequence(s) => sequence::origin(s.sequence.as_str()),
            _ => None,
        })
}

/// Each shard of `stream` by where its starting sequence number comes from.
async fn starting_origins(
    client: &Client,
    stream: &StreamRef,
) -> anyhow::Result<BTreeMap<ShardId, Origin>> {
    let mut origins = BTreeMap::new();
    let mut token: Option<String> = None;
    loop {
        let request = client.list_shards();
        let request = match (&token, stream) {
            (Some(token), _) => request.next_token(token),
            (None, StreamRef::Name(name)) => request.stream_name(name),
            (None, StreamRef::Arn(arn)) => request.stream_arn(arn),
        };
        let out = request.send().await.map_err(|e| {
            anyhow::anyhow!("ListShards of {stream}: {}", kcl_core::error_chain(&e))
        })?;
        for shard in out.shards() {
            let start = shard
                .sequence_number_range()
                .map(|r| r.starting_sequence_number());
            if let Some(origin) = start.and_then(sequence::origin) {
                origins.insert(ShardId::new(shard.shard_id()), origin);
            }
        }
        match out.next_token {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(origins),
        }
    }
}

/// The Kinesis streams (other than `named`) whose shards every checkpoint of `leases` that
/// can be read comes from; empty if none, or none can be read, or the streams cannot be
/// listed.
async fn search(client: &Client, named: &StreamRef, leases: &[&Lease]) -> Vec<String> {
    let wanted: Vec<(&ShardId, Origin)> = leases
        .iter()
        .filter_map(|l| Some((&l.key, checkpoint_origin(l)?)))
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let named = match named {
        StreamRef::Name(name) => name.as_str(),
        StreamRef::Arn(arn) => arn.rsplit('/').next().unwrap_or(arn),
    };
    let mut found = Vec::new();
    for name in stream_names(client).await {
        if name == named {
            continue;
        }
        let Ok(starts) = starting_origins(client, &StreamRef::Name(name.clone())).await else {
            continue;
        };
        if wanted.iter().all(|(key, o)| starts.get(*key) == Some(o)) {
            found.push(name);
        }
    }
    found
}

/// The account's Kinesis stream names, the first [`SEARCHED`] of them.
async fn stream_names(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut token: Option<String> = None;
    while names.len() < SEARCHED {
        let request = client.list_streams().limit(100);
        let request = match &token {
            Some(token) => request.next_token(token),
            None => request,
        };
        let Ok(out) = request.send().await else {
            break;
        };
        names.extend(out.stream_names().iter().cloned());
        match out.next_token {
            Some(next) if out.has_more_streams && !next.is_empty() => token = Some(next),
            _ => break,
        }
    }
    names.truncate(SEARCHED);
    names
}

/// What the table's leases are of, as far as can be told.
fn owner_text(application: &str, found: &[String], leases: &[&Lease]) -> String {
    let keys: Vec<&ShardId> = leases.iter().map(|l| &l.key).collect();
    let of = match found {
        [] => format!(
            "its leases are of shards {} of a stream not found among the streams listed \
             (ListStreams, and ListShards of each, where the credentials allow them)",
            list(&keys)
        ),
        [one] => format!("by its checkpoints, its leases are of stream {one}"),
        many => format!(
            "by its checkpoints, its leases are of one of the streams {}",
            list(&many.iter().collect::<Vec<_>>())
        ),
    };
    format!(
        "{application} is a single-stream table, which does not record its stream's name: {of}. \
         Name the table's own stream (or, if the stream was deleted and made again under this \
         name and the checkpoints are the old stream's, --force-stream to go on)"
    )
}

/// The first few of `items`, and how many more.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let mut named: Vec<String> = items.iter().take(NAMED).map(ToString::to_string).collect();
    if items.len() > NAMED {
        named.push(format!("and {} more", items.len() - NAMED));
    }
    named.join(", ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kcl_core::HashKeyRange;

    use super::*;

    fn shard(id: &str, parents: &[&str]) -> Shard {
        Shard {
            id: ShardId::from(id),
            parent_shard_ids: parents.iter().map(|p| ShardId::from(*p)).collect(),
            hash_key_range: HashKeyRange::FULL,
            closed: false,
        }
    }

    fn lease(key: &str, checkpoint: Checkpoint) -> Lease {
        let mut l = Lease::new(ShardId::from(key), checkpoint);
        l.hash_key_range = Some(HashKeyRange::FULL);
        l
    }

    #[test]
    fn the_shards_of_another_stream_are_evidence_and_an_aged_out_parent_is_not() {
        let listed = [shard("s2", &["s1"])];
        // s1: a parent gone from the stream (aged out), unfinished, s2's: not evidence.
        let parent = lease("s1", Checkpoint::TrimHorizon);
        let child = lease("s2", Checkpoint::TrimHorizon);
        assert!(shard_evidence("orders", &listed, &[&parent, &child]).is_empty());
        // s9: unfinished, of no listed shard: evidence; finished, not.
        let stranger = lease("s9", Checkpoint::TrimHorizon);
        let found = shard_evidence("orders", &listed, &[&child, &stranger]);
        assert!(found[0].contains("s9"), "{found:?}");
        let done = lease("s9", Checkpoint::ShardEnd);
        assert!(shard_evidence("orders", &listed, &[&child, &done]).is_empty());
        // Other hash keys under the same id: evidence.
        let mut other = lease("s2", Checkpoint::TrimHorizon);
        other.hash_key_range = Some(HashKeyRange { start: 0, end: 7 });
        let found = shard_evidence("orders", &listed, &[&other]);
        assert!(found[0].contains("hash keys"), "{found:?}");
        // Nothing of the stream's: evidence.
        let found = shard_evidence("orders", &listed, &[&stranger]);
        assert!(found[0].contains("none of its 1 lease"), "{found:?}");
    }
}
