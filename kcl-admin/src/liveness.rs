//! Whether a fleet (kcl or KCL Java) is running on a lease table, seen from the table alone:
//! what `remove-kcl-rows` and `copy` ask before they touch a table.
//!
//! A lease row holds no time, only a counter every write bumps. Whatever proves a worker
//! alive is written at least every half failover time, whatever the fleet's mode: the shard
//! leases it holds (per-lease liveness, KCL Java), its heartbeat row (`Liveness::Heartbeat`),
//! the leader's and standby's rows (when no shard lease carries them), the fleet-signals row.
//! So the watch reads the whole table, again and again, for the failover time and a second,
//! and anything that changes in it — a counter, a row appearing, a row going — is a running
//! fleet. A stopped fleet writes nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kcl_core::{Lease, LeaseStore, ShardId};

/// The shortest failover time the watch assumes: kcl's default (a mistyped 0s or 1ms must
/// not make a default fleet's renewals invisible).
pub(crate) const MIN_FAILOVER: Duration = Duration::from_secs(10);

/// How many changes a refusal names (the rest are counted).
const NAMED: usize = 6;

/// One change seen during the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The row's counter moved: written by its owner (a renewal, a checkpoint, a take).
    Counter {
        key: ShardId,
        from: u64,
        to: u64,
        owner: Option<String>,
    },
    /// A row that was not there before.
    Appeared { key: ShardId, owner: Option<String> },
    /// A row that is gone.
    Disappeared { key: ShardId },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by =
            |owner: &Option<String>| owner.as_ref().map_or(String::new(), |o| format!(", {o}"));
        match self {
            Self::Counter {
                key,
                from,
                to,
                owner,
            } => write!(f, "{key} (counter {from} → {to}{})", by(owner)),
            Self::Appeared { key, owner } => write!(f, "{key} (appeared{})", by(owner)),
            Self::Disappeared { key } => write!(f, "{key} (deleted)"),
        }
    }
}

/// What the watch saw.
#[derive(Debug)]
pub(crate) enum Seen {
    /// Nothing moved: the rows as last read.
    Still(Vec<Lease>),
    /// Something moved: the changes of the first read that differed, and how long the watch
    /// had run.
    Moved(Vec<Change>, Duration),
}

/// How long the watch lasts for a fleet whose failover time is `failover_time`: the
/// failover time (kcl's default at least) and a second.
pub(crate) fn watch_time(failover_time: Duration) -> Duration {
    failover_time.max(MIN_FAILOVER) + Duration::from_secs(1)
}

/// Reads the whole table every few seconds for `watch_time(failover_time)`, and the longest
/// restart grace a row asks for; returns at the first read that differs from the one before.
pub(crate) async fn watch(
    store: &impl LeaseStore,
    failover_time: Duration,
) -> anyhow::Result<Seen> {
    let started = Instant::now();
    let mut before = store.list().await?;
    // A worker that stopped to restart under the same id (`restart_grace`) writes nothing
    // until it is back, up to its grace past the failover time: the watch waits that too.
    let grace = before.iter().filter_map(|l| l.restart_grace).max();
    let length = watch_time(failover_time) + grace.unwrap_or_default();
    if let Some(grace) = grace {
        report(&format!(
            "a row keeps its lease through its worker's restart (restart grace {}): watching that much longer",
            humantime::format_duration(grace)
        ));
    }
    // Several reads, so that a row written and deleted again within the watch is seen too;
    // not too many, so that a large table is not scanned every second.
    let step = (length / 6).clamp(Duration::from_secs(1), Duration::from_secs(5));
    loop {
        let left = length.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(Seen::Still(before));
        }
        tokio::time::sleep(step.min(left)).await;
        let now = store.list().await?;
        let changes = changes(&before, &now);
        if !changes.is_empty() {
            return Ok(Seen::Moved(changes, started.elapsed()));
        }
        before = now;
    }
}

/// What differs between two reads of the table.
pub(crate) fn changes(before: &[Lease], now: &[Lease]) -> Vec<Change> {
    let owner = |l: &Lease| l.owner.as_ref().map(ToString::to_string);
    let then: BTreeMap<&ShardId, &Lease> = before.iter().map(|l| (&l.key, l)).collect();
    let mut changes = Vec::new();
    for row in now {
        match then.get(&row.key) {
            None => changes.push(Change::Appeared {
                key: row.key.clone(),
                owner: owner(row),
            }),
            Some(old) if old.counter != row.counter => changes.push(Change::Counter {
                key: row.key.clone(),
                from: old.counter,
                to: row.counter,
                owner: owner(row),
            }),
            Some(_) => {}
        }
    }
    for old in before {
        if !now.iter().any(|r| r.key == old.key) {
            changes.push(Change::Disappeared {
                key: old.key.clone(),
            });
        }
    }
    changes
}

/// Names what moved in the table of `application` within `after`: the first few changes,
/// the workers they name, and how many more there were.
pub(crate) fn describe(application: &str, changes: &[Change], after: Duration) -> String {
    let mut named: Vec<String> = changes
        .iter()
        .take(NAMED)
        .map(ToString::to_string)
        .collect();
    if changes.len() > NAMED {
        named.push(format!("and {} more", changes.len() - NAMED));
    }
    let mut workers: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Counter { owner, .. } | Change::Appeared { owner, .. } => owner.as_deref(),
            Change::Disappeared { .. } => None,
        })
        .collect();
    workers.sort_unstable();
    workers.dedup();
    let workers = if workers.is_empty() {
        String::new()
    } else {
        format!("; workers writing: {}", workers.join(", "))
    };
    format!(
        "a fleet is still running on {application}: within {} of watching, its table changed: {}{workers}",
        humantime::format_duration(round_to_tenths(after)),
        named.join(", ")
    )
}

fn round_to_tenths(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().div_ceil(100).try_into().unwrap_or(u64::MAX) * 100)
}

#[allow(clippy::print_stdout)]
fn report(line: &str) {
    println!("{line}");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kcl_core::{Checkpoint, WorkerId};

    fn row(key: &str, counter: u64, owner: Option<&str>) -> Lease {
        let mut l = Lease::new(ShardId::from(key), Checkpoint::TrimHorizon);
        l.counter = counter;
        l.owner = owner.map(WorkerId::from);
        l
    }

    #[test]
    fn every_kind_of_change_is_seen() {
        let before = [
            row("s0", 3, Some("a")),
            row("s1", 1, None),
            row("gone", 2, None),
        ];
        let now = [
            row("s0", 4, Some("a")),
            row("s1", 1, None),
            row("new", 1, Some("b")),
        ];
        let seen = changes(&before, &now);
        assert_eq!(seen.len(), 3, "{seen:?}");
        let text = describe("app", &seen, Duration::from_millis(1234));
        for needle in [
            "s0 (counter 3 → 4, a)",
            "new (appeared, b)",
            "gone (deleted)",
            "a, b",
            "1s 300ms",
        ] {
            assert!(text.contains(needle), "{needle} in {text}");
        }
        assert!(changes(&now, &now).is_empty());
    }
}
