//! An in-memory lease table with DynamoDB's conditional-write semantics and a journal.
//!
//! This file: the table, its journal, faults and test hooks, and the conditional write every
//! operation goes through; `lease_store`: the [`LeaseStore`](crate::LeaseStore)(crate::LeaseStore) operations on top of it.

mod lease_store;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::faults::{Fate, Faults};
use crate::error::{BackendError, ErrorKind};
use crate::lease::Lease;
use crate::lease::usage::{self, Operation, Usage};
use crate::types::{ShardId, WorkerId};

/// One applied write, as recorded in the [journal](MemoryLeaseStore::journal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEvent {
    /// Orders events across backends and tests ([`next_event_seq`](super::next_event_seq)).
    pub seq: u64,
    /// When the call that made it started (before any injected latency).
    pub started: Instant,
    /// When it was applied.
    pub at: Instant,
    /// Whether the writer was told it succeeded (`false`: applied, but the response was lost).
    pub reported: bool,
    /// The client handle that wrote it.
    pub client: String,
    /// `create`, `renew`, `take`, `release`, `request_handoff`, `checkpoint` or `delete`.
    pub operation: &'static str,
    /// The lease after the write (before it, for `delete`).
    pub lease: Lease,
}

#[derive(Debug, Default)]
struct Table {
    exists: bool,
    rows: BTreeMap<ShardId, Lease>,
    /// Rows no reader can parse, with why (see [`MemoryLeaseStore::insert_unreadable`]).
    unreadable: BTreeMap<ShardId, String>,
    journal: Vec<StoreEvent>,
    /// Every client's requests.
    usage: Usage,
    /// A table without a change feed (like a DynamoDB table without a stream).
    no_feed: bool,
    /// How long a write takes to appear in the feed.
    feed_lag: Duration,
    /// How long a change of owner takes to appear in `owned_by`, and the index as last
    /// refreshed.
    index_lag: Duration,
    index: Option<OwnerIndex>,
    /// The processors' outputs, written only with a checkpoint (`memory::outputs`).
    outputs: super::outputs::OutputTable,
}

impl Table {
    /// Row `key` as it was `index_lag` ago, as the journal shows it (the row as stored now
    /// if the journal has nothing of it: a row put there by a test).
    fn stale_row(&self, key: &ShardId) -> Option<Lease> {
        let current = self.rows.get(key).cloned();
        if self.index_lag.is_zero() {
            return current;
        }
        let Some(cutoff) = Instant::now().checked_sub(self.index_lag) else {
            return current;
        };
        let mut events = self.journal.iter().rev().filter(|e| &e.lease.key == key);
        match events.find(|e| e.at <= cutoff) {
            Some(e) if e.operation == "delete" => None,
            Some(e) => Some(e.lease.clone()),
            // Created only since: not there yet, as far as a stale read knows.
            None if self
                .journal
                .iter()
                .find(|e| &e.lease.key == key)
                .is_some_and(|e| e.operation == "create") =>
            {
                None
            }
            None => current,
        }
    }
}

/// The owner index as last refreshed: when, and each row's key and owner.
type OwnerIndex = (Instant, Vec<(ShardId, Option<WorkerId>)>);

