//! A processor's writes to the in-memory output table: what each does to one item, and the
//! condition it is applied under.

use std::collections::BTreeMap;

use super::OutputItem;

/// One write of a processor's to the output table: what it does to one key, and the
/// condition the item must meet (as it was before the commit) for the commit to apply.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemoryWrite {
    /// The item's key.
    pub key: String,
    /// What the write does.
    pub action: WriteAction,
    /// Its own condition, if any: when it fails, nothing of the commit applies.
    pub condition: Option<Condition>,
}

/// What a [`MemoryWrite`] does to its item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WriteAction {
    /// Sets the item's value (its count stays).
    Put(String),
    /// Adds to the item's count, creating the item at 0 first if absent (DynamoDB's `ADD`).
    Add(i64),
    /// Removes the item.
    Delete,
    /// Changes nothing: only its condition counts (a `ConditionCheck`).
    Check,
}

/// A condition on an item as it was before the commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// The item does not exist.
    Absent,
    /// The item exists.
    Present,
    /// The item exists with this value.
    ValueIs(String),
    /// The item exists with this count.
    CountIs(i64),
}

impl MemoryWrite {
    /// Sets `key`'s value.
    pub fn put(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self::new(key, WriteAction::Put(value.into()))
    }

    /// Adds `by` to `key`'s count: an output written once per record counts each commit of
    /// it.
    pub fn add(key: impl Into<String>, by: i64) -> Self {
        Self::new(key, WriteAction::Add(by))
    }

    /// Removes `key`.
    pub fn delete(key: impl Into<String>) -> Self {
        Self::new(key, WriteAction::Delete)
    }

    /// Checks `condition` on `key` without writing it.
    pub fn check(key: impl Into<String>, condition: Condition) -> Self {
        Self::new(key, WriteAction::Check).when(condition)
    }

    /// The same write, applied only if `condition` holds.
    #[must_use]
    pub fn when(mut self, condition: Condition) -> Self {
        self.condition = Some(condition);
        self
    }

    fn new(key: impl Into<String>, action: WriteAction) -> Self {
        Self {
            key: key.into(),
            action,
            condition: None,
        }
    }

    /// Its size, as [`Limits::bytes`](crate::outputs::Limits::bytes) counts it: key, value
    /// and 16 bytes of attributes.
    pub(in crate::memory) fn bytes(&self) -> usize {
        let value = match &self.action {
            WriteAction::Put(v) => v.len(),
            WriteAction::Add(_) => 8,
            WriteAction::Delete | WriteAction::Check => 0,
        };
        self.key.len() + value + 16
    }
}

/// The first of `writes` whose condition fails on `items`, with why.
pub(in crate::memory) fn first_refused(
    items: &BTreeMap<String, OutputItem>,
    writes: &[MemoryWrite],
) -> Option<(usize, String)> {
    writes.iter().enumerate().find_map(|(index, w)| {
        let condition = w.condition.as_ref()?;
        let item = items.get(&w.key);
        let holds = match condition {
            Condition::Absent => item.is_none(),
            Condition::Present => item.is_some(),
            Condition::ValueIs(v) => item.is_some_and(|i| i.value.as_ref() == Some(v)),
            Condition::CountIs(n) => item.is_some_and(|i| i.count == *n),
        };
        (!holds).then(|| {
            let reason = format!("ConditionalCheckFailed: {} is not {condition:?}", w.key);
            (index, reason)
        })
    })
}

/// Applies `write` to `items`.
pub(in crate::memory) fn apply(items: &mut BTreeMap<String, OutputItem>, write: &MemoryWrite) {
    match &write.action {
        WriteAction::Put(value) => {
            items.entry(write.key.clone()).or_default().value = Some(value.clone());
        }
        WriteAction::Add(by) => items.entry(write.key.clone()).or_default().count += by,
        WriteAction::Delete => {
            items.remove(&write.key);
        }
        WriteAction::Check => {}
    }
}
