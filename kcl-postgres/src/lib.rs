//! A [`kcl_core::LeaseStore`] on Postgres: a fleet keeps its leases and checkpoints in a
//! Postgres table instead of DynamoDB, and runs with Kinesis and Postgres only.
//!
//! ```no_run
//! # async fn run() -> Result<(), kcl_core::BackendError> {
//! use kcl_postgres::PostgresLeaseStore;
//! // The URL from the application's own settings (this crate reads no environment).
//! let url = "postgres://kcl:secret@db.internal:5432/kcl?sslmode=verify-full";
//! let leases = PostgresLeaseStore::connect(url, "orders-app").await?;
//! // Worker::builder(stream, leases) … as with any store.
//! # Ok(()) }
//! ```
//!
//! Why it is written the way it is:
//! - **One table for every application**, `kcl_leases`, keyed by (application, lease key),
//!   with every field of a lease a typed column ([`SCHEMA_SQL`], shipped as
//!   `kcl-postgres/schema.sql` for teams that run their own migrations). The store creates
//!   it on [`ensure_table`](kcl_core::LeaseStore::ensure_table) unless told
//!   [`TableSetup::External`].
//! - **Every write is one conditional statement** (`UPDATE … WHERE owner IS NOT DISTINCT
//!   FROM $ AND counter = $ … RETURNING …`), autocommitted: no read-modify-write, no
//!   transaction held across a round trip. Under READ COMMITTED (the default) the row lock
//!   serialises two writers and the second re-checks its condition against the first's row,
//!   so exactly one of two takes wins. A statement that matched no row is
//!   [`ErrorKind::Conflict`](kcl_core::ErrorKind::Conflict).
//! - **The owner index** is a partial index on (application, owner); `owned_by` queries it
//!   and is current, not eventually consistent. **No change feed**: observers read the
//!   application's rows whole (see `extras` for why LISTEN/NOTIFY does not fit).
//! - **Every request is counted** by operation ([`kcl_core::lease::usage`]), with the rows
//!   reads returned; Postgres bills no capacity units, so those stay zero.
//! - **Errors** are mapped from SQLSTATE in one match (see `error`), with the operation,
//!   application and lease key; never the connection string.
//!
//! The client: [tokio-postgres](https://docs.rs/tokio-postgres), the Postgres client most
//! async Rust services use, plain SQL and no ORM, prepared statements and SQLSTATE codes as
//! typed values; its pool is [deadpool-postgres](https://docs.rs/deadpool-postgres) (small,
//! tokio-only, caches prepared statements per connection). TLS is rustls with aws-lc-rs
//! through tokio-postgres-rustls, the provider the AWS SDK already builds, with libpq's
//! `sslmode` meanings ([`TlsMode`]). sqlx was the other candidate: its pool and TLS are
//! built in, but it brings its own runtime layer, many more crates, and its query macros'
//! appeal (checking SQL at build time) needs a database at build time; eleven constant
//! statements do not need it.
//!
//! # Exactly-once outputs
//!
//! A processor's SQL statements ([`Sql`]: a statement and its values) commit in one
//! transaction with the checkpoint of the records they are outputs of, fenced by the lease
//! (`kcl_core::outputs` says why that is exactly once): a replay starts after the
//! checkpoint, and a worker that lost the lease commits nothing. Two ways, by where the
//! leases live:
//! - **Leases in Postgres too**: [`PostgresLeaseStore`] is the
//!   [`Transact`](kcl_core::outputs::Transact). The transaction updates the lease row's
//!   checkpoint on the tenure's owner, fence and checkpoint before (first, so a zombie stops
//!   there), then runs the statements.
//! - **Leases in DynamoDB**: [`PostgresSink`] keeps each shard's position in its own table,
//!   `kcl_positions`, beside the outputs; the worker fences it for each tenure
//!   ([`WorkerBuilder::positions`](kcl_core::WorkerBuilder::positions)) and the lease row's
//!   checkpoint follows each commit.
//!
//! A statement refused by its own constraint fails its record
//! ([`CheckpointError::OutputRefused`](kcl_core::CheckpointError::OutputRefused)), as does
//! one whose values cannot be written (a value out of range, or one that cannot be encoded:
//! [`OutputInvalid`](kcl_core::CheckpointError::OutputInvalid)); a statement wrong for every
//! record (a column not migrated yet, a syntax error), a missing table or privilege, a lost
//! connection or a serialization failure is the store's error and gives no record up. A
//! commit holds at most [`COMMIT_LIMITS`]; a longer stretch commits in parts.
//!
//! ```no_run
//! use kcl_core::outputs::{Outputs, Transact};
//! use kcl_core::{
//!     BoxError, Checkpointer, LeaseStore, ProcessRecordsInput, RecordProcessor, ShardSource,
//!     Worker,
//! };
//! use kcl_postgres::{PostgresLeaseStore, PostgresSink, Sql};
//!
//! /// Writes one row per order event, exactly once, into `outputs`.
//! struct Orders<T> {
//!     outputs: T,
//! }
//!
//! impl<T: Transact<Write = Sql>> RecordProcessor for Orders<T> {
//!     async fn process_records(
//!         &mut self,
//!         input: ProcessRecordsInput<'_>,
//!         cp: &mut Checkpointer,
//!     ) -> Result<(), BoxError> {
//!         let mut outputs = Outputs::new();
//!         for record in input.records() {
//!             let write = Sql::new(
//!                 "INSERT INTO order_events (position, body) VALUES ($1, $2) \
//!                  ON CONFLICT (position) DO NOTHING",
//!             )
//!             .bind(record.position().to_string())
//!             .bind(record.data.to_vec());
//!             outputs.push(record, write);
//!         }
//!         // The rows and the checkpoint, in one transaction fenced by the lease.
//!         Ok(cp.commit_outputs(&self.outputs, outputs).await?)
//!     }
//! }
//!
//! /// Leases in Postgres too: the lease store commits the outputs.
//! async fn leases_in_postgres(stream: impl ShardSource, url: &str) -> Result<(), BoxError> {
//!     let leases = PostgresLeaseStore::connect(url, "orders-app").await?;
//!     let outputs = leases.clone();
//!     let worker = Worker::builder(stream, leases)
//!         .build(move |_shard| Orders { outputs: outputs.clone() })?;
//!     # let _ = worker;
//!     Ok(())
//! }
//!
//! /// Leases in DynamoDB (`dynamodb`: kcl-aws's store): the sink keeps each shard's position
//! /// beside the outputs, and the worker fences it for each tenure.
//! async fn leases_elsewhere(
//!     stream: impl ShardSource,
//!     dynamodb: impl LeaseStore,
//!     url: &str,
//! ) -> Result<(), BoxError> {
//!     let sink = PostgresSink::connect(url, "orders-app").await?;
//!     let outputs = sink.clone();
//!     let worker = Worker::builder(stream, dynamodb)
//!         .positions(sink)
//!         .build(move |_shard| Orders { outputs: outputs.clone() })?;
//!     # let _ = worker;
//!     Ok(())
//! }
//! ```

