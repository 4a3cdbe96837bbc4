//! `kcl-admin release`: drains a worker before maintenance, through
//! [`kcl_core::admin::release`], then waits until it holds nothing.

use std::time::{Duration, Instant};

use kcl_core::singleton::is_coordination_key;
use kcl_core::{LeaseStore, WorkerId};

/// Arguments of `kcl-admin release`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name.
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// The worker to drain (its `leaseOwner`, the worker id).
    #[arg(long)]
    worker: String,
    /// How long to wait until it holds nothing.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    let store = crate::store(sdk, &args.application_name);
    let worker = WorkerId::new(args.worker.clone());
    let asked = kcl_core::admin::release(&store, &worker).await?;
    for (shard, to) in &asked {
        report(&format!("{shard}: {worker} asked to hand it to {to}"));
    }
    let started = Instant::now();
    loop {
        let held: Vec<String> = store
            .list()
            .await?
            .into_iter()
            .filter(|l| !is_coordination_key(&l.key) && l.is_owned_by(&worker) && !l.is_finished())
            .map(|l| l.key.to_string())
            .collect();
        if held.is_empty() {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < args.timeout,
            "{worker} still holds {} after {}: is it running? (a stopped worker's leases move after the failover time)",
            held.join(", "),
            humantime::format_duration(args.timeout)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report(&format!(
        "{worker} holds nothing and takes nothing until it starts again: stop it for maintenance now"
    ));
    Ok(())
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}
