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
//! graceful leaves, splits, merges); in a third of the seeds workers keep their leases
//! through a restart (`restart_grace`), and most graceful leaves are restarts under the same
//! id. Then faults stop, the fleet drains, and the run is
//! checked against the invariants in `sim/checks` (listed in the summary line) plus balance.
//! Every worker is also a candidate for a singleton task that is slow to stop. In half the
//! seeds with batch processors and no failure policy, processors commit their records'
//! outputs with their checkpoints, exactly once (`sim/outputs.rs`, `output-once` and
//! `output-in-step`). No processor is handed a record its lease row said had finished
//! (sparse acknowledgements, `acked-skipped`), and the summary counts what each change of
//! tenure under `Parallel` delivers again, by why (`sim/checks/acks.rs`). Half of those
//! seeds commit instead into a sink that keeps each shard's position itself, as a Postgres
//! database does while the leases live in DynamoDB (`sim/positions.rs`: fenced on open,
//! resumed from the later of lease and sink, the operator resetting leases behind it and
//! deleting rows for the sync to make again; `sink-fenced`, `sink-resume`,
//! `lease-trails-sink`).
//!
//! `cargo test -p kcl-core --test simulation` runs 200 seeds; `SIM_SEEDS=N` runs N;
//! `SIM_SEED=S` replays one seed with the same schedule. A seed's run depends on the seed
//! alone (tokio's own random choices are seeded from it: see `run_seed`), not on the seeds
//! run beside it or when: `SIM_REPLAY=K` (or `all`) then replays K of the seeds just run,
//! each alone in a fresh process, and fails if any run differs from its first in what it did
//! (its `Fingerprint`: its writes and deliveries, when, and its verdict). `SIM_FINGERPRINTS=1`
//! prints each seed's; `SIM_TRACE=DIR` writes what each digests, to diff two runs of a seed.
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
use sim::scenario::{Fingerprint, Outcome, Stats, simulate};

/// One seed on a runtime of its own, whose every choice follows from the seed.
fn run_seed(seed: u64) -> Outcome {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // tokio draws on a generator of its own to place a watch channel's waiting receivers
    // (which decides the order in which they wake) and to start unbiased `select!`s; unseeded,
    // it is seeded from the OS. See .cargo/config.toml.
    // `SIM_SCHEDULE=V` (not 0) draws other such choices for the same seed: a way to look for
    // a failure that depends on the order tasks wake in.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&match schedule() {
        0 => seed.to_le_bytes().to_vec(),
        v => [seed.to_le_bytes(), v.to_le_bytes()].concat(),
    }));
    let runtime = builder.build().expect("runtime");
    runtime.block_on(async {
        BEGAN.set(Some(tokio::time::Instant::now()));
        simulate(seed).await
    })
}

thread_local! {
    /// When the seed this thread runs began, on its runtime's clock.
    static BEGAN: std::cell::Cell<Option<tokio::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// Stamps `SIM_LOG` lines with the simulated time since the seed began.
struct SimulatedTime;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match BEGAN.get() {
            Some(began) => write!(
                w,
                "{:>9.3}s",
                (tokio::time::Instant::now() - began).as_secs_f64()
            ),
            None => write!(w, "{:>10}", "-"),
        }
    }
}