mod call;
mod config;
mod error;
mod extras;
mod outputs;
mod schema;
mod sql;
mod store;
mod tls;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use kcl_core::BackendError;
use kcl_core::lease::usage::Usage;

pub use self::config::{PostgresLeaseStoreBuilder, TableSetup};
pub use self::outputs::{COMMIT_LIMITS, PostgresSink, PostgresSinkBuilder, Sql};
pub use self::schema::SCHEMA_SQL;
pub use self::tls::TlsMode;

/// A connection string as it may be shown (in an error, a log line, a printed
/// configuration): a `postgres://` URL without its user information, which may hold the
/// password, and with only the query parameters known to hold none (`sslmode`,
/// `sslrootcert`, `target_session_attrs`, `options`, …): `postgres://db.internal:5432/kcl?sslmode=verify-full`;
/// libpq's `key=value` words as `<connection string>`. Everything up to the last `@` goes (a
/// password may hold `?`, `#` or `/`): hiding too much is harmless, showing part of a
/// password is not.
pub fn redacted_url(url: &str) -> String {
    /// Parameters that never hold a secret, shown so that an operator can check them.
    const SHOWN: &[&str] = &[
        "sslmode",
        "sslrootcert",
        "target_session_attrs",
        "options",
        "connect_timeout",
        "application_name",
        "host",
        "hostaddr",
        "port",
        "dbname",
        "channel_binding",
    ];
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<connection string>".to_owned();
    };
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split('#').next().unwrap_or_default();
    let (place, query) = rest.split_once('?').unwrap_or((rest, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| SHOWN.contains(&pair.split('=').next().unwrap_or_default()))
        .collect();
    match kept.as_slice() {
        [] => format!("{scheme}://{place}"),
        kept => format!("{scheme}://{place}?{}", kept.join("&")),
    }
}

