//! The store's [`LeaseStoreExtras`]: parked keys (unparking, redrive requests), usage and
//! unreadable rows. No change feed: observers read the table whole.
//!
//! Why no feed: LISTEN/NOTIFY would need a connection of its own per observer, loses what
//! is sent while it reconnects (so a feed position could not be resumed), and a trigger on
//! every renewal would cost each write a notification; a "changes since" column would miss
//! deletions and transactions that commit out of order. A whole read of an application's
//! rows is one indexed query (a few hundred microseconds for a thousand leases) that Postgres
//! does not bill by the row, so observers do that every taker interval instead.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use kcl_core::lease::UnreadableRow;
use kcl_core::lease::usage::{Operation, Usage};
use kcl_core::{BackendError, LeaseStoreExtras, ShardId};

use crate::{PostgresLeaseStore, sql};

impl PostgresLeaseStore {
    /// Replaces the rows the last whole read could not parse.
    pub(crate) fn set_unreadable(&self, rows: BTreeMap<Option<String>, String>) {
        *self
            .unreadable
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = rows;
    }
}

impl LeaseStoreExtras for PostgresLeaseStore {
    /// Removes `entries` from the row's parked keys (the others keep their order), on the
    /// row if it exists: the counter is left alone, so the holder's fenced writes go on; it
    /// sees the change in its next renewal. A missing row is a conflict.
    async fn unpark(&self, key: &ShardId, entries: &[String]) -> Result<(), BackendError> {
        if entries.is_empty() {
            return Ok(());
        }
        let (app, lease_key): (&str, &str) = (&self.application, key.as_str());
        let params: crate::call::Params<'_> = &[&app, &lease_key, &entries];
        let written = self
            .execute(Operation::Unpark, Some(key), sql::UNPARK, params)
            .await?;
        match written {
            0 => Err(BackendError::new(
                kcl_core::ErrorKind::Conflict,
                Operation::Unpark.as_str(),
                format!("{}: no such row", self.subject(Some(key))),
            )),
            _ => Ok(()),
        }
    }

    /// Adds `request` to the row's parked keys while the row still parks `parked`; the
    /// counter and the owner are left alone. `false` if the row no longer parks it (or is
    /// gone).
    async fn request_redrive(
        &self,
        key: &ShardId,
        parked: &str,
        request: &str,
    ) -> Result<bool, BackendError> {
        let (app, lease_key): (&str, &str) = (&self.application, key.as_str());
        let params: crate::call::Params<'_> = &[&app, &lease_key, &parked, &request];
        let operation = Operation::RequestRedrive;
        let written = self
            .execute(operation, Some(key), sql::REQUEST_REDRIVE, params)
            .await?;
        Ok(written == 1)
    }

    /// Requests by operation, with the rows reads returned; no capacity units (Postgres
    /// bills none).
    fn usage(&self) -> Option<Usage> {
        Some(self.usage.clone())
    }

    fn unreadable(&self) -> Vec<UnreadableRow> {
        let rows = self
            .unreadable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        rows.iter()
            .map(|(key, why)| UnreadableRow::new(key.clone(), why.clone()))
            .collect()
    }
}
