//! The bill of an idle minute, read off real requests: five processes on an 8-shard stream,
//! their DynamoDB and DynamoDB Streams requests through the [`Meter`]: the README's example
//! (`examples/aws_consumer.rs`, every default), and the binary with heartbeats
//! (`kcl-example-consumer run --liveness heartbeat`). With `--meter`, any other program pointed
//! at the meter (KCL Java's MultiLangDaemon with `dynamoDBEndpoint`) is measured the same way.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use kcl_core::{LeaseStore as _, ShardId};
use kcl_integration_tests::{Context, count_by_owner, wait_until};
use tokio::time::Instant;

use kcl_integration_tests::meter::{Cost, Meter};

const SHARDS: usize = 8;
const WORKERS: usize = 5;
/// After the fleet settled, before the window: start-up reads and the first full reads of the
/// leader and the standby are over.
const QUIET: Duration = Duration::from_secs(30);
/// The measured window.
const WINDOW: Duration = Duration::from_secs(60);

/// What runs as the five processes.
#[derive(Debug, Clone, Copy)]
enum Program {
    /// `target/<profile>/examples/aws_consumer STREAM TABLE`.
    ReadmeExample,
    /// `target/<profile>/kcl-example-consumer run … --liveness heartbeat`.
    BinaryWithHeartbeats,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Self::ReadmeExample => "the README's example (every default)",
            Self::BinaryWithHeartbeats => "kcl-example-consumer run --liveness heartbeat",
        }
    }

    /// The command for one process on `ctx`'s stream and table.
    fn command(self, ctx: &Context) -> anyhow::Result<Command> {
        let folder = std::env::current_exe()?;
        let folder = folder.parent().context("no folder")?;
        let (path, build) = match self {
            Self::ReadmeExample => (
                folder.join("examples").join("aws_consumer"),
                "-p kcl-example-consumer --example aws_consumer",
            ),
            Self::BinaryWithHeartbeats => (
                folder.join("kcl-example-consumer"),
                "-p kcl-example-consumer",
            ),
        };
        anyhow::ensure!(
            path.exists(),
            "{} is missing: `cargo build [--release] {build}`",
            path.display()
        );
        let mut command = Command::new(path);
        match self {
            Self::ReadmeExample => command.args([&ctx.stream, &ctx.table]),
            Self::BinaryWithHeartbeats => command
                .args([
                    "run",
                    "--stream",
                    &ctx.stream,
                    "--application-name",
                    &ctx.table,
                ])
                .args(["--listen", "127.0.0.1:0", "--liveness", "heartbeat"]),
        };
        Ok(command)
    }
}

