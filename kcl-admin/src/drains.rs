//! The drain rows (`kcl-coordination/drain/<worker>`, written by `kcl-admin release`) that
//! `leases` lists below its table, each with what else its worker shows in the table. A
//! worker deletes its own drain row when it starts again under the same id; one that starts
//! under another id (a new pod name) leaves it behind, and `release --undo` deletes it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kcl_core::singleton::{heartbeat_key, is_coordination_key};
use kcl_core::{Lease, ShardId, WorkerId};
use serde_json::json;

/// One drain row and what its worker shows in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainRow {
    pub(crate) worker: WorkerId,
    /// Its unfinished shard leases: what it still has to hand over.
    pub(crate) holds: usize,
    /// Whether it has a heartbeat row (`Liveness::Heartbeat`), and whether that moved while
    /// watched (`None`: not watched).
    pub(crate) heartbeat: Option<Option<bool>>,
    /// Whether it holds a coordination row other than its heartbeat and drain rows (the
    /// leader's, the standby's, a singleton).
    pub(crate) other_rows: bool,
}

impl DrainRow {
    /// Nothing of the worker shows in the table but this row: it has stopped, or started
    /// again under another id.
    pub(crate) fn stale(&self) -> bool {
        self.holds == 0 && self.heartbeat.is_none() && !self.other_rows
    }
}

/// The drain rows of `leases`, `moving` telling which counters moved while watched.
pub(crate) fn rows(leases: &[Lease], moving: &BTreeMap<ShardId, bool>) -> Vec<DrainRow> {
    leases
        .iter()
        .filter_map(|l| kcl_core::admin::drain_row_of(&l.key))
        .map(|worker| {
            let own = |l: &&Lease| l.is_owned_by(&worker);
            let beat = heartbeat_key(&worker);
            let drain = kcl_core::admin::drain_row(&worker);
            DrainRow {
                holds: leases
                    .iter()
                    .filter(own)
                    .filter(|l| !is_coordination_key(&l.key) && !l.is_finished())
                    .count(),
                heartbeat: leases
                    .iter()
                    .filter(own)
                    .any(|l| l.key == beat)
                    .then(|| moving.get(&beat).copied()),
                other_rows: leases
                    .iter()
                    .filter(own)
                    .any(|l| is_coordination_key(&l.key) && l.key != beat && l.key != drain),
                worker,
            }
        })
        .collect()
}

/// The rows as lines below the `leases` table.
pub(crate) fn text(rows: &[DrainRow]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    out.push_str("\nDrain rows (kcl-admin release):\n");
    for row in rows {
        let w = &row.worker;
        let state = if row.stale() {
            format!(
                "holds nothing and shows nowhere else in the table: it has stopped, or started \
                 again under another id (a worker deletes its drain row only when it starts \
                 under the same id). `kcl-admin release --worker {w} --undo` deletes the row"
            )
        } else if row.holds > 0 {
            format!("draining: still holds {} lease(s)", row.holds)
        } else {
            let beat = match row.heartbeat {
                Some(Some(true)) => ", its heartbeat moves",
                Some(Some(false)) => ", its heartbeat row did not move",
                _ => "",
            };
            format!(
                "drained: holds nothing{beat}; it takes no work until it starts again \
                 (`kcl-admin release --worker {w} --undo` lets it take work now)"
            )
        };
        let _ = writeln!(out, "  {w}: {state}");
    }
    out
}

/// The rows for `leases --json`.
pub(crate) fn json(rows: &[DrainRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            json!({
                "worker": r.worker.to_string(),
                "key": kcl_core::admin::drain_row(&r.worker).to_string(),
                "leases_held": r.holds,
                "heartbeat_row": r.heartbeat.is_some(),
                "heartbeat_moving": r.heartbeat.flatten(),
                "stale": r.stale(),
            })
        })
        .collect()
}
