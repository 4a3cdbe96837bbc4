//! The mutation check: every deliberate bug in `kcl_core::mutation` must make the simulation
//! report a violation. `SIM_MUTATIONS=1 cargo test -p kcl-core --features mutation-testing
//! --test simulation` turns them on one at a time and runs seeds until one fails, at most
//! `SIM_MUTATION_SEEDS` (default 500; each starts at the seed that caught it last) each, and prints `mutations: N caught of M`.
//! `SIM_MUTATION=<name> SIM_SEED=<seed>` replays one mutation on one seed.

use super::scenario::Outcome;

/// Runs the check; true if every mutation was caught.
#[cfg(feature = "mutation-testing")]
pub fn run(max_seeds: u64, run_seeds: fn(&[u64]) -> Vec<(u64, Outcome)>) -> bool {
    use kcl_core::mutation::{self, Mutation};

    let mut caught = 0;
    let simulated: Vec<&Mutation> = Mutation::ALL
        .iter()
        .filter(|m| m.unit_test().is_none())
        .collect();
    for m in &simulated {
        mutation::set(Some(**m));
        let mut found = None;
        // Two seeds at a time, one per core, until one reports a violation: the seed that
        // caught it last first, then the others in order.
        let first = hint(m).filter(|s| *s < max_seeds);
        let order: Vec<u64> = first
            .into_iter()
            .chain((0..max_seeds).filter(|s| Some(*s) != first))
            .collect();
        for pair in order.chunks(2) {
            let results = run_seeds(pair);
            if let Some((seed, outcome)) = results.iter().find(|(_, o)| !o.violations.is_empty()) {
                found = Some((*seed, outcome.violations[0].clone()));
                break;
            }
        }
        mutation::set(None);
        match found {
            Some((seed, violation)) => {
                caught += 1;
                let short: String = violation.chars().take(160).collect();
                println!("mutation {m:?}: caught by seed {seed}: {short}");
                eprintln!(
                    "  replay: SIM_MUTATION={m:?} SIM_SEED={seed} cargo test -p kcl-core --features mutation-testing --test simulation"
                );
            }
            None => println!("mutation {m:?}: NOT caught in {max_seeds} seeds"),
        }
    }
    let by_tests = Mutation::ALL.len() - simulated.len();
    println!(
        "mutations: {caught} caught of {} ({by_tests} more by their unit tests: scripts/test)",
        simulated.len()
    );
    caught == simulated.len()
}

/// The seed that caught `m` when the check last ran in CI (a schedule change may move it:
/// the search then goes on from seed 0). Seeds below 8 are found as fast without a hint.
#[cfg(feature = "mutation-testing")]
fn hint(m: &kcl_core::mutation::Mutation) -> Option<u64> {
    const HINTS: &[(&str, u64)] = &[
        ("CommitUnfenced", 11),
        ("ReconcileAnyRow", 68),
        ("VanishedShardRetried", 13),
        ("LeaderIgnoresActivity", 21),
        ("StandbyWatchesItsOwnRow", 213),
        ("ReadyKeysNewestFirst", 44),
        ("HeldCountsUnfinishedOnly", 22),
        ("ValidityByTimerOnly", 92),
        ("ResetFinished", 292),
        ("StalledPastValidity", 62),
        ("RefusalTakenForRequest", 89),
        ("SinkRefusalIgnored", 21),
        ("ParkedKeyRuns", 44),
        ("OutageGivenUp", 18),
        ("OutageRunPerProcessor", 18),
        ("ReplayWithoutHold", 104),
        ("StepDownIgnored", 57),
        ("NoStickiness", 15),
        ("RelativeBand", 47),
        ("NoMoveBudget", 47),
        ("AckedIgnoredOnOpen", 9),
        ("SinkUnfenced", 106),
    ];
    let name = format!("{m:?}");
    HINTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, seed)| *seed)
}

/// Without the deliberate bugs compiled in there is nothing to check.
#[cfg(not(feature = "mutation-testing"))]
pub fn run(_: u64, _: fn(&[u64]) -> Vec<(u64, Outcome)>) -> bool {
    eprintln!("the mutation check needs `--features mutation-testing`");
    false
}

/// Turns on the mutation named `name` for the whole run; false if there is none such.
#[cfg(feature = "mutation-testing")]
pub fn set(name: &str) -> bool {
    use kcl_core::mutation::{self, Mutation};
    let found = Mutation::ALL.iter().find(|m| format!("{m:?}") == name);
    mutation::set(found.copied());
    found.is_some()
}

/// Without the deliberate bugs compiled in there is none to turn on.
#[cfg(not(feature = "mutation-testing"))]
pub fn set(_: &str) -> bool {
    false
}

/// Prints "<mutation> <unit test>" for each deliberate bug a unit test catches.
#[cfg(feature = "mutation-testing")]
pub fn print_unit_tests() {
    for m in kcl_core::mutation::Mutation::ALL {
        if let Some(test) = m.unit_test() {
            println!("{m:?} {test}");
        }
    }
}

/// Without the deliberate bugs compiled in there are none.
#[cfg(not(feature = "mutation-testing"))]
pub fn print_unit_tests() {}
