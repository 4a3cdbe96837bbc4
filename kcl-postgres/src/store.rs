//! [`LeaseStore`] for [`PostgresLeaseStore`]: each operation one statement of `sql`, with the
//! condition the trait documents; a write that matched no row is a conflict.

use kcl_core::lease::usage::Operation;
use kcl_core::{
    BackendError, CheckpointUpdate, ErrorKind, Lease, LeaseStore, ShardId, TableFeatures, WorkerId,
};
use tokio_postgres::Row;

use crate::schema::{self, CheckpointParams, OutOfRange, RowParams, signed};
use crate::{PostgresLeaseStore, TableSetup, sql};

/// The refusal of a write whose condition failed (or whose row is gone).
fn conflict(operation: Operation, store: &PostgresLeaseStore, key: &ShardId) -> BackendError {
    let subject = store.subject(Some(key));
    BackendError::new(
        ErrorKind::Conflict,
        operation.as_str(),
        format!("{subject}: the row is not as observed (condition failed)"),
    )
}

impl PostgresLeaseStore {
    fn out_of_range(&self, operation: Operation, key: &ShardId, e: OutOfRange) -> BackendError {
        let subject = self.subject(Some(key));
        BackendError::new(
            ErrorKind::Fatal,
            operation.as_str(),
            format!("{subject}: {e}"),
        )
        .with_source(e)
    }

    /// A conditional `UPDATE … RETURNING` of one row: the row as written, or a conflict.
    async fn update(
        &self,
        operation: Operation,
        key: &ShardId,
        sql: &str,
        params: crate::call::Params<'_>,
    ) -> Result<Lease, BackendError> {
        let rows = self.query(operation, Some(key), sql, params).await?;
        let row = rows.first().ok_or_else(|| conflict(operation, self, key))?;
        self.written(operation, key, row)
    }

    /// A conditional write of one row that returns nothing: done, or a conflict.
    async fn write(
        &self,
        operation: Operation,
        key: &ShardId,
        sql: &str,
        params: crate::call::Params<'_>,
    ) -> Result<(), BackendError> {
        match self.execute(operation, Some(key), sql, params).await? {
            0 => Err(conflict(operation, self, key)),
            _ => Ok(()),
        }
    }

    /// The row a write returned.
    fn written(
        &self,
        operation: Operation,
        key: &ShardId,
        row: &Row,
    ) -> Result<Lease, BackendError> {
        schema::lease(row).map_err(|reason| {
            let subject = self.subject(Some(key));
            BackendError::new(
                ErrorKind::Fatal,
                operation.as_str(),
                format!("{subject}: the row written cannot be read back: {reason}"),
            )
        })
    }

    /// One row.
    async fn read_one(
        &self,
        operation: Operation,
        key: &ShardId,
    ) -> Result<Option<Lease>, BackendError> {
        let params: crate::call::Params<'_> = &[&&*self.application, &key.as_str()];
        let rows = self.query(operation, Some(key), sql::GET, params).await?;
        rows.first()
            .map(|row| self.written(operation, key, row))
            .transpose()
    }

    /// Every row of the application; those that cannot be read are kept for `unreadable`.
    async fn read_all(&self, operation: Operation) -> Result<Vec<Lease>, BackendError> {
        let rows = self
            .query(operation, None, sql::LIST, &[&&*self.application])
            .await?;
        let mut leases = Vec::with_capacity(rows.len());
        let mut unreadable = std::collections::BTreeMap::new();
        for row in &rows {
            match schema::lease(row) {
                Ok(lease) => leases.push(lease),
                Err(reason) => {
                    let key = row.try_get::<_, String>("lease_key").ok();
                    tracing::debug!(application = %self.application, lease_key = key.as_deref().unwrap_or("<none>"), %reason, "lease row cannot be read; skipped");
                    unreadable.insert(key, reason);
                }
            }
        }
        self.set_unreadable(unreadable);
        Ok(leases)
    }

