//! The records waiting for their turn, by ordering key: which one may run next.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;

use super::KeyFn;
use crate::ack::Ack;
use crate::failure::Tries;
use crate::mutation::{self, Mutation};
use crate::types::Record;

/// A record waiting for its turn, with its acknowledgement and its failures so far.
pub(super) struct Job {
    /// Its delivery order.
    pub(super) order: u64,
    pub(super) record: Record,
    pub(super) ack: Ack,
    pub(super) tries: Tries,
    /// Why its ordering key could not be worked out (`key_by` panicked): it cannot run in
    /// order, so it fails at once, as a permanent failure, and parks nothing.
    pub(super) unkeyed: Option<String>,
}

/// The key records whose `key_by` panicked wait under (in their order, one at a time; a
/// real key that hashes to it only shares their queue).
pub(super) const UNKEYED: u64 = u64::MAX;

/// The waiting records, by key.
#[derive(Default)]
pub(super) struct Keys {
    waiting: HashMap<u64, VecDeque<Job>>,
    /// Keys with a record waiting and none running, by the delivery order of that record.
    ready: BTreeMap<u64, u64>,
    running: HashSet<u64>,
    delivered: u64,
}

impl Keys {
    /// Queues `record` under its key; a `key` that panics queues it as unkeyed.
    pub(super) fn push(&mut self, key: &KeyFn, record: Record, ack: Ack) {
        let (key, unkeyed) = match std::panic::catch_unwind(AssertUnwindSafe(|| key(&record))) {
            Ok(key) => (key, None),
            Err(panic) => (UNKEYED, Some(crate::task::panic_message(&*panic))),
        };
        let order = self.delivered;
        self.delivered += 1;
        let queue = self.waiting.entry(key).or_default();
        if queue.is_empty() && !self.running.contains(&key) {
            self.ready.insert(order, key);
        }
        queue.push_back(Job {
            order,
            record,
            ack,
            tries: Tries::default(),
            unkeyed,
        });
    }

    /// The next record to run, marking its key running.
    pub(super) fn next(&mut self) -> Option<(u64, Job)> {
        let (_, key) = if mutation::on(Mutation::ReadyKeysNewestFirst) {
            self.ready.pop_last()?
        } else {
            self.ready.pop_first()?
        };
        let queue = self.waiting.get_mut(&key)?;
        let job = queue.pop_front()?;
        if mutation::on(Mutation::KeysOverlap) {
            // The bug: the key's next record is ready at once.
            if let Some(next) = queue.front() {
                self.ready.insert(next.order, key);
            }
        } else {
            self.running.insert(key);
        }
        if queue.is_empty() {
            self.waiting.remove(&key);
        }
        Some((key, job))
    }

    /// Holds `key` for a replay if it is idle (nothing of it runs): `true` then, its waiting
    /// records kept waiting.
    pub(super) fn hold(&mut self, key: u64) -> bool {
        if self.running.contains(&key) {
            return false;
        }
        if let Some(first) = self.waiting.get(&key).and_then(VecDeque::front) {
            self.ready.remove(&first.order);
        }
        self.running.insert(key);
        true
    }

    /// `key`'s running record finished: its next one, if any, is ready.
    pub(super) fn finished(&mut self, key: u64) {
        self.running.remove(&key);
        if let Some(next) = self.waiting.get(&key).and_then(VecDeque::front)
            && !self.running.contains(&key)
        {
            self.ready.insert(next.order, key);
        }
    }

    /// `key`'s failed record rested: it runs again, before the key's later records.
    pub(super) fn again(&mut self, key: u64, job: Job) {
        self.running.remove(&key);
        self.ready.insert(job.order, key);
        self.waiting.entry(key).or_default().push_front(job);
    }
}
