//! `kcl-admin remove-kcl-rows`: the way back to KCL Java. kcl keeps its own rows in the lease
//! table (`kcl-coordination/…`: the leader and standby, heartbeats, drain requests, the
//! fleet-signals row, singletons). KCL Java 3.1.3 cannot tell them from leases (it has no
//! `entityType`): it would start a record processor for each, write `SHARD_END` into them and
//! delete them as shards the stream does not have. Once the fleet has stopped, this deletes
//! them, each conditionally on the counter it read.
//!
//! Whether the fleet has stopped is seen by watching the whole table for its failover time
//! and a second ([`crate::liveness`]): in any mode something a running worker writes moves
//! (its shard leases, or its heartbeat row, or the role rows), so anything that changes
//! refuses the command, naming it, and nothing is deleted.

use std::time::Duration;

use kcl_core::LeaseStore;
use kcl_core::singleton::is_coordination_key;

use crate::liveness::{self, Seen};

/// Arguments of `kcl-admin remove-kcl-rows`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name.
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// The fleet's failover time (its `failover_time`, 10 s by default): a running worker
    /// writes a row at least every half of it (a lease, or its heartbeat row), so the command
    /// watches the whole table for the failover time and a second before it deletes anything
    /// (for 10 s and a second at least: a shorter value, such as 0s, is taken as 10 s).
    /// Required: a watch shorter than the fleet's renewals would delete a running fleet's
    /// rows.
    #[arg(long, value_parser = humantime::parse_duration)]
    failover_time: Duration,
    /// Refused but for `dynamodb` (the default): the way back to KCL Java is from a DynamoDB
    /// lease table.
    #[command(flatten)]
    leases: crate::lease_store::StoreArgs,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    args.leases.dynamodb_only(
        "remove-kcl-rows",
        "it readies a DynamoDB table for KCL Java, which keeps its leases nowhere else",
    )?;
    let store = crate::store(sdk, &args.application_name);
    let watch = liveness::watch_time(args.failover_time);
    report(&format!(
        "watching every row of {} for {} (the failover time, 10 s at least, and a second) to make sure no worker is running",
        args.application_name,
        humantime::format_duration(watch)
    ));
    let rows = match liveness::watch(&store, args.failover_time).await? {
        Seen::Still(rows) => rows,
        Seen::Moved(changes, after) => anyhow::bail!(
            "{}. Nothing deleted: stop every worker (kcl or KCL Java) first, then run this again",
            liveness::describe(&args.application_name, &changes, after)
        ),
    };
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|l| is_coordination_key(&l.key))
        .collect();
    if rows.is_empty() {
        report("no kcl rows: nothing to remove");
        return Ok(());
    }
    for (n, row) in rows.iter().enumerate() {
        // Conditional on the counter the watch read: a row written since is a worker that
        // started meanwhile.
        if let Err(e) = store.delete(row).await {
            anyhow::bail!(
                "{} changed after the watch (a worker started?): not deleted ({}); {n} of {} deleted before it. Stop every worker and run this again",
                row.key,
                kcl_core::error_chain(&e),
                rows.len()
            );
        }
        report(&format!("deleted {}", row.key));
    }
    report(
        "done: KCL Java can take the table back (kcl's other attributes, such as handoffTo, it ignores)",
    );
    Ok(())
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}
