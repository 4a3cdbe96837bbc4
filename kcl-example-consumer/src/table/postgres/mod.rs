//! The table of window counts in Postgres: its rows, their writes (`Sql`, committed in the
//! transaction of the checkpoint) and reads.
//!
//! Two tables, both named after `--exactly-once-table NAME` ([`schema_sql`]):
//!
//! - **`NAME`, the windows**: one row per (`shard`, `window_start`) with `window_end`,
//!   `records`, `bytes` and `commits` (how many owners' commits built it). A window's write is
//!   `INSERT … ON CONFLICT (shard, window_start) DO UPDATE SET records = records +
//!   EXCLUDED.records, …`: a window emitted in two parts (a graceful handoff, then its next
//!   owner) adds up to its exact count, as DynamoDB's `ADD` does.
//! - **`NAME_positions`, the positions and the application**: a shard's row (`shard` its
//!   lease key) holds `checkpoint` and `sub_sequence`, the checkpoint its last commit wrote
//!   in the same transaction as its windows, with `application` and `fence`; and what a
//!   worker found out of step (`gaps`, `last_gap`, `replays`, `last_replay`; see
//!   [`step`](super::step)). The row `#application` names the one application the tables
//!   belong to (`application`, `created_by`, `baseline`: `pending`, then `done`); see
//!   [`claim`](super::claim).
//!
//! The commits go through the worker's own store: [`kcl_postgres::PostgresLeaseStore`] when
//! the leases are in this database (one transaction with the lease row), or a
//! [`kcl_postgres::PostgresSink`] when they are in DynamoDB (one transaction with the sink's
//! `kcl_positions` row; the lease's checkpoint follows). The position row is kept in both:
//! the sink's row is the sink's (keyed by application, so it cannot tell that a second
//! application writes this table, and a worker without the flag moves only the lease), and
//! reading it would reach into kcl-postgres's own table.
//!
//! **A second application's commit is refused by the database itself**: the position's
//! upsert sets `application` to NULL when the row names another one, and the column is
//! `NOT NULL`, so the statement fails with a constraint violation and the transaction (the
//! windows with it) rolls back; the worker is then told which application owns the table.
//!
//! The reads (positions, the application row, the tables' shape at start) go through a pool
//! of this module's own ([`pool`]): kcl-postgres lends none of its connections.

mod setup;

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use kcl_core::outputs::Transact;
use kcl_core::{Checkpoint, FencingToken, ShardId};
use kcl_postgres::Sql;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

pub use self::setup::{ensure_tables, pool};
use super::error::TableError;
use super::step::{Mismatch, Step};
use super::{Items, Position};
use crate::window::WindowSummary;

/// The key of the application row in the positions table (no shard's starts with `#`).
pub const APPLICATION: &str = "#application";

/// Where [`TableError::Missing`] sends an operator for the statements.
pub const CREATE: &str = "the CREATE TABLE statements of NAME and NAME_positions in \
                          kcl-example-consumer/README.md";

/// The statements that make the tables of `table` (`--table-setup managed` runs them,
/// under an advisory lock).
pub fn schema_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    shard        text        NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    records      bigint      NOT NULL,
    bytes        bigint      NOT NULL,
    commits      bigint      NOT NULL,
    PRIMARY KEY (shard, window_start)
);
CREATE TABLE IF NOT EXISTS {table}_positions (
    shard        text        PRIMARY KEY,
    application  text        NOT NULL,
    checkpoint   text,
    sub_sequence bigint      NOT NULL DEFAULT 0,
    fence        bigint,
    baseline     text,
    created_by   text,
    gaps         bigint      NOT NULL DEFAULT 0,
    last_gap     text,
    replays      bigint      NOT NULL DEFAULT 0,
    last_replay  text,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
"
    )
}

/// The positions table of the windows table `table`.
pub fn positions_table(table: &str) -> String {
    format!("{table}_positions")
}

/// The rows of one application's tables, committed through a store `S` (a
/// [`kcl_postgres::PostgresLeaseStore`] or a [`kcl_postgres::PostgresSink`]).
pub struct PostgresItems<S> {
    pool: Pool,
    table: String,
    positions: String,
    application: String,
    worker: String,
    /// The window's upsert and the position's, written once.
    statements: Arc<(Arc<str>, Arc<str>)>,
    store: PhantomData<fn() -> S>,
}

impl<S> Clone for PostgresItems<S> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            table: self.table.clone(),
            positions: self.positions.clone(),
            application: self.application.clone(),
            worker: self.worker.clone(),
            statements: self.statements.clone(),
            store: PhantomData,
        }
    }
}

