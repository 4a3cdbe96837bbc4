//! `kcl-admin remove-kcl-rows`: the way back to KCL Java. kcl keeps its own rows in the lease
//! table (`kcl-coordination/…`: the leader and standby, heartbeats, singletons). KCL Java
//! 3.1.3 cannot tell them from leases (it has no `entityType`): it would start a record
//! processor for each, write `SHARD_END` into them and delete them as shards the stream does
//! not have. Once the kcl fleet has stopped, this deletes them, each conditionally on the
//! counter it read, after watching that no counter moves for the fleet's failover time (a
//! running kcl worker renews them at least every half of it).

use std::time::Duration;

use kcl_core::LeaseStore;
use kcl_core::singleton::is_coordination_key;

/// The shortest failover time the watch assumes: kcl's default.
const MIN_WATCH: Duration = Duration::from_secs(10);

/// Arguments of `kcl-admin remove-kcl-rows`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name.
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// The fleet's failover time (its `failover_time`, 10 s by default): a running worker
    /// renews its rows at least every half of it, so the command watches the rows for the
    /// failover time and a second before it deletes them (for 10 s and a second at least:
    /// a shorter value, such as 0s, is taken as 10 s). Required: a watch shorter than the
    /// fleet's renewals would delete a running fleet's rows.
    #[arg(long, value_parser = humantime::parse_duration)]
    failover_time: Duration,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    let store = crate::store(sdk, &args.application_name);
    let rows: Vec<_> = store
        .list()
        .await?
        .into_iter()
        .filter(|l| is_coordination_key(&l.key))
        .collect();
    if rows.is_empty() {
        report("no kcl rows: nothing to remove");
        return Ok(());
    }
    // Never shorter than kcl's default failover time: a mistyped value (0s, 1ms) must not
    // make a default fleet's renewals invisible.
    let observe = args.failover_time.max(MIN_WATCH) + Duration::from_secs(1);
    report(&format!(
        "watching {} kcl row(s) for {} (the failover time, 10 s at least, and a second) to make sure the kcl fleet has stopped",
        rows.len(),
        humantime::format_duration(observe)
    ));
    tokio::time::sleep(observe).await;
    let now = store.list().await?;
    let moved: Vec<String> = rows
        .iter()
        .filter(|r| now.iter().any(|n| n.key == r.key && n.counter != r.counter))
        .map(|r| r.key.to_string())
        .collect();
    anyhow::ensure!(
        moved.is_empty(),
        "the kcl fleet is still running ({} moved): stop every kcl worker first",
        moved.join(", ")
    );
    for row in &rows {
        store.delete(row).await?;
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
