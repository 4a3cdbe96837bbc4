//! Fleet benchmarks against the Docker-free emulators, with workers as real processes (the
//! `kcl-test-worker` binary built next to this one). Prints markdown tables; each figure is
//! the median of `--runs` runs (default 3), measured in one sitting.
//!
//! ```sh
//! eval "$(localstack/emulator up)"
//! cargo build --release -p kcl-integration-tests --bins && target/release/kcl-bench
//! ```
//!
//! - **Failover**: two workers hold 4 shards, a producer writes to every shard every 100 ms;
//!   one worker is killed (SIGKILL) or stopped (SIGTERM), and the figure is the time until the
//!   survivor has delivered a record written to each of the victim's shards, per
//!   coordination mode, liveness mode, victim and failover time. Runs signal at phases
//!   spread over one taker interval (the fleet's cycles are periodic).
//! - **Footprint**: start → first record on a fresh table; CPU seconds to consume 20,000
//!   records of 100 bytes from 4 shards; peak RSS of a worker holding 100 shards.
//! - **End to end**: records per second through a worker against a bare `GetRecords` loop
//!   over the same records (same batch size), on a fresh and on an existing lease table.
//!
//! - **Latency** (`--only latency`): put → `process_records` with polling (pause after an empty
//!   read 1 s, the default, and 200 ms) and with enhanced fan-out.
//!
//! - **RSS by shards** (`--only rss`, not in the default run): peak RSS of a worker holding 1,
//!   25 and 100 idle shards, to tell what a worker costs at rest from what a shard adds.
//!
//! - **Bill** (`--only bill`, not in the default run; also needs `cargo build [--release] -p
//!   kcl-example-consumer --bins --examples`): the DynamoDB requests of an idle minute of five
//!   README examples over 8 shards, then of five binaries with heartbeats, through a counting
//!   proxy (`kcl_integration_tests::meter`), priced on demand.
//!   `--meter http://UPSTREAM [--meter-port P] [--after S] [--window S]` runs only the proxy,
//!   for another program (KCL Java: `dynamoDBEndpoint = http://127.0.0.1:P`), and prints the
//!   bill of the `window` seconds (default 60) after the first `after` (default 180).
//!
//! - **MultiLangDaemon** (`--only multilang`, not in the default run; also needs `cargo build
//!   --release -p kcl-multilang`, and `java` with kclpy-ext's jars for KCL Java's rows): the
//!   `kcl-multilang` binary against KCL Java 3.1.3's daemon with the same Python child: start
//!   → first record, drain rate, the daemon's and the children's memory, failover after a
//!   SIGKILL.
//! - **Migration** (`--only migration`, as `multilang` needs): a lease table from KCL Java's
//!   daemon to `kcl-multilang` and back; fails if a record is lost or a checkpointed one
//!   delivered again.
//!
//! - **Exactly-once outputs** (`--only exactly-once`, not in the default run; no worker
//!   process: the worker runs in this one): a processor putting one item per record and
//!   committing them with its checkpoint (`commit_outputs`) against the same puts made plain
//!   and `checkpoint()`, at 1 and 8 shards: records/s, commit latency, write units. With
//!   `KCL_POSTGRES_URL`, the same outputs as `INSERT`s into Postgres too, committed with the
//!   lease row (leases in Postgres) or through a `PostgresSink` (leases in DynamoDB).
//!
//! Timing comes from the workers' journals (wall-clock milliseconds, one machine), CPU and
//! memory from `/proc`.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bill;
mod exactly_once;
mod failover;
mod footprint;
mod latency;
mod migration;
mod multilang;

use std::time::Duration;

use anyhow::Context as _;

/// What to run, from the command line.
struct Options {
    runs: usize,
    only: Option<String>,
    /// Records of each end-to-end run.
    e2e_records: usize,
    /// `--meter`: only the counting proxy, in front of this endpoint.
    meter: Option<String>,
    meter_port: u16,
    after: Duration,
    window: Duration,
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options {
        runs: 3,
        only: None,
        e2e_records: footprint::E2E_RECORDS,
        meter: None,
        meter_port: 0,
        after: Duration::from_secs(180),
        window: Duration::from_secs(60),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => {
                options.runs = args
                    .next()
                    .context("--runs N")?
                    .parse()
                    .context("--runs N")?;
            }
            "--e2e-records" => {
                options.e2e_records = args
                    .next()
                    .context("--e2e-records N")?
                    .parse()
                    .context("--e2e-records N")?;
            }
            "--only" => {
                options.only = Some(args.next().context(
                    "--only failover|footprint|e2e|rss|latency|bill|multilang|migration|exactly-once",
                )?);
            }
            "--meter" => options.meter = Some(args.next().context("--meter http://host:port")?),
            "--meter-port" => {
                options.meter_port = args.next().context("--meter-port P")?.parse()?;
            }
            "--after" => {
                options.after = Duration::from_secs(args.next().context("--after S")?.parse()?);
            }
            "--window" => {
                options.window = Duration::from_secs(args.next().context("--window S")?.parse()?);
            }
            other => {
                anyhow::bail!(
                    "unknown argument {other} (--runs N, --e2e-records N, --only failover|footprint|e2e|rss|latency|bill|multilang|migration|exactly-once, --meter URL [--meter-port P] [--after S] [--window S])"
                )
            }
        }
    }
    Ok(options)
}

/// The worker binary, next to this one.
fn worker_binary() -> anyhow::Result<String> {
    let me = std::env::current_exe()?;
    let worker = me.with_file_name("kcl-test-worker");
    anyhow::ensure!(
        worker.exists(),
        "{} is missing: build it with `cargo build [--release] -p kcl-integration-tests --bins`",
        worker.display()
    );
    Ok(worker.to_string_lossy().into_owned())
}

/// KiB of `field` (`VmHWM`, `VmRSS`) in `/proc/PID/status`.
pub(crate) fn memory(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The median of `values` (sorted in place).
fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn seconds(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let options = options()?;
    if let Some(upstream) = &options.meter {
        return bill::meter_only(upstream, options.meter_port, options.after, options.window).await;
    }
    if options.only.as_deref() == Some("exactly-once") {
        return exactly_once::table(options.runs).await;
    }
    let worker = worker_binary()?;
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    println!(
        "kcl-bench, {} profile, {}, {} runs each",
        profile,
        chrono::Utc::now().format("%Y-%m-%d"),
        options.runs
    );
    let wanted = |name: &str| options.only.as_deref().is_none_or(|o| o == name);
    if wanted("failover") {
        failover::table(&worker, options.runs).await?;
    }
    if wanted("footprint") {
        footprint::table(&worker, options.runs).await?;
    }
    if wanted("footprint") || options.only.as_deref() == Some("e2e") {
        footprint::e2e_table(&worker, options.runs, options.e2e_records).await?;
    }
    if wanted("latency") {
        latency::table(&worker, options.runs).await?;
    }
    if options.only.as_deref() == Some("rss") {
        footprint::rss_table(&worker, options.runs).await?;
    }
    if options.only.as_deref() == Some("migration") {
        migration::check().await?;
    }
    if options.only.as_deref() == Some("multilang") {
        multilang::table(options.runs).await?;
    }
    if options.only.as_deref() == Some("bill") {
        bill::table(options.runs).await?;
    }
    Ok(())
}
