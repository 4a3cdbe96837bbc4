//! `kcl-admin remove-kcl-rows`: the way back to KCL Java. kcl keeps its own rows in the lease
//! table (`kcl-coordination/…`: the leader and standby, heartbeats, singletons). KCL Java
//! 3.1.3 cannot tell them from leases (it has no `entityType`): it would start a record
//! processor for each, write `SHARD_END` into them and delete them as shards the stream does
//! not have. Once the kcl fleet has stopped, this deletes them, each conditionally on the
//! counter it read, after watching that no counter moves (a running kcl worker renews them).

use std::time::Duration;

use kcl_core::LeaseStore;
use kcl_core::singleton::is_coordination_key;

/// Arguments of `kcl-admin remove-kcl-rows`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name.
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// How long to watch that no kcl row moves (a running worker renews its rows every
    /// third of its failover time).
    #[arg(long, default_value = "12s", value_parser = humantime::parse_duration)]
    observe: Duration,
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
    report(&format!(
        "watching {} kcl row(s) for {} to make sure the kcl fleet has stopped",
        rows.len(),
        humantime::format_duration(args.observe)
    ));
    tokio::time::sleep(args.observe).await;
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