    /// Runs `schema.sql` under an advisory lock, in one transaction.
    async fn apply_schema(&self) -> Result<(), BackendError> {
        let operation = Operation::EnsureTable;
        let mut conn = self.lend(operation.as_str(), None).await?;
        let result = async {
            let transaction = conn.transaction().await?;
            Self::in_transaction(&transaction, sql::SCHEMA_LOCK).await?;
            transaction.batch_execute(schema::SCHEMA_SQL).await?;
            transaction.commit().await
        }
        .await;
        self.settle(&mut conn, operation, None, result, |_| 0)
    }
}

impl LeaseStore for PostgresLeaseStore {
    /// Creates the table and its owner index unless told the schema is managed elsewhere,
    /// checks that the table has every column this crate uses, and answers with the owner
    /// index if an index covers `owner`. No change feed: observers read the table whole (one
    /// indexed query per read).
    async fn ensure_table(&self, wanted: TableFeatures) -> Result<TableFeatures, BackendError> {
        let operation = Operation::EnsureTable;
        if self.setup == TableSetup::Managed {
            let present = self
                .query(operation, None, sql::SCHEMA_PRESENT, &[])
                .await?;
            if present.first().and_then(|r| r.try_get::<_, bool>(0).ok()) != Some(true) {
                self.apply_schema().await?;
            }
        }
        self.query(operation, None, sql::PROBE, &[]).await?;
        let rows = self.query(operation, None, sql::OWNER_INDEX, &[]).await?;
        let index = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        if wanted.owner_index && !index {
            tracing::info!(
                "kcl_leases has no index covering owner: owned_by scans the table \
                 (apply kcl-postgres/schema.sql for kcl_leases_owner)"
            );
        }
        Ok(TableFeatures::NONE.with_owner_index(wanted.owner_index && index))
    }

    async fn list(&self) -> Result<Vec<Lease>, BackendError> {
        self.read_all(Operation::List).await
    }

    /// The same read as [`list`](LeaseStore::list): a read of Postgres's primary costs no
    /// more for being current.
    async fn snapshot(&self) -> Result<Vec<Lease>, BackendError> {
        self.read_all(Operation::Snapshot).await
    }

    async fn get(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.read_one(Operation::Get, key).await
    }

    /// The same read as [`get`](LeaseStore::get), counted as a peek.
    async fn peek(&self, key: &ShardId) -> Result<Option<Lease>, BackendError> {
        self.read_one(Operation::Peek, key).await
    }