/// A [`LeaseStore`](kcl_core::LeaseStore) on a Postgres table shared by applications. See
/// the crate docs. Clones share the pool, the counts and the unreadable rows.
#[derive(Debug, Clone)]
pub struct PostgresLeaseStore {
    pool: Pool,
    application: Arc<str>,
    setup: TableSetup,
    usage: Usage,
    /// Rows the last whole read could not parse, by key.
    unreadable: Arc<Mutex<BTreeMap<Option<String>, String>>>,
    /// The table named in errors: `kcl_leases`, or `kcl_positions` for a sink's pool.
    table: &'static str,
}

impl PostgresLeaseStore {
    /// A store of `application`'s leases in the database of `url`, once one connection could
    /// be opened; the defaults of [`builder`](Self::builder). `url` is a libpq connection
    /// string (`postgres://user:password@host:port/database?sslmode=verify-full`, or
    /// `host=… user=…` words).
    pub async fn connect(url: &str, application: &str) -> Result<Self, BackendError> {
        Self::builder(url, application).connect().await
    }

    /// A builder of a store of `application`'s leases in the database of `url`: the pool's
    /// size, TLS, timeouts and who looks after the table.
    pub fn builder(url: &str, application: &str) -> PostgresLeaseStoreBuilder {
        PostgresLeaseStoreBuilder::new(url, application)
    }

    pub(crate) fn new(pool: Pool, application: String, setup: TableSetup) -> Self {
        Self {
            pool,
            application: application.into(),
            setup,
            usage: Usage::default(),
            unreadable: Arc::default(),
            table: "kcl_leases",
        }
    }

    /// The same pool and application, its errors naming `table` (a sink's `kcl_positions`).
    pub(crate) fn on_table(mut self, table: &'static str) -> Self {
        self.table = table;
        self
    }

    /// The application whose leases this store reads and writes.
    pub fn application(&self) -> &str {
        &self.application
    }

    /// Opens a connection (or finds one open): the server answers and takes the credentials.
    pub(crate) async fn check_connection(&self) -> Result<(), BackendError> {
        self.lend("connect", None).await.map(call::Lent::give_back)
    }
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn a_redacted_url_has_no_credentials() {
        let shown =
            redacted_url("postgres://kcl:p?w/d#x@db:5432/kcl?password=hunter2&sslmode=require");
        assert_eq!(shown, "postgres://db:5432/kcl?sslmode=require");
        let hidden = redacted_url("postgres://db/kcl?sslpassword=x&passfile=/p&options=-c");
        assert_eq!(hidden, "postgres://db/kcl?options=-c");
        assert_eq!(redacted_url("postgresql://db/kcl"), "postgresql://db/kcl");
        let words = redacted_url("host=db password=hunter2");
        assert_eq!(words, "<connection string>");
    }
}
