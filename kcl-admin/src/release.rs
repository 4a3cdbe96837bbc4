//! `kcl-admin release`: drains a worker before maintenance, through
//! [`kcl_core::admin::release`], then waits until it holds nothing and another worker took
//! each lease it handed over (see [`Taken`]). `release --undo` deletes the drain row
//! ([`kcl_core::admin::undo_release`]): the worker takes work again, or the row a worker
//! left when it started again under another id is gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kcl_core::singleton::is_coordination_key;
use kcl_core::{LeaseStore, ShardId, WorkerId};

use crate::lease_store::Store;

/// Arguments of `kcl-admin release`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The application: the lease table's name (with `--lease-store postgres://…`, whose
    /// rows of kcl_leases).
    #[arg(long, env = "KCL_APPLICATION_NAME")]
    application_name: String,
    /// Where the leases are.
    #[command(flatten)]
    leases: crate::lease_store::StoreArgs,
    /// The worker to drain (its `leaseOwner`, the worker id).
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    worker: String,
    /// How long to wait until it holds nothing and its leases were taken.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The fleet's failover time: a worker handed a lease takes it, or gives it back for
    /// want of room, within half of it (a lease still named after that counts as taken).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    failover_time: Duration,
    /// Undo a release: delete the worker's drain row (`kcl-coordination/drain/<worker>`).
    /// A running worker takes work again at its next read of the table; a row left by a
    /// worker that started again under another id (`leases` lists such rows) is gone.
    #[arg(long)]
    undo: bool,
}

pub(crate) async fn run(sdk: &aws_config::SdkConfig, args: Args) -> anyhow::Result<()> {
    match args.leases.open(sdk, &args.application_name).await? {
        Store::DynamoDb(store) => run_on(&args, &store).await,
        Store::Postgres(store) => run_on(&args, &store).await,
    }
}

async fn run_on(args: &Args, store: &impl LeaseStore) -> anyhow::Result<()> {
    let worker = WorkerId::new(args.worker.clone());
    if args.undo {
        let key = kcl_core::admin::drain_row(&worker);
        anyhow::ensure!(
            kcl_core::admin::undo_release(store, &worker).await?,
            "{worker} has no drain row ({key}): nothing to undo"
        );
        report(&format!(
            "deleted {key}: {worker}, if it runs, takes work again at its next read of the table"
        ));
        return Ok(());
    }
    let asked = kcl_core::admin::release(store, &worker).await?;
    for (shard, to) in &asked {
        report(&format!("{shard}: {worker} asked to hand it to {to}"));
    }
    let started = Instant::now();
    let mut taken = Taken::default();
    // Done when the worker holds nothing and every lease it was asked to hand over is taken
    // by another worker: a row naming a worker at its max_leases is given back, not taken.
    loop {
        let leases = store.list().await?;
        let held: Vec<String> = leases
            .iter()
            .filter(|l| !is_coordination_key(&l.key) && l.is_owned_by(&worker) && !l.is_finished())
            .map(|l| l.key.to_string())
            .collect();
        let waiting = taken.waiting(&worker, &asked, &leases, args.failover_time);
        if held.is_empty() && waiting.is_empty() {
            break;
        }
        if started.elapsed() >= args.timeout {
            anyhow::ensure!(
                held.is_empty(),
                "{worker} still holds {} after {}: is it running? (a stopped worker's leases \
                 move after the failover time)",
                held.join(", "),
                humantime::format_duration(args.timeout)
            );
            anyhow::bail!(
                "{worker} holds nothing, but nobody holds {} {} later: the workers asked gave \
                 them back (at their max_leases, or draining) and no other has room. Start a \
                 worker or raise max_leases; `kcl-admin leases` shows them",
                waiting.join(", "),
                humantime::format_duration(args.timeout)
            );
        }
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

/// Whether the leases handed over were taken: a row naming another worker counts once that
/// worker has written it since (its take, a renewal, a checkpoint), or once it has named it
/// for a failover time (a worker at its max_leases gives a row back within half of one).
#[derive(Default)]
struct Taken {
    /// The owner, counter and time each lease was first seen with after leaving the worker.
    first: BTreeMap<ShardId, (WorkerId, u64, Instant)>,
}

impl Taken {
    /// The leases of `asked` not yet taken by a worker other than `worker`.
    fn waiting(
        &mut self,
        worker: &WorkerId,
        asked: &[(ShardId, WorkerId)],
        leases: &[kcl_core::Lease],
        failover_time: Duration,
    ) -> Vec<String> {
        let mut waiting = Vec::new();
        for (shard, _) in asked {
            let Some(row) = leases.iter().find(|l| l.key == *shard) else {
                continue; // deleted: finished and cleaned up
            };
            let taken = match row.owner.as_ref().filter(|o| *o != worker) {
                _ if row.is_finished() => true,
                None => false,
                Some(owner) => match self.first.get(shard) {
                    Some((seen, counter, at)) if seen == owner => {
                        row.counter > *counter || at.elapsed() >= failover_time
                    }
                    _ => {
                        let first = (owner.clone(), row.counter, Instant::now());
                        self.first.insert(shard.clone(), first);
                        false
                    }
                },
            };
            if !taken {
                waiting.push(shard.to_string());
            }
        }
        waiting
    }
}
