//! [`PostgresSink`]: exactly-once outputs into Postgres while the leases live elsewhere
//! (DynamoDB). Its table, `kcl_positions`, keeps each shard's position beside the outputs;
//! its rules are those of `kcl_core::outputs::Positions` (and of kcl-core's in-memory model,
//! `MemoryPositionSink`), kept in SQL by `positions`.
//!
//! The sink is built like a lease store (the same pool, TLS and timeouts: it is one, on
//! another table), and creates its table on [`PostgresSink::ensure_table`] unless told
//! [`TableSetup::External`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl_core::BackendError;
use kcl_core::lease::usage::Operation;

use crate::tls::TlsMode;
use crate::{PostgresLeaseStore, PostgresLeaseStoreBuilder, TableSetup, schema, sql};

/// A sink that keeps each shard's position with the outputs committed into it, in
/// Postgres, for a fleet whose leases live elsewhere (DynamoDB): a
/// [`Transact`](kcl_core::outputs::Transact) whose writes are [`Sql`](crate::Sql) and whose
/// [`keeps_position`](kcl_core::outputs::Transact::keeps_position) is true, and the
/// [`Positions`](kcl_core::outputs::Positions) the worker fences for each tenure. Give it to
/// the worker ([`WorkerBuilder::positions`](kcl_core::WorkerBuilder::positions)) and to the
/// processors, which commit into it with
/// [`Checkpointer::commit_outputs`](kcl_core::Checkpointer::commit_outputs).
///
/// Its rows, in `kcl_positions` (see `schema.sql`), one per (application, shard):
/// - **open** hands the row to the opening tenure (its owner and fence, whatever the row
///   named before: a lease table made again starts its fences over) and returns its
///   position; it waits for a commit in flight, which lands first or is refused;
/// - **commit** locks the row; a row naming another tenure refuses it
///   ([`CommitError::LeaseRow`](kcl_core::outputs::CommitError::LeaseRow), counted by
///   [`fenced_off`](Self::fenced_off)); a row already at the commit's checkpoint is the same
///   commit applied by an attempt whose answer was lost (success, applied once); a row past
///   the commit's checkpoint before refuses it; otherwise the statements run and the
///   position moves, in one transaction.
///
/// Clones share the pool and the counts.
#[derive(Debug, Clone)]
pub struct PostgresSink {
    /// The pool, application and table setup, and errors' context, on `kcl_positions`.
    pub(super) store: PostgresLeaseStore,
    pub(super) counts: Arc<Counts>,
}

/// What a sink counts, shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) fenced_off: AtomicU64,
}

impl PostgresSink {
    /// A sink of `application`'s positions in the database of `url` (a libpq connection
    /// string, as [`PostgresLeaseStore::connect`] takes), its table ensured; the defaults of
    /// [`builder`](Self::builder).
    pub async fn connect(url: &str, application: &str) -> Result<Self, BackendError> {
        Self::builder(url, application).connect().await
    }

    /// A builder of a sink of `application`'s positions in the database of `url`: the
    /// pool's size, TLS, timeouts and who looks after the table.
    pub fn builder(url: &str, application: &str) -> PostgresSinkBuilder {
        PostgresSinkBuilder {
            inner: PostgresLeaseStore::builder(url, application),
        }
    }

    /// The application whose positions this sink keeps (the lease table's, so that two
    /// fleets' shards of one name never share a row).
    pub fn application(&self) -> &str {
        self.store.application()
    }

    /// Commits refused because the shard's row named another tenure: a worker that lost
    /// the lease (frozen, partitioned) and committed anyway, a zombie kept out.
    pub fn fenced_off(&self) -> u64 {
        self.counts.fenced_off.load(Ordering::Relaxed)
    }

