//! `kcl-admin`: what an operator reaches for instead of the DynamoDB console, on the same AWS
//! configuration and endpoints as the worker (the standard credential chain, `AWS_REGION`,
//! `AWS_ENDPOINT_URL_KINESIS`, `AWS_ENDPOINT_URL_DYNAMODB`, …).
//!
//! - `leases`: every shard with its lease (owner, checkpoint, counter, whether it moves,
//!   parents, open or closed) and how far its checkpoint is behind the stream (a Kinesis
//!   stream, or a DynamoDB table's with `--source dynamodb-streams`), and the drain rows;
//! - `reset`: moves checkpoints, safe while the fleet runs (see [`kcl_core::admin`]);
//!   `--dry-run` says about how many records it replays or skips;
//! - `release`: drains a worker before maintenance (see [`kcl_core::admin::release`]), or
//!   undoes that (`--undo`);
//! - `copy`: checkpoints to another application's table (a rename), refused while the
//!   source fleet runs unless `--force`;
//! - `remove-kcl-rows`: deletes kcl's own rows (leader, standby, heartbeats, singletons)
//!   once the fleet has stopped (seen by watching every row of the table), before KCL Java
//!   takes the table back;
//!
//! `leases` and `reset` refuse a stream the table's leases are not of (`belongs`).
//! - `dead-letters list|show|redrive`: the records a failure policy gave up on, where the
//!   fleet's dead-letter sink put them, and back into their stream.
//!
//! `leases`, `reset` and `release` also run on leases in Postgres, `--lease-store
//! postgres://…` (or `KCL_LEASE_STORE`): generic over [`kcl_core::LeaseStore`], they read
//! and write the application's rows of `kcl_leases` and Kinesis as before; `copy` and
//! `remove-kcl-rows` refuse it (`lease_store`).
//!
//! Anchored on `kafka-consumer-groups --describe / --reset-offsets`, which users know.

mod belongs;
mod cleanup;
mod copy;
mod dead_letters;
mod drains;
mod lease_store;
mod leases;
mod liveness;
mod release;
mod replay;
mod reset;
mod reset_to;
mod sequence;
mod source;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Operator commands for a kcl (or KCL Java) lease table.
#[derive(Debug, Parser)]
#[command(name = "kcl-admin", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every shard of the stream with its lease, and how far behind its checkpoint is.
    Leases(leases::Args),
    /// Moves the checkpoints of some shards (replay after a bug), safe while the fleet runs.
    Reset(reset::Args),
    /// Drains a worker before maintenance: it hands its leases to the others and takes no
    /// more until it starts again (--undo: takes work again).
    Release(release::Args),
    /// Copies checkpoints to another application's lease table (an application rename),
    /// once the source fleet has stopped (or with --force).
    Copy(copy::Args),
    /// Deletes kcl's own rows from the lease table, once every worker has stopped (before
    /// KCL Java takes the table back): refused, deleting nothing, while any row moves.
    RemoveKclRows(cleanup::Args),
    /// Dead letters (records a failure policy gave up on) in an SQS queue, S3, a Kinesis
    /// stream or a file: list them, show one, redrive them into their stream.
    DeadLetters(dead_letters::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // kcl-aws's warnings (a trimmed checkpoint, a disabled stream, a table change given up)
    // on stderr, as a worker logs them; `RUST_LOG` for more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln_error(&anyhow::Error::new(e));
            return ExitCode::FAILURE;
        }
    };
    // Errors name the command, before the operation that failed in it.
    let name = match &cli.command {
        Command::Leases(_) => "leases",
        Command::Reset(_) => "reset",
        Command::Release(_) => "release",
        Command::Copy(_) => "copy",
        Command::RemoveKclRows(_) => "remove-kcl-rows",
        Command::DeadLetters(_) => "dead-letters",
    };
    let result = runtime.block_on(async {
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        match cli.command {
            Command::Leases(args) => leases::run(&sdk, args).await,
            Command::Reset(args) => reset::run(&sdk, args).await,
            Command::Release(args) => release::run(&sdk, args).await,
            Command::Copy(args) => copy::run(&sdk, args).await,
            Command::RemoveKclRows(args) => cleanup::run(&sdk, args).await,
            Command::DeadLetters(args) => dead_letters::run(&sdk, args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln_error(&e.context(name));
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::print_stderr)]
fn eprintln_error(e: &anyhow::Error) {
    eprintln!("kcl-admin: {e:#}");
}

/// The lease table of `application` (its name), changed by nobody but these commands.
fn store(sdk: &aws_config::SdkConfig, application: &str) -> kcl_aws::DynamoDbLeaseStore {
    kcl_aws::DynamoDbLeaseStore::new(sdk, application.to_owned())
        .with_table_setup(kcl_aws::TableSetup::External)
}