    async fn create(&self, lease: &Lease) -> Result<bool, BackendError> {
        let operation = Operation::Create;
        let row = RowParams::new(lease).map_err(|e| self.out_of_range(operation, &lease.key, e))?;
        let (app, key): (&str, &str) = (&self.application, lease.key.as_str());
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&app, &key];
        params.extend(row.values());
        let written = self
            .execute(operation, Some(&lease.key), sql::CREATE, &params)
            .await?;
        Ok(written == 1)
    }

    async fn renew(&self, held: &Lease) -> Result<Lease, BackendError> {
        let operation = Operation::Renew;
        let counter = signed("counter", held.counter)
            .map_err(|e| self.out_of_range(operation, &held.key, e))?;
        let (load, capacity, flow) = schema::load(held.load);
        let params: crate::call::Params<'_> = &[
            &&*self.application,
            &held.key.as_str(),
            &schema::owner(held.owner.as_ref()),
            &counter,
            &load,
            &capacity,
            &flow,
        ];
        self.update(operation, &held.key, sql::RENEW, params).await
    }

    async fn take(&self, observed: &Lease, new_owner: &WorkerId) -> Result<Lease, BackendError> {
        let operation = Operation::Take;
        let counter = signed("counter", observed.counter)
            .map_err(|e| self.out_of_range(operation, &observed.key, e))?;
        let params: crate::call::Params<'_> = &[
            &&*self.application,
            &observed.key.as_str(),
            &schema::owner(observed.owner.as_ref()),
            &counter,
            &new_owner.as_str(),
        ];
        self.update(operation, &observed.key, sql::TAKE, params)
            .await
    }

    async fn release(&self, held: &Lease) -> Result<(), BackendError> {
        let operation = Operation::Release;
        let counter = signed("counter", held.counter)
            .map_err(|e| self.out_of_range(operation, &held.key, e))?;
        let params: crate::call::Params<'_> = &[
            &&*self.application,
            &held.key.as_str(),
            &schema::owner(held.owner.as_ref()),
            &counter,
        ];
        self.write(operation, &held.key, sql::RELEASE, params).await
    }

    async fn request_handoff(
        &self,
        observed: &Lease,
        to: Option<&WorkerId>,
    ) -> Result<(), BackendError> {
        let params: crate::call::Params<'_> = &[
            &&*self.application,
            &observed.key.as_str(),
            &schema::owner(observed.owner.as_ref()),
            &schema::owner(to),
        ];
        let operation = Operation::RequestHandoff;
        self.write(operation, &observed.key, sql::REQUEST_HANDOFF, params)
            .await
    }

    async fn checkpoint(
        &self,
        held: &Lease,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        let operation = Operation::Checkpoint;
        let range = |e| self.out_of_range(operation, &held.key, e);
        let counter = signed("counter", held.counter).map_err(range)?;
        let before_sub =
            signed("sub-sequence number", held.checkpoint.sub_sequence()).map_err(range)?;
        let writes = CheckpointParams::new(update, held.load).map_err(range)?;
        let (app, key, owner) = (
            &*self.application,
            held.key.as_str(),
            schema::owner(held.owner.as_ref()),
        );
        let before = held.checkpoint.as_str();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&app, &key, &owner, &counter];
        params.extend(writes.values());
        params.push(&before);
        params.push(&before_sub);
        self.update(operation, &held.key, sql::CHECKPOINT, &params)
            .await
    }

    async fn reset(
        &self,
        observed: &Lease,
        owner: &WorkerId,
        update: &CheckpointUpdate,
    ) -> Result<Lease, BackendError> {
        let operation = Operation::Reset;
        let range = |e| self.out_of_range(operation, &observed.key, e);
        let counter = signed("counter", observed.counter).map_err(range)?;
        let writes = CheckpointParams::new(update, None).map_err(range)?;
        let (app, key) = (&*self.application, observed.key.as_str());
        let (expected, new_owner) = (schema::owner(observed.owner.as_ref()), owner.as_str());
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&app, &key, &expected, &counter];
        params.extend(writes.values());
        params.push(&new_owner);
        self.update(operation, &observed.key, sql::RESET, &params)
            .await
    }

    async fn delete(&self, lease: &Lease) -> Result<(), BackendError> {
        let operation = Operation::Delete;
        let counter = signed("counter", lease.counter)
            .map_err(|e| self.out_of_range(operation, &lease.key, e))?;
        let params: crate::call::Params<'_> = &[&&*self.application, &lease.key.as_str(), &counter];
        self.write(operation, &lease.key, sql::DELETE, params).await
    }

    /// One query of the owner index (`kcl_leases_owner`), current: Postgres's index is
    /// updated with the row.
    async fn owned_by(&self, owner: &WorkerId) -> Result<Vec<ShardId>, BackendError> {
        let params: crate::call::Params<'_> = &[&&*self.application, &owner.as_str()];
        let rows = self
            .query(Operation::OwnedBy, None, sql::OWNED_BY, params)
            .await?;
        rows.iter()
            .map(|row| row.try_get::<_, String>(0).map(ShardId::new))
            .collect::<Result<_, _>>()
            .map_err(|e| {
                BackendError::new(
                    ErrorKind::Fatal,
                    "owned_by",
                    format!("{}: {e}", self.subject(None)),
                )
            })
    }
}
