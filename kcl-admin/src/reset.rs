//! `kcl-admin reset`: moves checkpoints while the fleet runs, through
//! [`kcl_core::admin::reset`] (fenced through the lease), then waits until no worker can still
//! be reading from the old checkpoints.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kcl_core::admin::{self, RESET_SETTLES_AFTER, ResetTo};
use kcl_core::multi_stream::StreamId;
use kcl_core::singleton::is_coordination_key;
use kcl_core::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseStore, SequenceNumber, Shard, ShardId,
    ShardSource,
};

use crate::lease_store::Store;

/// Arguments of `kcl-admin reset`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["shard", "all"])))]
pub(crate) struct Args {
    /// The application: the lease table's name (with `--lease-store postgres://…`, whose
    /// rows of kcl_leases).
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// Where the leases are.
    #[command(flatten)]
    leases: crate::lease_store::StoreArgs,
    /// The stream the leases are of.
    #[command(flatten)]
    stream: crate::source::StreamArgs,
    /// A shard to reset (repeat for several): its shard id, or in a multi-stream table the
    /// lease key `account:stream:creationEpoch:shardId` (a shard id finds the lease of that
    /// shard of `--stream` there too).
    #[arg(long, num_args = 1..)]
    shard: Vec<String>,
    /// Every shard with an unfinished lease.
    #[arg(long)]
    all: bool,
    /// Where to: `TRIM_HORIZON`, `LATEST` (the moment of the reset), `AT_TIMESTAMP
    /// <rfc3339>`, or a sequence number (processing resumes after that record, as from a
    /// checkpoint at it).
    #[arg(long, num_args = 1..=2, value_names = ["POSITION", "TIMESTAMP"], required = true)]
    to: Vec<String>,
    /// The fleet's failover time: how long the command waits after the writes, until no
    /// worker can still be reading from the old checkpoints.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    failover_time: Duration,
    /// Only show what would be reset.
    #[arg(long)]
    dry_run: bool,
}

/// Where `to` points, at `now`.
fn target(to: &[String], now: DateTime<Utc>) -> anyhow::Result<ResetTo> {
    let at = |checkpoint, pin| ResetTo { checkpoint, pin };
    match to {
        [p] if p == Checkpoint::TRIM_HORIZON => Ok(at(Checkpoint::TrimHorizon, None)),
        [p] if p == Checkpoint::LATEST => Ok(at(Checkpoint::Latest, Some(now))),
        [p, t] if p == Checkpoint::AT_TIMESTAMP => {
            let t = DateTime::parse_from_rfc3339(t).map_err(|e| {
                anyhow::anyhow!(
                    "invalid --to AT_TIMESTAMP {t}: {e} (want RFC 3339, e.g. 2026-11-25T10:00:00Z)"
                )
            })?;
            Ok(at(Checkpoint::AtTimestamp, Some(t.with_timezone(&Utc))))
        }
        [s] => {
            let seq = SequenceNumber::parse(s.clone()).ok_or_else(|| {
                anyhow::anyhow!(
                    "invalid --to {s}: want TRIM_HORIZON, LATEST, AT_TIMESTAMP <rfc3339> or a sequence number"
                )
            })?;
            Ok(at(
                Checkpoint::Sequence(ExtendedSequenceNumber::new(seq)),
                None,
            ))
        }
        _ => anyhow::bail!(
            "invalid --to {}: AT_TIMESTAMP takes a timestamp, the others none",
            to.join(" ")
        ),
    }
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    let to = target(&args.to, Utc::now())?;
    match args.leases.open(sdk, &args.application_name).await? {
        Store::DynamoDb(store) => run_on(sdk, &args, &to, &store).await,
        Store::Postgres(store) => run_on(sdk, &args, &to, &store).await,
    }
}

