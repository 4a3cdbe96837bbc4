//! The rows of the lease table the store could not parse, as the worker reports them
//! ([`LeaseStore::unreadable`](kcl_core::LeaseStore::unreadable)): replaced by every whole
//! read of the table, and kept up to date by the change feed between whole reads (a row
//! written in a shape the store cannot parse appears; the same row parsed again, or deleted,
//! goes). A row is logged here at debug level only: the worker logs each problem once.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use kcl_core::lease::UnreadableRow;

/// Unreadable rows by key (`None`: rows without a string `leaseKey`), with why.
#[derive(Debug, Default)]
pub(crate) struct Unreadable(Mutex<BTreeMap<Option<String>, String>>);

impl Unreadable {
    /// A whole read of the table found these rows unreadable.
    pub(crate) fn replace(&self, rows: BTreeMap<Option<String>, String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = rows;
    }

    /// The change feed showed the row `key` written in a shape the store cannot parse.
    pub(crate) fn found(&self, key: Option<&str>, reason: String) {
        let mut rows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        rows.insert(key.map(str::to_owned), reason);
    }

    /// The change feed showed the row `key` parsed, or deleted.
    pub(crate) fn gone(&self, key: &str) {
        let mut rows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        rows.remove(&Some(key.to_owned()));
    }

    /// Every unreadable row.
    pub(crate) fn rows(&self) -> Vec<UnreadableRow> {
        let rows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let all = rows.iter();
        all.map(|(key, why)| UnreadableRow::new(key.clone(), why.clone()))
            .collect()
    }
}