/// `SIM_SCHEDULE`, 0 if unset.
fn schedule() -> u64 {
    std::env::var("SIM_SCHEDULE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether tokio's generator is seeded (built with `--cfg tokio_unstable`).
const SEEDED: bool = cfg!(tokio_unstable);

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
        // Replaying one seed with SIM_LOG=debug (an EnvFilter) shows what the workers did, and
        // when in the seed's time.
        tracing_subscriber::fmt()
            .with_timer(SimulatedTime)
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
    if std::env::var_os("SIM_UNIT_MUTATIONS").is_some() {
        // The deliberate bugs a unit test catches instead, "<mutation> <test>" a line, for
        // scripts/test to run.
        sim::mutations::print_unit_tests();
        return;
    }
    if std::env::var_os("SIM_MUTATIONS").is_some() {
        let caught = sim::mutations::run(env("SIM_MUTATION_SEEDS").unwrap_or(500), run_seeds);
        std::process::exit(i32::from(!caught));
    }
    let mut seeds: Vec<u64> = match (env("SIM_SEED"), env("SIM_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, n) => (0..n.unwrap_or(200)).collect(),
    };
    // `SIM_LOAD=1`: only the seeds that balance by load (`sim/load.rs`).
    if std::env::var_os("SIM_LOAD").is_some() {
        seeds.retain(|s| sim::load::is_load_seed(*s));
    }
    let results = run_seeds(&seeds);
    if std::env::var_os("SIM_FINGERPRINTS").is_some() {
        for (seed, outcome) in &results {
            println!("seed {seed}: {}", outcome.fingerprint);
        }
    }
    let violations = report(&results);
    let differ = match std::env::var("SIM_REPLAY") {
        Ok(sample) => replay(&results, &sample),
        Err(_) => 0,
    };
    if violations > 0 || differ > 0 {
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

/// Replays `sample` (a number, or `all`) of the seeds in `results`, each alone in a fresh
/// process of this binary (its own statics, clock base and hash keys), and compares each
/// run's fingerprint with the one it had among the others. Seeds that failed come first,
/// then seeds spread evenly over the run. Returns how many differ.
fn replay(results: &[(u64, Outcome)], sample: &str) -> usize {
    let started = std::time::Instant::now();
    let wanted = if sample == "all" {
        results.len()
    } else {
        sample.parse().unwrap_or_else(|_| {
            eprintln!("SIM_REPLAY={sample}: a number of seeds, or `all`");
            std::process::exit(2);
        })
    };
    if !SEEDED {
        eprintln!(
            "replay: built without `--cfg tokio_unstable` (is RUSTFLAGS set? it replaces \
             .cargo/config.toml's flags): tokio's random choices are not seeded, and seeds \
             do not replay"
        );
        return wanted.max(1);
    }
    let failed = results.iter().filter(|(_, o)| !o.violations.is_empty());
    let stride = results.len().div_ceil(wanted.max(1)).max(1);
    let spread = results.iter().step_by(stride);
    let mut chosen: Vec<(u64, Fingerprint)> = Vec::new();
    for (seed, outcome) in failed.chain(spread) {
        if chosen.len() < wanted && !chosen.iter().any(|(s, _)| s == seed) {
            chosen.push((*seed, outcome.fingerprint));
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(chosen.len().max(1));
    let differences: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let chunk: Vec<(u64, Fingerprint)> =
                    chosen.iter().copied().skip(t).step_by(threads).collect();
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .filter_map(|(seed, first)| {
                            let again = alone(seed);
                            let first = first.to_string();
                            (again.as_deref() != Ok(first.as_str())).then(|| {
                                format!(
                                    "seed {seed}:\n  among the others: {first}\n  alone:            {}\n  diff the two: SIM_TRACE=DIR on each run, SIM_FINGERPRINTS=1",
                                    again.unwrap_or_else(|e| e)
                                )
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("replay thread"))
            .collect()
    });
    for d in &differences {
        eprintln!("replay: {d}");
    }
    println!(
        "replay: {} of {} seeds each replayed alone in a fresh process: {} the same, {} different ({:.1} s)",
        chosen.len(),
        results.len(),
        chosen.len() - differences.len(),
        differences.len(),
        started.elapsed().as_secs_f64()
    );
    differences.len()
}

/// Runs `seed` alone in a fresh process of this binary; its fingerprint, or what went wrong.
fn alone(seed: u64) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("no executable: {e}"))?;
    let output = std::process::Command::new(exe)
        .env("SIM_SEED", seed.to_string())
        .env("SIM_FINGERPRINTS", "1")
        .env_remove("SIM_SEEDS")
        .env_remove("SIM_REPLAY")
        .env_remove("SIM_TRACE")
        .env_remove("SIM_LOG")
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("did not start: {e}"))?;
    let prefix = format!("seed {seed}: ");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .ok_or_else(|| format!("no fingerprint ({})", output.status))
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
        "simulation: {} seeds ({} LATEST, {} AT_TIMESTAMP, {} planned; coordination: every-worker {} seeds {} violations, leader {} seeds ({} without a change feed, {} balancing by load) {led_violations} violations; liveness: per-lease {} seeds {} violations, heartbeat {} seeds ({} mixed with per-lease workers) {heartbeat_violations} violations; retrieval: polling {} seeds {} violations, fan-out {} seeds {fan_out_violations} violations; lease keys: single-stream {} seeds {} violations, multi-stream {} seeds {multi_violations} violations), {violations} violations of [{}], {records} records",
        results.len(),
        stats.latest,
        stats.at_timestamp,
        stats.planned,
        results.len() - stats.led,
        violations - led_violations,
        stats.led,
        stats.without_feed,
        stats.by_load,
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
    let load_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.load > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    println!(
        "load simulation: {} seeds balancing by load under skewed, noisy, bursting, quiet and silent load ({} lease moves in all), {load_violations} violations of [{}]",
        stats.load,
        stats.load_moves,
        sim::load::INVARIANTS.join(", ")
    );
    let poison_violations: usize = results
        .iter()
        .filter(|(_, o)| o.stats.poison > 0)
        .map(|(_, o)| o.violations.len())
        .sum();
    println!(
        "poison simulation: {} seeds under a failure policy ({} with Parallel, {} of them parking keys; {} batch processors naming the failed record, {} bisected; a sink refusing at times in {}; an outage in {}; {} redrives through the holders, {} letters replayed), dead letters by reason [attempts, permanent, parked]: {:?}, {poison_violations} violations in them, of every invariant with [dead-letter-early, parked-key-order, bisect-bound, outage-bound, redrive-order]",
        stats.poison,
        stats.poison_parallel,
        stats.poison_parked,
        stats.poison_named,
        stats.poison - stats.poison_parallel - stats.poison_named,
        stats.sink_refused,
        stats.outages,
        stats.redrives,
        stats.replayed,
        stats.letters,
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
    let problem_violations = results
        .iter()
        .flat_map(|(_, o)| &o.violations)
        .filter(|v| {
            ["stall-reported:", "no-false-stall:", "unowned:"]
                .iter()
                .any(|p| v.starts_with(p))
        })
        .count();
    println!(
        "problems simulation: {} stalled reports ({} stretches of records waiting on a still checkpoint judged), {} failing reports; max_leases capped in {} seeds, {} unowned reports; {problem_violations} violations of [stall-reported, no-false-stall, unowned]",
        stats.stalled_reports,
        stats.stall_windows,
        stats.failing_reports,
        stats.capped,
        stats.unowned_reports,
    );
    let restart_violations = results
        .iter()
        .flat_map(|(_, o)| &o.violations)
        .filter(|v| v.starts_with("restart-kept:"))
        .count();
    println!(
        "restart simulation: {} seeds keep leases through restarts (restart_grace), {} restarts under the same id, {} leases kept through a restart judged; {restart_violations} violations of [restart-kept]",
        stats.grace, stats.restarts, stats.kept_judged,
    );
    let output_violations = results
        .iter()
        .filter(|(_, o)| o.stats.outputs > 0)
        .map(|(_, o)| o.violations.len())
        .sum::<usize>();
    println!(
        "outputs simulation: {} seeds commit outputs with their checkpoints ({} into the lease table, {} of them with small limits; the others into a sink, below); {} commits applied, {} stretches one transaction could not hold (committed in parts), {} commits refused by the lease row ({} of them stragglers landing late), {} conflicts injected, {} retries answered by their token; {output_violations} violations in them, of every invariant with [output-once, output-in-step]",
        stats.outputs,
        stats.outputs - stats.sink,
        stats.small_limits,
        stats.commits,
        stats.large_stretches,
        stats.refused_by_row,
        stats.refused_stragglers,
        stats.conflicts,
        stats.replays,
    );
    let sink_violations = results
        .iter()
        .filter(|(_, o)| o.stats.sink > 0)
        .map(|(_, o)| o.violations.len())
        .sum::<usize>();
    let sink = stats.sink_counts;
    println!(
        "sink simulation: {} seeds commit outputs into a sink that keeps each shard's position ({} opens of it, {} of them finding the lease behind the sink, {} moving it up; {} commits applied, {} refused by its fence, {} landing after the next tenure took the lease but before it opened the sink, {} after an operator's reset took the lease; {} operator resets behind it, {} lease rows deleted and made again, {} lower fences let in); {sink_violations} violations in them, of every invariant with [output-once, output-in-step, sink-fenced, sink-resume, lease-trails-sink]",
        stats.sink,
        stats.sink_opens,
        sink.behind,
        sink.forwarded,
        stats.sink_commits,
        stats.sink_fenced_off,
        sink.before_successor,
        sink.after_reset,
        sink.resets_behind,
        stats.sink_deletes,
        sink.lower_fences,
    );
    let acked_violations = results
        .iter()
        .flat_map(|(_, o)| &o.violations)
        .filter(|v| v.starts_with("acked-skipped:"))
        .count();
    let again = stats.again;
    println!(
        "sparse acks: {} records delivered again after takeovers under Parallel ({} unfinished, {} finished after the row's last write, {} recorded as finished); {} without them; {acked_violations} violations of [acked-skipped]",
        again.total, again.unfinished, again.lagging, again.recorded, again.without,
    );
    let leading_violations = results
        .iter()
        .flat_map(|(_, o)| &o.violations)
        .filter(|v| v.starts_with("one-leader:") || v.starts_with("leaderless:"))
        .count();
    println!(
        "leader simulation: {} role rows deleted or created again under the fleet, {} times the leader and the standby killed together; {leading_violations} violations of [one-leader, leaderless]",
        stats.role_rows_meddled, stats.roles_killed,
    );
    violations
}