/// An in-memory [`LeaseStore`](crate::LeaseStore). Clones share the table; see [`client`](Self::client).
#[derive(Debug, Clone)]
pub struct MemoryLeaseStore {
    table: Arc<Mutex<Table>>,
    faults: Faults,
    client: Arc<str>,
    /// This handle's requests.
    usage: Usage,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLeaseStore {
    /// An empty store without faults.
    pub fn new() -> Self {
        Self::with_faults(Faults::default())
    }

    /// An empty store whose calls go through `faults`.
    pub fn with_faults(faults: Faults) -> Self {
        Self {
            table: Arc::default(),
            faults,
            client: Arc::from("default"),
            usage: Usage::default(),
        }
    }

    /// A handle on the same table whose calls are made as `client` (for targeted faults and
    /// the journal).
    #[must_use]
    pub fn client(&self, client: &str) -> Self {
        Self {
            table: self.table.clone(),
            faults: self.faults.clone(),
            client: Arc::from(client),
            usage: Usage::default(),
        }
    }

    /// The fault controls.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Every lease, as stored now.
    pub fn leases(&self) -> Vec<Lease> {
        self.lock().rows.values().cloned().collect()
    }

    /// The requests of every client so far, with the units DynamoDB would charge for them
    /// (see [`usage`](crate::lease::usage)); [`LeaseStoreExtras::usage`](crate::LeaseStoreExtras::usage) gives this handle's.
    pub fn table_usage(&self) -> Usage {
        self.lock().usage.clone()
    }

    /// Every applied write so far, in order.
    pub fn journal(&self) -> Vec<StoreEvent> {
        self.lock().journal.clone()
    }

    /// Models the table's change feed: `None` for a table without one (readers then read
    /// the whole table), or how long a write takes to appear in it. Default: a feed without
    /// lag.
    pub fn set_feed(&self, lag: Option<Duration>) {
        let mut t = self.lock();
        t.no_feed = lag.is_none();
        t.feed_lag = lag.unwrap_or_default();
    }

    /// Models the eventual consistency of the owner index: [`LeaseStore::owned_by`](crate::LeaseStore::owned_by) answers
    /// from the rows as they were up to `lag` ago. Default: no lag.
    pub fn set_index_lag(&self, lag: Duration) {
        let mut t = self.lock();
        t.index_lag = lag;
        t.index = None;
    }

    /// Puts a row as it is, unconditionally (to prepare a test).
    pub fn insert(&self, lease: Lease) {
        let mut t = self.lock();
        t.exists = true;
        t.rows.insert(lease.key.clone(), lease);
    }

    /// Puts a row that readers cannot parse (an attribute of the wrong type, a row with only
    /// its key): reads skip it and report it in [`LeaseStoreExtras::unreadable`](crate::LeaseStoreExtras::unreadable), and every
    /// conditional write on its key fails, as DynamoDB's would on a row of another shape.
    pub fn insert_unreadable(&self, key: ShardId, reason: &str) {
        let mut t = self.lock();
        t.exists = true;
        t.rows.remove(&key);
        t.unreadable.insert(key, reason.to_owned());
    }

    /// Whether the unreadable row `key` is still there, untouched.
    pub fn has_unreadable(&self, key: &ShardId) -> bool {
        self.lock().unreadable.contains_key(key)
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This handle's client name.
    pub(in crate::memory) fn client_name(&self) -> &str {
        &self.client
    }

    /// The output table, under the table's lock.
    pub(in crate::memory) fn with_outputs<R>(
        &self,
        f: impl FnOnce(&mut super::outputs::OutputTable) -> R,
    ) -> R {
        f(&mut self.lock().outputs)
    }

    /// One transaction across row `key` and the output table, under the table's lock: `f`
    /// sees the row (`None` if absent or unreadable), the outputs and the event number the
    /// row's write is journaled under, and says whether it wrote the row. A written row is
    /// journaled as a `checkpoint` by this client (the counter as `f` left it) and counted
    /// as a transactional write (twice a plain one's units).
    pub(in crate::memory) fn transact_row<R>(
        &self,
        key: &ShardId,
        started: Instant,
        reported: bool,
        f: impl FnOnce(Option<&mut Lease>, &mut super::outputs::OutputTable, u64) -> (R, bool),
    ) -> Result<R, BackendError> {
        let mut guard = self.lock();
        let t = &mut *guard;
        if !t.exists {
            return Err(BackendError::new(
                ErrorKind::NotFound,
                "transact",
                "lease table does not exist",
            ));
        }
        let seq = super::next_event_seq();
        let readable = !t.unreadable.contains_key(key);
        let row = t.rows.get_mut(key).filter(|_| readable);
        let size = row.as_deref().map_or(0, usage::item_size);
        let (result, wrote) = f(row, &mut t.outputs, seq);
        let written = t.rows.get(key).filter(|_| wrote).cloned();
        let units = usage::write_units(size.max(written.as_ref().map_or(0, usage::item_size)));
        let units = if written.is_some() {
            units * 2.0
        } else {
            units
        };
        self.count(t, Operation::Checkpoint, 0, 0.0, units);
        if let Some(lease) = written {
            t.journal.push(StoreEvent {
                seq,
                started,
                at: Instant::now(),
                reported,
                client: self.client.to_string(),
                operation: Operation::Checkpoint.as_str(),
                lease,
            });
        }
        Ok(result)
    }

    /// Counts a request that reached the table (a read that returned `rows` rows), here and
    /// table-wide.
    fn count(&self, table: &Table, operation: Operation, rows: u64, read: f64, write: f64) {
        self.usage.record_read(operation, rows, read, write);
        table.usage.record_read(operation, rows, read, write);
    }

    /// Runs one conditional write: `change` sees the current row (if `condition` holds for
    /// it) and returns the new row, or `None` to delete it.
    async fn write(
        &self,
        operation: Operation,
        key: &ShardId,
        condition: impl FnOnce(Option<&Lease>) -> bool + Send + 'static,
        change: impl FnOnce(Option<Lease>) -> Option<Lease> + Send + 'static,
    ) -> Result<Option<Lease>, BackendError> {
        self.write_logged(operation, Logged::AsIs, key, condition, change)
            .await
    }

    /// As [`write`](Self::write), journaled as `logged` says.
    async fn write_logged(
        &self,
        operation: Operation,
        logged: Logged,
        key: &ShardId,
        condition: impl FnOnce(Option<&Lease>) -> bool + Send + 'static,
        change: impl FnOnce(Option<Lease>) -> Option<Lease> + Send + 'static,
    ) -> Result<Option<Lease>, BackendError> {
        let started = Instant::now();
        let fate = self
            .faults
            .enter(&self.client, operation.as_str(), true)
            .await?;
        if let Fate::Straggle(delay) = fate {
            // Not a task of the writer's process: it lands even if the writer is frozen.
            let (store, key) = (self.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = store.apply(operation, logged, &key, started, false, condition, change);
            });
        } else {
            let result = self.apply(
                operation,
                logged,
                key,
                started,
                fate == Fate::Apply,
                condition,
                change,
            );
            // Applied: a caller that gives up while the response travels back does not
            // undo it.
            let back = self.faults.latency();
            if !back.is_zero() {
                tokio::time::sleep(back).await;
            }
            return fate.report(operation.as_str(), result);
        }
        fate.report(operation.as_str(), Ok(None))
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        operation: Operation,
        logged: Logged,
        key: &ShardId,
        started: Instant,
        reported: bool,
        condition: impl FnOnce(Option<&Lease>) -> bool,
        change: impl FnOnce(Option<Lease>) -> Option<Lease>,
    ) -> Result<Option<Lease>, BackendError> {
        let mut t = self.lock();
        let current = t.rows.get(key);
        if !t.exists {
            return Err(BackendError::new(
                ErrorKind::NotFound,
                operation.as_str(),
                "lease table does not exist",
            ));
        }
        if t.unreadable.contains_key(key) || !condition(current) {
            let units = usage::write_units(current.map_or(0, usage::item_size));
            self.count(&t, operation, 0, 0.0, units);
            return Err(BackendError::new(
                ErrorKind::Conflict,
                operation.as_str(),
                format!("condition failed on {key}"),
            ));
        }
        let before = t.rows.remove(key);
        let before_write = before.clone();
        let after = change(before.clone());
        let size = |row: &Option<Lease>| row.as_ref().map_or(0, usage::item_size);
        let units = usage::write_units(size(&before).max(size(&after)));
        self.count(&t, operation, 0, 0.0, units);
        let shown = after.clone().or(before);
        if let Some(row) = &after {
            t.rows.insert(key.clone(), row.clone());
        }
        let at = Instant::now();
        let mut log = |operation: &'static str, lease: Lease| {
            t.journal.push(StoreEvent {
                seq: super::next_event_seq(),
                started,
                at,
                reported,
                client: self.client.to_string(),
                operation,
                lease,
            });
        };
        match (logged, shown, before_write) {
            (Logged::TakeThenCheckpoint, Some(lease), Some(before)) => {
                // The take's effect alone: the new owner on the old checkpoint.
                let mut taken = before;
                taken.owner.clone_from(&lease.owner);
                taken.handoff_to = None;
                taken.restart_grace = None;
                taken.counter = lease.counter;
                log(Operation::Take.as_str(), taken);
                log(Operation::Checkpoint.as_str(), lease);
            }
            (_, Some(lease), _) => log(operation.as_str(), lease),
            (_, None, _) => {}
        }
        Ok(after)
    }