impl<S> fmt::Debug for PostgresItems<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresItems")
            .field("table", &self.table)
            .field("application", &self.application)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl<S> PostgresItems<S> {
    /// Rows of `table` (and its positions table), read through `pool`, written by `worker` of
    /// `application`. `table` must be a plain identifier (the settings check it).
    pub fn new(pool: Pool, table: &str, application: &str, worker: &str) -> Self {
        let positions = positions_table(table);
        let window = format!(
            "INSERT INTO {table} AS w (shard, window_start, window_end, records, bytes, commits) \
             VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (shard, window_start) DO UPDATE SET \
             records = w.records + EXCLUDED.records, bytes = w.bytes + EXCLUDED.bytes, \
             commits = w.commits + 1, window_end = EXCLUDED.window_end"
        );
        // Another application's row: `application` NULL, refused by NOT NULL (module docs).
        let position = format!(
            "INSERT INTO {positions} AS p (shard, application, checkpoint, sub_sequence, fence) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (shard) DO UPDATE SET \
             application = CASE WHEN p.application = EXCLUDED.application \
             THEN EXCLUDED.application END, checkpoint = EXCLUDED.checkpoint, \
             sub_sequence = EXCLUDED.sub_sequence, fence = EXCLUDED.fence, updated_at = now()"
        );
        Self {
            pool,
            table: table.to_owned(),
            positions,
            application: application.to_owned(),
            worker: worker.to_owned(),
            statements: Arc::new((window.into(), position.into())),
            store: PhantomData,
        }
    }

    /// A connection of the pool.
    async fn client(
        &self,
        operation: &'static str,
    ) -> Result<deadpool_postgres::Object, TableError> {
        self.pool.get().await.map_err(|e| TableError::Call {
            table: self.table.clone(),
            operation,
            source: Box::new(e),
        })
    }

    /// A failed read or write of `operation`: [`TableError::Gone`] if a table is missing.
    fn failed(
        &self,
        operation: &'static str,
        shard: &ShardId,
        e: tokio_postgres::Error,
    ) -> TableError {
        if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
            return TableError::Gone {
                table: self.table.clone(),
                create: CREATE,
                shard: shard.clone(),
                when: "reading the position of",
            };
        }
        TableError::Call {
            table: self.table.clone(),
            operation,
            source: Box::new(e),
        }
    }

    /// The rows of `shards` in the positions table.
    async fn read(&self, shards: &[ShardId]) -> Result<HashMap<ShardId, Position>, TableError> {
        let Some(first) = shards.first() else {
            return Ok(HashMap::new());
        };
        let keys: Vec<&str> = shards.iter().map(ShardId::as_str).collect();
        let statement = format!(
            "SELECT shard, application, checkpoint, sub_sequence FROM {} WHERE shard = ANY($1)",
            self.positions
        );
        let client = self.client("SELECT of the positions").await?;
        let rows = client
            .query(&statement, &[&keys])
            .await
            .map_err(|e| self.failed("SELECT of the positions", first, e))?;
        let mut found = HashMap::new();
        for row in rows {
            let (shard, application): (String, String) = (row.get(0), row.get(1));
            let (checkpoint, sub): (Option<String>, i64) = (row.get(2), row.get(3));
            let sub = u64::try_from(sub).unwrap_or(0);
            if let Some(checkpoint) = checkpoint.and_then(|c| Checkpoint::parse(&c, sub)) {
                let application = Some(application);
                found.insert(
                    ShardId::new(shard),
                    Position {
                        checkpoint,
                        application,
                    },
                );
            }
        }
        Ok(found)
    }
}

