//! `kcl-admin copy`: checkpoints to another application's lease table (an application
//! rename, a blue/green move). The new rows are unowned, so the new fleet takes them as it
//! would any lease; rows the target already has are left as they are, and named.
//!
//! A copy of a running fleet's table is a snapshot: the new fleet repeats what the old one
//! did after it. So the source table is watched first, as `remove-kcl-rows` does
//! ([`crate::liveness`]), and a running fleet refuses the copy unless `--force`.

use std::time::Duration;

use anyhow::Context as _;

use kcl_core::singleton::is_coordination_key;
use kcl_core::{Lease, LeaseStore, LeaseStoreExtras, TableFeatures};

use crate::liveness::{self, Seen};

/// Arguments of `kcl-admin copy`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application (lease table) to copy from. Stop its fleet first, or the copy is a
    /// snapshot and the new fleet repeats what the old one did after it (at least once).
    #[arg(long)]
    from_application: String,
    /// The application (lease table) to copy to; created if missing.
    #[arg(long)]
    to_application: String,
    /// The source fleet's failover time (its `failover_time`): the source table is watched
    /// for it (10 s at least) and a second, and the copy refused if anything in it moves.
    /// Required but with `--force`, as for `remove-kcl-rows`: a watch shorter than the
    /// fleet's renewals would copy a running fleet's leases.
    #[arg(long, required_unless_present = "force", value_parser = humantime::parse_duration)]
    failover_time: Option<Duration>,
    /// Copy even if the source fleet is running, without watching: the copy is then a
    /// snapshot, and the new fleet repeats (at least once) what the old one does after it.
    #[arg(long)]
    force: bool,
    /// Refused but for `dynamodb` (the default): copy works on DynamoDB lease tables only.
    #[command(flatten)]
    leases: crate::lease_store::StoreArgs,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    args.leases.dynamodb_only(
        "copy",
        "it copies one DynamoDB table's rows into another's; in Postgres every application's \
         rows share kcl_leases",
    )?;
    anyhow::ensure!(
        args.from_application != args.to_application,
        "--from-application and --to-application are the same table"
    );
    let from = crate::store(sdk, &args.from_application);
    let to = kcl_aws::DynamoDbLeaseStore::new(sdk, args.to_application.clone());
    let leases = if args.force {
        report(&format!(
            "--force: not watching whether a fleet runs on {}; if one does, this is a snapshot and {}'s fleet repeats what it does after it",
            args.from_application, args.to_application
        ));
        from.list().await?
    } else {
        stopped(&from, &args).await?
    };
    to.ensure_table(TableFeatures::NONE).await?;
    let (mut copied, mut kept) = (0, Vec::new());
    for lease in leases.iter().filter(|l| !is_coordination_key(&l.key)) {
        if to.create(&unowned(lease)).await? {
            copied += 1;
        } else {
            kept.push(lease.key.to_string());
        }
    }
    report(&format!(
        "copied {copied} lease(s) from {} to {}",
        args.from_application, args.to_application
    ));
    if !kept.is_empty() {
        report(&format!(
            "left as they were ({} already has them): {}",
            args.to_application,
            kept.join(", ")
        ));
    }
    let unreadable = from.unreadable();
    if !unreadable.is_empty() {
        report(&format!(
            "not copied: {} row(s) that cannot be read",
            unreadable.len()
        ));
    }
    Ok(())
}

/// The source table's rows once a watch saw nothing move in it; an error naming what moved
/// otherwise.
async fn stopped(from: &impl LeaseStore, args: &Args) -> anyhow::Result<Vec<Lease>> {
    let failover_time = args
        .failover_time
        .context("--failover-time: the source fleet's failover time (or --force)")?;
    report(&format!(
        "watching every row of {} for {} (the failover time, 10 s at least, and a second) to make sure its fleet has stopped",
        args.from_application,
        humantime::format_duration(liveness::watch_time(failover_time))
    ));
    match liveness::watch(from, failover_time).await? {
        Seen::Still(rows) => Ok(rows),
        Seen::Moved(changes, after) => anyhow::bail!(
            "{}. Nothing copied: stop its workers first (or --force, for a snapshot that {}'s fleet would repeat from)",
            liveness::describe(&args.from_application, &changes, after),
            args.to_application
        ),
    }
}

/// `lease`'s progress and lineage in a fresh, unowned row.
fn unowned(lease: &Lease) -> Lease {
    let mut row = Lease::new(lease.key.clone(), lease.checkpoint.clone());
    row.pending_checkpoint.clone_from(&lease.pending_checkpoint);
    row.parent_shard_ids.clone_from(&lease.parent_shard_ids);
    row.child_shard_ids.clone_from(&lease.child_shard_ids);
    row.hash_key_range.clone_from(&lease.hash_key_range);
    row.start_timestamp = lease.start_timestamp;
    row
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}