    /// Creates `kcl_positions` if it is missing (its part of `schema.sql`, under the
    /// advisory lock the lease store takes), unless built with [`TableSetup::External`];
    /// then checks that the table has every column the sink uses.
    ///
    /// # Errors
    /// As the lease store's `ensure_table`: `NotFound` for a table missing under
    /// `External`, `Fatal` for one without the sink's columns or a role without privileges.
    pub async fn ensure_table(&self) -> Result<(), BackendError> {
        let operation = Operation::EnsureTable;
        let present = self
            .store
            .query(operation, None, sql::POSITIONS_PRESENT, &[]);
        let present = present
            .await?
            .first()
            .and_then(|r| r.try_get::<_, bool>(0).ok());
        if self.store.setup == TableSetup::Managed && present != Some(true) {
            let mut conn = self.store.lend(operation.as_str(), None).await?;
            let result = async {
                let transaction = conn.transaction().await?;
                PostgresLeaseStore::in_transaction(&transaction, sql::SCHEMA_LOCK).await?;
                transaction.batch_execute(schema::positions_sql()).await?;
                transaction.commit().await
            }
            .await;
            self.store
                .settle(&mut conn, operation, None, result, |_| 0)?;
        }
        let probe = sql::PROBE_POSITIONS;
        self.store.query(operation, None, probe, &[]).await?;
        Ok(())
    }
}

/// Builds a [`PostgresSink`]: [`PostgresSink::builder`]. The settings are a lease store's
/// ([`PostgresLeaseStoreBuilder`]).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` or `connect` is called"]
pub struct PostgresSinkBuilder {
    inner: PostgresLeaseStoreBuilder,
}

impl PostgresSinkBuilder {
    /// The most connections the sink holds (default 8): one per commit or open in flight,
    /// so about as many as shards commit at once.
    pub fn pool_size(self, connections: usize) -> Self {
        self.with(|b| b.pool_size(connections))
    }

    /// As [`PostgresLeaseStoreBuilder::tls`].
    pub fn tls(self, mode: TlsMode) -> Self {
        self.with(|b| b.tls(mode))
    }

    /// As [`PostgresLeaseStoreBuilder::root_certificates_pem`].
    pub fn root_certificates_pem(self, pem: impl Into<Vec<u8>>) -> Self {
        self.with(|b| b.root_certificates_pem(pem))
    }

    /// Who looks after `kcl_positions` (default [`TableSetup::Managed`]).
    pub fn table_setup(self, setup: TableSetup) -> Self {
        self.with(|b| b.table_setup(setup))
    }

    /// The server's `statement_timeout` (default 10 s): bounds each statement of a commit,
    /// the processor's among them.
    pub fn statement_timeout(self, timeout: Duration) -> Self {
        self.with(|b| b.statement_timeout(timeout))
    }

    /// As [`PostgresLeaseStoreBuilder::connect_timeout`].
    pub fn connect_timeout(self, timeout: Duration) -> Self {
        self.with(|b| b.connect_timeout(timeout))
    }

    /// As [`PostgresLeaseStoreBuilder::pool_wait`].
    pub fn pool_wait(self, timeout: Duration) -> Self {
        self.with(|b| b.pool_wait(timeout))
    }

    fn with(
        self,
        set: impl FnOnce(PostgresLeaseStoreBuilder) -> PostgresLeaseStoreBuilder,
    ) -> Self {
        Self {
            inner: set(self.inner),
        }
    }

    /// The sink, its pool empty and its table not checked: the first call connects.
    ///
    /// # Errors
    /// `Fatal` for a connection string, `sslmode` or root certificate it cannot use.
    pub fn build(self) -> Result<PostgresSink, BackendError> {
        let store = self.inner.build()?.on_table("kcl_positions");
        Ok(PostgresSink {
            store,
            counts: Arc::default(),
        })
    }

    /// The sink, its table ensured ([`PostgresSink::ensure_table`]): a wrong password, an
    /// unreachable server or a missing table is reported here.
    ///
    /// # Errors
    /// As [`build`](Self::build) and [`PostgresSink::ensure_table`].
    pub async fn connect(self) -> Result<PostgresSink, BackendError> {
        let sink = self.build()?;
        sink.ensure_table().await?;
        Ok(sink)
    }
}
