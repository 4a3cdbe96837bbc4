//! Deterministic fleet simulation.
//!
//! Each seed runs a whole fleet in one process — up to 5 workers over up to 32 shards on the
//! in-memory backends, on a current-thread runtime with paused time. The stream first gets a
//! past (records, sometimes reshards), and the fleet starts at TRIM_HORIZON, LATEST or
//! AT_TIMESTAMP. Then, while a producer keeps writing, a seeded scheduler crashes workers,
//! freezes whole worker processes (every task and timer, as SIGSTOP does) past the failover
//! time, adds and removes workers, makes the store fail, throttle and answer late, partitions
//! single workers, expires iterators, makes processors fail, ages closed shards out of the
//! stream, and splits and merges shards; every fifth seed makes planned changes only (joins,
//! graceful leaves, splits, merges). Then faults stop, the fleet drains, and the run is
//! checked against the invariants in `sim/checks` (listed in the summary line) plus balance.
//! Every worker is also a candidate for a singleton task that is slow to stop.
//!
//! `cargo test -p kcl-core --test simulation` runs 200 seeds; `SIM_SEEDS=N` runs N;
//! `SIM_SEED=S` replays one seed with the same schedule.
#![allow(
    missing_docs,
    unreachable_pub,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod sim;

use sim::checks::INVARIANTS;
use sim::processor::INJECTED_PANIC;
use sim::scenario::{Outcome, Stats, simulate};

fn run_seed(seed: u64) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(simulate(seed))
}

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|s| s == INJECTED_PANIC);
        if !injected {
            default_hook(info);
        }
    }));

    if std::env::var_os("SIM_LOG").is_some() {
        // Replaying one seed with SIM_LOG=debug (an EnvFilter) shows what the workers did.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("SIM_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Ok(name) = std::env::var("SIM_MUTATION")
        && !sim::mutations::set(&name)
    {
        eprintln!("unknown mutation {name}, or built without `--features mutation-testing`");
        std::process::exit(2);
    }
    if std::env::var_os("SIM_MUTATIONS").is_some() {
        let caught = sim::mutations::run(env("SIM_MUTATION_SEEDS").unwrap_or(200), run_seeds);
        std::process::exit(i32::from(!caught));
    }
    let seeds: Vec<u64> = match (env("SIM_SEED"), env("SIM_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, n) => (0..n.unwrap_or(200)).collect(),
    };
    let results = run_seeds(&seeds);
    if report(&results) > 0 {
        std::process::exit(1);
    }
}

/// Runs `seeds` on every core; a seed that panics counts as one violation.
fn run_seeds(seeds: &[u64]) -> Vec<(u64, Outcome)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(seeds.len().max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let chunk: Vec<u64> = seeds.iter().copied().skip(t).step_by(threads).collect();
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|s| (s, guarded(s)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut results: Vec<(u64, Outcome)> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("simulation thread"))
            .collect();
        results.sort_by_key(|(s, _)| *s);
        results
    })
}

fn guarded(seed: u64) -> Outcome {
    std::panic::catch_unwind(|| run_seed(seed)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Outcome::failed(format!("panic: the run panicked: {message}"))
    })
}

/// Prints every violation and the summary line; returns the number of violations.
fn report(results: &[(u64, Outcome)]) -> usize {
    let mut violations = 0;
    let mut records = 0;
    let mut stats = Stats::default();
    for (seed, outcome) in results {
        records += outcome.records;
        stats += outcome.stats;
        if !outcome.violations.is_empty() {
            violations += outcome.violations.len();
            eprintln!("seed {seed}: {} violations", outcome.violations.len());
            for v in outcome.violations.iter().take(60) {
                eprintln!("  {v}");
            }
            eprintln!("  replay: SIM_SEED={seed} cargo test -p kcl-core --test simulation");
        }
    }
    let mut cycles: Vec<u32> = results.iter().map(|(_, o)| o.balance_cycles).collect();
    cycles.sort_unstable();
    if let (Some(median), Some(max)) = (cycles.get(cycles.len() / 2), cycles.last()) {
        eprintln!("taker cycles to a stable balance after the drain: median {median}, max {max}");
    }
    eprintln!("faults and events over all seeds: {stats:?}");
    let led_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.led > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    let heartbeat_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.heartbeat > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    let fan_out_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.fan_out > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    let multi_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.multi_stream > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    println!(
        "simulation: {} seeds ({} LATEST, {} AT_TIMESTAMP, {} planned; coordination: every-worker {} seeds {} violations, leader {} seeds ({} without a change feed) {led_violations} violations; liveness: per-lease {} seeds {} violations, heartbeat {} seeds ({} mixed with per-lease workers) {heartbeat_violations} violations; retrieval: polling {} seeds {} violations, fan-out {} seeds {fan_out_violations} violations; lease keys: single-stream {} seeds {} violations, multi-stream {} seeds {multi_violations} violations), {violations} violations of [{}], {records} records",
        results.len(),
        stats.latest,
        stats.at_timestamp,
        stats.planned,
        results.len() - stats.led,
        violations - led_violations,
        stats.led,
        stats.without_feed,
        results.len() - stats.heartbeat,
        violations - heartbeat_violations,
        stats.heartbeat,
        stats.mixed,
        results.len() - stats.fan_out,
        violations - fan_out_violations,
        stats.fan_out,
        results.len() - stats.multi_stream,
        violations - multi_violations,
        stats.multi_stream,
        INVARIANTS.join(", ")
    );
    let parallel_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.parallel > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    println!(
        "parallel simulation: {} seeds processed with Parallel ({} handler runs, {} cut short by a crash, a lost lease or a restart), {parallel_violations} violations in them, of every invariant with [key-order, watermark]",
        stats.parallel, stats.handler_runs, stats.handler_runs_cut
    );
    let singleton_violations = results
        .iter()
        .flat_map(|(_, o)| &o.violations)
        .filter(|v| {
            [
                "singleton:",
                "fencing-token:",
                "periodic:",
                "sends:",
                "singleton-restart:",
            ]
            .iter()
            .any(|p| v.starts_with(p))
        })
        .count();
    println!(
        "singleton simulation: {} seeds ({} in health mode with hanging runs, standbys 0/1/2/3: {:?} seeds; {} singleton runs, {} periodic runs, {} messages sent, {} reported delivered), {singleton_violations} violations of [singleton, fencing-token, periodic, sends, singleton-restart]",
        results.len(),
        stats.health,
        stats.standbys,
        stats.singleton_runs,
        stats.periodic_runs,
        stats.sends,
        stats.sends_ok,
    );
    violations
}