    /// Runs one read (consistent, but for `owned_by` and `snapshot`); `f` returns its
    /// result, the rows and the bytes it read.
    async fn read<T>(
        &self,
        operation: Operation,
        f: impl FnOnce(&mut Table) -> (T, u64, usize),
    ) -> Result<T, BackendError> {
        self.faults
            .enter(&self.client, operation.as_str(), false)
            .await?;
        let mut t = self.lock();
        if !t.exists {
            return Err(BackendError::new(
                ErrorKind::NotFound,
                operation.as_str(),
                "lease table does not exist",
            ));
        }
        let (result, rows, bytes) = f(&mut t);
        let units = match operation {
            // Billed per request (DynamoDB Streams), not in read units.
            Operation::ReadChanges => 0.0,
            Operation::OwnedBy | Operation::Snapshot | Operation::Peek => {
                usage::read_units(bytes, false)
            }
            _ => usage::read_units(bytes, true),
        };
        self.count(&t, operation, rows, units, 0.0);
        Ok(result)
    }
}

/// How a write is journaled.
#[derive(Debug, Clone, Copy)]
enum Logged {
    /// One event, named after the write's operation.
    AsIs,
    /// A reset: its two effects, a `take` (the new owner on the old row) then a `checkpoint`
    /// (the row written), at one instant.
    TakeThenCheckpoint,
}
