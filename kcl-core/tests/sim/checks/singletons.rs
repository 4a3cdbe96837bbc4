//! The applications' singletons: fencing tokens and the periodic job.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Evidence;
use crate::sim::fleet::PERIOD;

/// fencing-token: every run of the singleton task carried a larger fencing token than every
/// run that started before it.
pub(super) fn tokens(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut runs: Vec<_> = e.journal.singleton_runs.iter().collect();
    runs.sort_by_key(|r| r.start);
    for pair in runs.windows(2) {
        if pair[1].token <= pair[0].token {
            v.push(format!(
                "fencing-token: {} started with token {} after {} had {}",
                pair[1].worker, pair[1].token, pair[0].worker, pair[0].token
            ));
        }
    }
}

/// periodic: the periodic job never ran twice for one period; and once the faults stopped,
/// it ran within the failover time plus one period (and a poll), then every period.
pub(super) fn periodic(e: &Evidence<'_>, v: &mut Vec<String>) {
    let mut by_period: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for run in &e.journal.periodic_runs {
        by_period.entry(run.index).or_default().push(&run.worker);
    }
    for (index, workers) in by_period.iter().filter(|(_, w)| w.len() > 1) {
        v.push(format!(
            "periodic: period {index} ran {} times: {workers:?}",
            workers.len()
        ));
    }
    let (from, to) = e.quiet;
    let slack = Duration::from_secs(1);
    let mut last = from;
    let bound = |at| {
        if at == from {
            e.singleton_recovery + PERIOD + slack * 2
        } else {
            PERIOD + slack
        }
    };
    for run in e
        .journal
        .periodic_runs
        .iter()
        .filter(|r| r.at > from && r.at <= to)
    {
        if run.at - last > bound(last) {
            v.push(format!(
                "periodic: {:?} without a run after the faults stopped (until period {})",
                run.at - last,
                run.index
            ));
        }
        last = run.at;
    }
    if to > last && to - last > bound(last) {
        v.push(format!(
            "periodic: no run in the last {:?} before the fleet stopped",
            to - last
        ));
    }
}
