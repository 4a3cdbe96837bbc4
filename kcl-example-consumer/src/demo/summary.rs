//! The demo's closing ledger.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kcl_core::ShardId;

use super::backend::Backend;
use super::fleet::{Fate, Fleet, short};
use super::ledger::lock;

pub(super) fn summarize<B: Backend>(
    fleet: &Fleet<B>,
    produced: u64,
    final_leases: &BTreeMap<String, Vec<ShardId>>,
    took: Duration,
) -> ExitCode {
    println!("\nsummary after {:.1}s", took.as_secs_f64());
    let (lost, unexpected) = records(fleet, produced);
    workers(fleet, final_leases);
    let sample = lock(&fleet.ledger.sample)
        .as_ref()
        .and_then(|s| serde_json::to_string(s).ok());
    if let Some(line) = sample {
        println!("\n  a window line, as `run` prints them on stdout:\n  {line}");
    }
    let twice = summary_job(fleet);
    let failed = fleet.members.iter().any(|m| m.failed.is_some()) || twice > 0;
    if lost == 0 && unexpected == 0 && !failed {
        println!("\nOK: no record lost");
        ExitCode::SUCCESS
    } else {
        println!(
            "\nFAILED: {lost} records lost, {unexpected} unexpected, worker failure: {failed}"
        );
        ExitCode::FAILURE
    }
}

/// The records produced, delivered, lost and counted; the lost and the unexpected.
fn records<B: Backend>(fleet: &Fleet<B>, produced: u64) -> (usize, usize) {
    let deliveries = lock(&fleet.ledger.deliveries);
    let processed: u64 = deliveries.values().map(|&n| u64::from(n)).sum();
    let unique = deliveries.len() as u64;
    let lost = (0..produced)
        .filter(|id| !deliveries.contains_key(id))
        .count();
    let unexpected = deliveries.keys().filter(|&&id| id >= produced).count();
    drop(deliveries);

    // After a graceful stop every shard should be checkpointed at its last record.
    let behind = fleet.backend.not_checkpointed();
    println!("  records produced    {produced:>7}");
    println!("  records processed   {processed:>7}   (deliveries, re-deliveries included)");
    println!("  unique              {unique:>7}");
    println!(
        "  duplicates          {:>7}   (at least once: records after the last checkpoint of a crashed worker repeat)",
        processed - unique
    );
    println!("  lost                {lost:>7}");
    if unexpected > 0 {
        println!("  unexpected          {unexpected:>7}   (delivered but never produced)");
    }
    println!(
        "  windows emitted     {:>7}   ({} records counted in them)",
        fleet.ledger.windows.load(Ordering::Relaxed),
        fleet.ledger.window_records.load(Ordering::Relaxed)
    );
    if let Some(behind) = behind {
        println!("  not checkpointed    {behind:>7}   (records after the final checkpoints)");
    }
    (lost, unexpected)
}

/// Each worker: its fate, the leases it took, the records it processed, its leases at the
/// end.
fn workers<B: Backend>(fleet: &Fleet<B>, final_leases: &BTreeMap<String, Vec<ShardId>>) {
    let taken = fleet.backend.takes();
    let by_worker = lock(&fleet.ledger.by_worker).clone();
    println!();
    println!(
        "  {:<10} {:<9} {:>12} {:>11}   leases at the end",
        "worker", "fate", "leases taken", "records"
    );
    for m in &fleet.members {
        let fate = match (m.fate, &m.failed) {
            (_, Some(_)) => "FAILED",
            (Fate::Crashed, None) => "crashed",
            (Fate::Stopped | Fate::Running, None) => "stopped",
        };
        let leases = final_leases.get(&m.name).map_or_else(
            || "-".to_owned(),
            |s| {
                let ids: Vec<String> = s.iter().map(short).collect();
                format!("{} [{}]", s.len(), ids.join(" "))
            },
        );
        println!(
            "  {:<10} {:<9} {:>12} {:>11}   {leases}",
            m.name,
            fate,
            taken.as_ref().map_or_else(
                || "-".to_owned(),
                |t| t.get(&m.name).copied().unwrap_or(0).to_string()
            ),
            by_worker.get(&m.name).copied().unwrap_or(0)
        );
        if let Some(why) = &m.failed {
            println!("             {why}");
        }
    }
}

/// The summary job's periods and who ran them; the periods run twice.
fn summary_job<B: Backend>(fleet: &Fleet<B>) -> usize {
    let periods = lock(&fleet.ledger.periods).clone();
    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, worker) in &periods {
        *runs.entry(*index).or_default() += 1;
        *by.entry(worker.as_str()).or_default() += 1;
    }
    let twice = runs.values().filter(|&&n| n > 1).count();
    println!(
        "\n  summary job: {} periods, {twice} run twice; by {by:?}",
        runs.len()
    );
    twice
}