async fn run_on(
    sdk: &aws_config::SdkConfig,
    args: &Args,
    to: &ResetTo,
    store: &impl LeaseStore,
) -> anyhow::Result<()> {
    let Some(source) = args.stream.open(sdk).await? else {
        anyhow::bail!("--stream is required (or --table with --source dynamodb-streams)");
    };
    let listed = source.list_shards().await?;
    let leases = store.list().await?;
    let application = &args.application_name;
    crate::belongs::check(sdk, application, &args.stream, &source, &listed, &leases).await?;
    let shards = shards(args, to, &source, &listed, &leases).await?;
    report(&format!(
        "resetting {} shard(s) of {} to {}",
        shards.len(),
        args.application_name,
        args.to.join(" ")
    ));
    if args.dry_run {
        return dry_run(store, &source, &shards, to).await;
    }
    let mut failed = 0;
    for shard in &shards {
        match admin::reset(store, shard, to).await {
            Ok(done) => report(&format!(
                "  {shard}: checkpoint {} (counter {}), was {} (to undo: --to {})",
                shown(&done.after),
                done.after.counter,
                shown(&done.before),
                undo(&done.before)
            )),
            Err(e) => {
                failed += 1;
                report(&format!(
                    "  {shard}: not reset: {}",
                    kcl_core::error_chain(&e)
                ));
            }
        }
    }
    anyhow::ensure!(
        failed < shards.len(),
        "no shard reset: nothing written, nothing to wait for"
    );
    let wait = args.failover_time * RESET_SETTLES_AFTER;
    report(&format!(
        "waiting {} (the failover time) until no worker can still be reading from the old checkpoints",
        humantime::format_duration(wait)
    ));
    tokio::time::sleep(wait).await;
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} shard(s) not reset",
        shards.len()
    );
    report("done: each shard is taken from its new checkpoint by a worker within a failover time");
    Ok(())
}

/// The lease keys to reset (`--all`, or each `--shard`), each checked to have the record a
/// sequence number names.
async fn shards(
    args: &Args,
    to: &ResetTo,
    source: &impl ShardSource,
    listed: &[Shard],
    leases: &[Lease],
) -> anyhow::Result<Vec<ShardId>> {
    let mut shards: Vec<ShardId> = Vec::new();
    if args.all {
        if matches!(to.checkpoint, Checkpoint::Sequence(_)) {
            anyhow::bail!(
                "--all with a sequence number: a sequence number belongs to one shard; name it with --shard"
            );
        }
        shards = of_stream(&args.stream, listed, leases);
    } else {
        for given in &args.shard {
            let key = lease_key(given, &args.stream, listed, leases)?;
            if !shards.contains(&key) {
                shards.push(key);
            }
        }
    }
    if let Checkpoint::Sequence(at) = &to.checkpoint {
        for key in &shards {
            crate::reset_to::has_record(source, key, &at.sequence, listed).await?;
        }
    }
    Ok(shards)
}

/// What a reset would do to each shard, written nowhere, with about how many records it
/// would replay or skip ([`crate::replay`]); an error if any would be refused.
async fn dry_run(
    store: &impl LeaseStore,
    source: &impl ShardSource,
    shards: &[ShardId],
    to: &ResetTo,
) -> anyhow::Result<()> {
    let mut refused = 0;
    for shard in shards {
        let line = match store.get(shard).await? {
            Some(row) if row.is_finished() => {
                refused += 1;
                format!(
                    "would not reset {shard}: it is finished ({})",
                    row.checkpoint
                )
            }
            Some(row) => {
                let bare = StreamId::split_key(shard).map_or_else(|| shard.clone(), |(_, s)| s);
                let effect = match crate::replay::estimate(source, &bare, &row, to).await {
                    Ok(estimate) => estimate.to_string(),
                    Err(e) => format!("cannot count the records: {}", kcl_core::error_chain(&e)),
                };
                format!(
                    "would reset {shard} (now checkpoint {}): {effect}",
                    shown(&row)
                )
            }
            None => {
                refused += 1;
                format!("would not reset {shard}: it has no lease")
            }
        };
        report(&format!("  {line}"));
    }
    report(
        "  (records counted in the stream from the earlier position to the later, approximately: \
         the stream and the holder's checkpoint move on meanwhile; a KPL aggregate counts as one)",
    );
    anyhow::ensure!(
        refused == 0,
        "{refused} of {} shard(s) would not be reset",
        shards.len()
    );
    Ok(())
}

