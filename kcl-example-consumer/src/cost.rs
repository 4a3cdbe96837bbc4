//! `cost`: the lease table's monthly bill for a fleet, by mode, from `kcl_aws::cost`.

use std::process::ExitCode;

use crate::cli::CostArgs;

/// Prints the bill of every mode and KCL Java 3.x's as a table.
#[cfg(feature = "aws")]
#[allow(clippy::print_stdout)]
pub(crate) fn print(args: &CostArgs) -> ExitCode {
    use kcl_aws::cost::{Fleet, Load, Prices, estimate, kcl_java};
    use kcl_core::{Coordination, Liveness};

    if args.shards == 0 || args.workers == 0 || args.failover_time.is_zero() {
        return crate::fail(
            "--shards, --workers and --failover-time must be above zero",
            2,
        );
    }
    let fleet = Fleet::new(args.shards, args.workers)
        .failover_time(args.failover_time)
        .row_bytes(args.row_bytes);
    let prices = Prices::default();
    let java = kcl_java(&fleet);
    let bill = java.dollars_per_month(&prices);
    let modes: [(&str, Load); 4] = [
        (
            "leader, per-lease renewals (the default)",
            estimate(&fleet, Coordination::Leader, Liveness::PerLease),
        ),
        (
            "leader, heartbeats (kcl workers only)",
            estimate(&fleet, Coordination::Leader, Liveness::Heartbeat),
        ),
        (
            "every worker reads the table",
            estimate(&fleet, Coordination::EveryWorker, Liveness::PerLease),
        ),
        ("KCL Java 3.x", java),
    ];
    println!(
        "Lease table of {} shards and {} workers, {:?} failover, rows of {} bytes; an idle \
         stream, on-demand prices of us-east-1 (${}/${} per million read/write units, ${} per \
         million stream reads):\n",
        args.shards,
        args.workers,
        args.failover_time,
        args.row_bytes,
        prices.read_unit,
        prices.write_unit,
        prices.stream_read
    );
    println!(
        "| mode | write units/s | read units/s | stream reads/s | $ per month | vs KCL Java |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (mode, load) in modes {
        let dollars = load.dollars_per_month(&prices);
        println!(
            "| {mode} | {:.2} | {:.2} | {:.2} | {dollars:.2} | {:.3}× |",
            load.write_units,
            load.read_units,
            load.stream_reads,
            dollars / bill
        );
    }
    println!(
        "\nThe model and its checks: kcl-aws/src/cost.rs; measured figures: docs/benchmarks.md."
    );
    ExitCode::SUCCESS
}

/// Without the AWS backends there is no cost model to consult.
#[cfg(not(feature = "aws"))]
pub(crate) fn print(args: &CostArgs) -> ExitCode {
    let _ = args;
    crate::fail(
        "this build has no AWS backends: build with `--features aws`",
        2,
    )
}
