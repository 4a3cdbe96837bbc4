//! One call: a connection lent by the pool, one prepared statement, the request counted and
//! any error mapped with its context (operation, application, lease key).
//!
//! A connection goes back to the pool only when its call ended in an answer that leaves it
//! sound. One whose link broke, which reached a read-only server, or whose call was dropped
//! half-way (the worker bounds every call by its `call_timeout`, and a dead peer looks like
//! a slow one) is closed instead, so the next call opens a fresh one rather than wait on it.

use std::ops::{Deref, DerefMut};

use deadpool_postgres::{Object, Transaction};
use kcl_core::lease::usage::Operation;
use kcl_core::{BackendError, ShardId};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::PostgresLeaseStore;
use crate::error::{Cause, Subject, backend_error, describe, describe_pool};

/// Values bound to a statement's parameters.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A connection of the pool, closed on drop unless its call ended soundly.
pub(crate) struct Lent {
    object: Option<Object>,
    keep: bool,
}

impl Deref for Lent {
    type Target = Object;

    fn deref(&self) -> &Object {
        // Only `drop` takes the object out.
        self.object.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut Object {
        self.object.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Lent {
    /// Back to the pool: the connection is sound.
    pub(crate) fn give_back(mut self) {
        self.keep = true;
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(object) = self.object.take()
            && !self.keep
        {
            // Out of the pool, and closed.
            drop(Object::take(object));
        }
    }
}

impl PostgresLeaseStore {
    /// What a call is about, for its errors.
    pub(crate) fn subject<'a>(&'a self, key: Option<&'a ShardId>) -> Subject<'a> {
        Subject {
            application: &self.application,
            key: key.map(ShardId::as_str),
            table: self.table,
        }
    }

    /// A connection of the pool (opened if none is free), for `operation`.
    pub(crate) async fn lend(
        &self,
        operation: &'static str,
        key: Option<&ShardId>,
    ) -> Result<Lent, BackendError> {
        match self.pool.get().await {
            Ok(object) => Ok(Lent {
                object: Some(object),
                keep: false,
            }),
            Err(e) => {
                let (cause, detail) = (Cause::of_pool(&e), describe_pool(&e));
                let subject = self.subject(key);
                Err(backend_error(operation, subject, cause, &detail, e).0)
            }
        }
    }

    /// Runs `sql` and returns its rows.
    pub(crate) async fn query(
        &self,
        operation: Operation,
        key: Option<&ShardId>,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, BackendError> {
        let mut conn = self.lend(operation.as_str(), key).await?;
        let result = match conn.prepare_cached(sql).await {
            Ok(statement) => conn.query(&statement, params).await,
            Err(e) => Err(e),
        };
        self.settle(&mut conn, operation, key, result, Vec::len)
    }

    /// Runs `sql` and returns how many rows it wrote.
    pub(crate) async fn execute(
        &self,
        operation: Operation,
        key: Option<&ShardId>,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, BackendError> {
        let mut conn = self.lend(operation.as_str(), key).await?;
        let result = match conn.prepare_cached(sql).await {
            Ok(statement) => conn.execute(&statement, params).await,
            Err(e) => Err(e),
        };
        self.settle(&mut conn, operation, key, result, |_| 0)
    }

    /// Runs `sql` in `transaction` (ensure_table's statements).
    pub(crate) async fn in_transaction(
        transaction: &Transaction<'_>,
        sql: &str,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = transaction.prepare_cached(sql).await?;
        transaction.query(&statement, &[]).await
    }

    /// Counts the call if it reached the server, decides whether its connection goes back to
    /// the pool, and maps its error.
    pub(crate) fn settle<T>(
        &self,
        conn: &mut Lent,
        operation: Operation,
        key: Option<&ShardId>,
        result: Result<T, tokio_postgres::Error>,
        rows: impl FnOnce(&T) -> usize,
    ) -> Result<T, BackendError> {
        match result {
            Ok(value) => {
                conn.keep = true;
                self.count(operation, rows(&value));
                Ok(value)
            }
            Err(e) => {
                if e.as_db_error().is_some() {
                    self.count(operation, 0);
                }
                let (cause, detail) = (Cause::of(&e), describe(&e));
                let subject = self.subject(key);
                let (error, close) = backend_error(operation.as_str(), subject, cause, &detail, e);
                conn.keep = !close;
                if close {
                    tracing::debug!(%error, "closing a connection that met an error");
                }
                Err(error)
            }
        }
    }

    /// Counts one request that reached the server (reads with the rows they returned).
    pub(crate) fn count(&self, operation: Operation, rows: usize) {
        if operation.is_read() {
            let rows = u64::try_from(rows).unwrap_or(u64::MAX);
            self.usage.record_read(operation, rows, 0.0, 0.0);
        } else {
            self.usage.record(operation, 0.0, 0.0);
        }
    }
}