/// Kills the examples when dropped.
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One idle minute of `program`, five processes over eight shards: costs by request kind (the
/// table's own name replaced by `lease table`).
async fn run_once(program: Program) -> anyhow::Result<BTreeMap<(String, String, bool), Cost>> {
    let ctx = Context::new("bill")
        .await?
        .context("the emulators are not running: eval \"$(localstack/emulator up)\"")?;
    ctx.create_stream(i32::try_from(SHARDS)?).await?;
    let meter = Meter::start(&ctx.endpoints.dynamodb, 0).await?;
    let mut fleet = Fleet(Vec::new());
    for _ in 0..WORKERS {
        let child = program
            .command(&ctx)?
            .envs(ctx.worker_env())
            .env("AWS_ENDPOINT_URL_DYNAMODB", meter.url())
            .env("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", meter.url())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        fleet.0.push(child);
    }
    let roles = [
        "kcl-coordination/worker-leader",
        "kcl-coordination/worker-standby",
    ];
    wait_until(
        "five workers holding the 8 leases, a leader and a standby",
        Duration::from_secs(120),
        Duration::from_millis(500),
        async || {
            let owners = ctx.owners().await.unwrap_or_default();
            let by = count_by_owner(&owners);
            let store = ctx.store();
            let mut led = true;
            for role in roles {
                let row = store.get(&ShardId::new(role)).await.ok().flatten();
                led &= row.is_some_and(|r| r.owner.is_some());
            }
            Ok(led
                && owners.len() == SHARDS
                && by.len() == WORKERS
                && by.keys().all(Option::is_some))
        },
    )
    .await?;
    tokio::time::sleep(QUIET).await;
    let from = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let by = meter.since(from);
    drop(fleet);
    Ok(by
        .into_iter()
        .map(|((operation, resource, consistent), cost)| {
            let on = resource.replacen(&ctx.table, "lease table", 1);
            ((operation, on, consistent), cost)
        })
        .collect())
}

/// Prints the bill of one idle minute of each program, the median run's by total cost, of
/// `runs`.
pub(crate) async fn table(runs: usize) -> anyhow::Result<()> {
    for program in [Program::ReadmeExample, Program::BinaryWithHeartbeats] {
        program_table(program, runs).await?;
    }
    Ok(())
}

async fn program_table(program: Program, runs: usize) -> anyhow::Result<()> {
    let mut measured = Vec::new();
    for run in 0..runs.max(1) {
        eprintln!("bill: {}, run {} of {runs}", program.name(), run + 1);
        measured.push(run_once(program).await?);
    }
    let total = |by: &BTreeMap<(String, String, bool), Cost>| {
        by.values()
            .map(|c| c.monthly(WINDOW.as_secs_f64()))
            .sum::<f64>()
    };
    measured.sort_by(|a, b| total(a).total_cmp(&total(b)));
    let totals: Vec<String> = measured
        .iter()
        .map(|m| format!("${:.2}", total(m)))
        .collect();
    let median = &measured[measured.len() / 2];
    println!(
        "\n### Idle minute: {}, {WORKERS} processes, {SHARDS} shards (median of {runs}: {})\n",
        program.name(),
        totals.join(", ")
    );
    print_costs(median, WINDOW);
    Ok(())
}

/// Prints costs by request kind, with totals and dollars per month.
pub(crate) fn print_costs(by: &BTreeMap<(String, String, bool), Cost>, window: Duration) {
    println!(
        "| request | on | consistent | requests/min | read units | write units | stream reads | $ per month |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    let minutes = window.as_secs_f64() / 60.0;
    let mut sum = Cost::default();
    for ((operation, on, consistent), cost) in by {
        #[allow(clippy::cast_precision_loss)]
        let per_minute = cost.requests as f64 / minutes;
        println!(
            "| {operation} | {on} | {} | {per_minute:.1} | {:.1} | {:.1} | {} | {:.3} |",
            if *consistent { "yes" } else { "" },
            cost.read_units / minutes,
            cost.write_units / minutes,
            cost.stream_reads,
            cost.monthly(window.as_secs_f64()),
        );
        sum.requests += cost.requests;
        sum.read_units += cost.read_units;
        sum.write_units += cost.write_units;
        sum.stream_reads += cost.stream_reads;
    }
    #[allow(clippy::cast_precision_loss)]
    let per_minute = sum.requests as f64 / minutes;
    println!(
        "| **all** | | | {per_minute:.1} | {:.1} | {:.1} | {} | **{:.3}** |",
        sum.read_units / minutes,
        sum.write_units / minutes,
        sum.stream_reads,
        sum.monthly(window.as_secs_f64()),
    );
}

/// `--meter UPSTREAM`: a meter on `port` in front of `upstream` for another program; waits
/// `after`, then prints the bill of the next `window`.
pub(crate) async fn meter_only(
    upstream: &str,
    port: u16,
    after: Duration,
    window: Duration,
) -> anyhow::Result<()> {
    let meter = Meter::start(upstream, port).await?;
    println!(
        "meter: point the program's DynamoDB endpoint at {}",
        meter.url()
    );
    tokio::time::sleep(after).await;
    let from = Instant::now();
    tokio::time::sleep(window).await;
    print_costs(&meter.since(from), window);
    Ok(())
}