/// The unfinished leases of the stream named: in a single-stream table, those of the shards
/// it lists; in a multi-stream table, those whose key names it (of its newest creation, if
/// it was recreated) and one of its shards. Never another stream's.
fn of_stream(
    stream: &crate::source::StreamArgs,
    listed: &[Shard],
    leases: &[Lease],
) -> Vec<ShardId> {
    let listed_shard = |s: &ShardId| listed.iter().any(|l| l.id == *s);
    let live = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key) && !l.is_finished());
    let newest = leases
        .iter()
        .filter_map(|l| StreamId::split_key(&l.key))
        .filter(|(id, _)| stream.names(&id.name))
        .map(|(id, _)| id.creation_epoch)
        .max();
    live.filter(|l| match StreamId::split_key(&l.key) {
        Some((id, shard)) => {
            stream.names(&id.name) && Some(id.creation_epoch) == newest && listed_shard(&shard)
        }
        None => listed_shard(&l.key),
    })
    .map(|l| l.key.clone())
    .collect()
}

/// The lease key `given` names: a shard id of the stream (its lease, in a single-stream table,
/// is the shard id; in a multi-stream table, `account:stream:creationEpoch:shardId`, found by
/// the stream's name), or a multi-stream lease key whose stream is the one named and whose
/// shard the stream lists.
fn lease_key(
    given: &str,
    stream: &crate::source::StreamArgs,
    listed: &[Shard],
    leases: &[Lease],
) -> anyhow::Result<ShardId> {
    let listed_shard = |s: &ShardId| listed.iter().any(|l| l.id == *s);
    let given_key = ShardId::new(given.to_owned());
    if let Some((id, shard)) = StreamId::split_key(&given_key) {
        anyhow::ensure!(
            !stream.is_kinesis() || stream.names(&id.name),
            "invalid --shard {given}: a lease of stream {}, not of --stream {}",
            id.name,
            stream.name()
        );
        anyhow::ensure!(
            listed_shard(&shard),
            "invalid --shard {given}: stream {} has no shard {shard}",
            stream.name()
        );
        return Ok(given_key);
    }
    anyhow::ensure!(
        listed_shard(&given_key),
        "invalid --shard {given}: stream {} has no such shard",
        stream.name()
    );
    if leases.iter().any(|l| l.key == given_key) {
        return Ok(given_key);
    }
    // A multi-stream table: the lease of this shard of the stream named (the newest stream
    // of that name if it was recreated: the one listed).
    let found = leases
        .iter()
        .filter_map(|l| StreamId::split_key(&l.key).map(|(id, shard)| (id, shard, &l.key)))
        .filter(|(id, shard, _)| *shard == given_key && stream.names(&id.name))
        .max_by_key(|(id, _, _)| id.creation_epoch);
    Ok(found.map_or(given_key, |(_, _, key)| key.clone()))
}

/// A row's checkpoint, with the moment pinned for `LATEST` and `AT_TIMESTAMP`.
fn shown(row: &kcl_core::Lease) -> String {
    match row.start_timestamp {
        Some(at) if matches!(row.checkpoint, Checkpoint::Latest | Checkpoint::AtTimestamp) => {
            format!("{} {}", row.checkpoint, at.to_rfc3339())
        }
        _ => row.checkpoint.to_string(),
    }
}

/// The `--to` that puts `row`'s checkpoint back.
fn undo(row: &kcl_core::Lease) -> String {
    match (&row.checkpoint, row.start_timestamp) {
        (Checkpoint::Latest | Checkpoint::AtTimestamp, Some(at)) => {
            format!("{} {}", Checkpoint::AT_TIMESTAMP, at.to_rfc3339())
        }
        (Checkpoint::Sequence(s), _) => s.sequence.to_string(),
        (other, _) => other.to_string(),
    }
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}