/// A non-negative count as Postgres's `bigint`.
fn bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl<S: Transact<Write = Sql>> Items for PostgresItems<S> {
    type Store = S;

    fn table(&self) -> &str {
        &self.table
    }

    fn application(&self) -> &str {
        &self.application
    }

    fn worker(&self) -> &str {
        &self.worker
    }

    fn window(&self, summary: &WindowSummary) -> Sql {
        Sql::new(self.statements.0.clone())
            .bind(summary.shard.clone())
            .bind(summary.window_start)
            .bind(summary.window_end)
            .bind(bigint(summary.records))
            .bind(bigint(summary.bytes))
    }

    fn position(&self, shard: &ShardId, checkpoint: &Checkpoint, fence: FencingToken) -> Sql {
        Sql::new(self.statements.1.clone())
            .bind(shard.as_str().to_owned())
            .bind(self.application.clone())
            .bind(checkpoint.as_str().to_owned())
            .bind(bigint(checkpoint.sub_sequence()))
            .bind(bigint(fence.0))
    }

    fn read_positions<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<HashMap<ShardId, Position>, TableError>> {
        Box::pin(self.read(shards))
    }

    fn realign<'a>(&'a self, mismatch: &'a Mismatch) -> BoxFuture<'a, Result<bool, TableError>> {
        Box::pin(realign(self, mismatch))
    }

    fn diagnose<'a>(&'a self, shard: &'a ShardId) -> BoxFuture<'a, Option<TableError>> {
        Box::pin(async move {
            let client = self.client("diagnose").await.ok()?;
            let row = client
                .query_one(
                    "SELECT to_regclass($1) IS NULL, to_regclass($2) IS NULL",
                    &[&self.table, &self.positions],
                )
                .await
                .ok()?;
            let gone = match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
                (true, _) => &self.table,
                (false, true) => &self.positions,
                (false, false) => return None,
            };
            Some(TableError::Gone {
                table: gone.clone(),
                create: CREATE,
                shard: shard.clone(),
                when: "committing windows of",
            })
        })
    }
}

/// [`Items::realign`]: the mismatch counted and described in the position row, if it still
/// holds what was found; a lease ahead also moves it to the lease's checkpoint.
async fn realign<S>(items: &PostgresItems<S>, mismatch: &Mismatch) -> Result<bool, TableError> {
    let (count, last) = match mismatch.step {
        Step::Behind => ("replays", "last_replay"),
        Step::Missing | Step::InStep => ("gaps", "last_gap"),
    };
    let description = mismatch.description(&items.worker);
    let shard = mismatch.shard.as_str();
    let lease = (
        mismatch.lease.as_str().to_owned(),
        bigint(mismatch.lease.sub_sequence()),
    );
    let p = &items.positions;
    let client = items.client("UPDATE of a position").await?;
    let updated = match &mismatch.table {
        // No position (the lease is ahead): a row made, or one without a checkpoint filled.
        None => {
            let statement = format!(
                "INSERT INTO {p} AS p (shard, application, checkpoint, sub_sequence, {count}, \
                 {last}) VALUES ($1, $2, $3, $4, 1, $5) ON CONFLICT (shard) DO UPDATE SET \
                 checkpoint = $3, sub_sequence = $4, {count} = p.{count} + 1, {last} = $5, \
                 updated_at = now() WHERE p.checkpoint IS NULL AND p.application = $2"
            );
            let values: [&(dyn ToSql + Sync); 5] =
                [&shard, &items.application, &lease.0, &lease.1, &description];
            client.execute(&statement, &values).await
        }
        Some(was) => {
            let was = (was.as_str().to_owned(), bigint(was.sub_sequence()));
            let mut values: Vec<&(dyn ToSql + Sync)> =
                vec![&shard, &items.application, &description, &was.0, &was.1];
            // A lease ahead moves the position to it; one behind leaves it.
            let moves = if mismatch.step == Step::Behind {
                ""
            } else {
                values.extend([&lease.0 as &(dyn ToSql + Sync), &lease.1]);
                "checkpoint = $6, sub_sequence = $7, "
            };
            let statement = format!(
                "UPDATE {p} AS p SET {moves}{count} = p.{count} + 1, {last} = $3, \
                 updated_at = now() WHERE p.shard = $1 AND p.application = $2 \
                 AND p.checkpoint = $4 AND p.sub_sequence = $5"
            );
            client.execute(&statement, &values).await
        }
    };
    updated
        .map(|rows| rows == 1)
        .map_err(|e| items.failed("UPDATE of a position", &mismatch.shard, e))
}

/// Every window row of `table`: `(shard, window_start) → records` (for tests and tools).
///
/// # Errors
/// The SELECT's.
pub async fn read_counts(
    client: &tokio_postgres::Client,
    table: &str,
) -> Result<HashMap<(String, DateTime<Utc>), u64>, TableError> {
    let statement = format!("SELECT shard, window_start, records FROM {table}");
    let rows = client
        .query(&statement, &[])
        .await
        .map_err(|e| TableError::Call {
            table: table.to_owned(),
            operation: "SELECT",
            source: Box::new(e),
        })?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let records: i64 = row.get(2);
            (
                (row.get(0), row.get(1)),
                u64::try_from(records).unwrap_or(0),
            )
        })
        .collect())
}
