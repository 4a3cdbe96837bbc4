//! The Postgres tables checked at start, before any shard is opened: created if missing
//! (under `--table-setup managed`, in one transaction under an advisory lock, so that
//! workers starting together do not race on `CREATE TABLE IF NOT EXISTS`, which can fail
//! with a unique violation on `pg_type` when two run at once), then their columns and keys
//! checked by name (a table another tool made would otherwise fail at the first commit, which
//! stalls the shard); and the calls of the claim ([`Claims`]).

use std::str::FromStr as _;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use kcl_core::Lease;
use kcl_core::outputs::Transact;
use kcl_postgres::Sql;
use tokio_postgres::NoTls;

use super::{APPLICATION, CREATE, PostgresItems, bigint, positions_table, schema_sql};
use crate::table::TableError;
use crate::table::claim::{Claim, Claims};

/// The advisory lock the tables are created under (`kcl_win`, as a number).
const SETUP_LOCK: i64 = 0x006b_636c_5f77_696e;

/// The columns of the windows table this consumer writes and reads, and its key.
const WINDOW_COLUMNS: &[&str] = &[
    "shard",
    "window_start",
    "window_end",
    "records",
    "bytes",
    "commits",
];
const WINDOW_KEY: &str = "shard, window_start";
/// The columns of the positions table, and its key.
const POSITION_COLUMNS: &[&str] = &[
    "shard",
    "application",
    "checkpoint",
    "sub_sequence",
    "fence",
    "baseline",
    "created_by",
    "gaps",
    "last_gap",
    "replays",
    "last_replay",
    "updated_at",
];
const POSITION_KEY: &str = "shard";

/// A pool of connections to the database of `url` for the table's reads and its setup (the
/// commits go through the worker's store): a few connections, each statement bounded to
/// 10 s, plain TCP (the settings refuse an `sslmode` that would need TLS).
///
/// # Errors
/// [`TableError::Call`] for a connection string tokio-postgres cannot read (its message
/// quotes no value of it).
pub fn pool(url: &str) -> Result<Pool, TableError> {
    let failed = |operation, source: Box<dyn std::error::Error + Send + Sync>| TableError::Call {
        table: "(any)".to_owned(),
        operation,
        source,
    };
    let mut config = tokio_postgres::Config::from_str(url)
        .map_err(|e| failed("reading the connection string", Box::new(e)))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    if config.get_application_name().is_none() {
        config.application_name("kcl-example-consumer");
    }
    let options = config.get_options().unwrap_or_default().to_owned();
    if !options.contains("statement_timeout") {
        config.options(format!("{options} -c statement_timeout=10000").trim());
    }
    let manager = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = Manager::from_config(config, NoTls, manager);
    Pool::builder(manager)
        .max_size(4)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| failed("building the pool", Box::new(e)))
}

/// Checks that `table` and its positions table exist with every column and key this
/// consumer uses; creates them first if `create` (`--table-setup managed`).
///
/// # Errors
/// [`TableError::Missing`] (and not `create`), [`TableError::Columns`],
/// [`TableError::NoKey`], or a call's error (a connection refused among them).
pub async fn ensure_tables(pool: &Pool, table: &str, create: bool) -> Result<(), TableError> {
    let call = |operation| {
        move |e: tokio_postgres::Error| TableError::Call {
            table: table.to_owned(),
            operation,
            source: Box::new(e),
        }
    };
    let mut client = pool.get().await.map_err(|e| TableError::Call {
        table: table.to_owned(),
        operation: "connect",
        source: Box::new(e),
    })?;
    if create {
        let transaction = client.transaction().await.map_err(call("BEGIN"))?;
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
            .await
            .map_err(call("pg_advisory_xact_lock"))?;
        transaction
            .batch_execute(&schema_sql(table))
            .await
            .map_err(call("CREATE TABLE"))?;
        transaction.commit().await.map_err(call("COMMIT"))?;
    }
    let positions = positions_table(table);
    check(&client, table, WINDOW_COLUMNS, WINDOW_KEY).await?;
    check(&client, &positions, POSITION_COLUMNS, POSITION_KEY).await
}

/// `table` exists (found through the `search_path`), with `columns` and a unique key on
/// exactly `key`.
async fn check(
    client: &tokio_postgres::Client,
    table: &str,
    columns: &[&str],
    key: &'static str,
) -> Result<(), TableError> {
    let call = |e| TableError::Call {
        table: table.to_owned(),
        operation: "reading the catalog",
        source: Box::new(e),
    };
    let row = client
        .query_one("SELECT to_regclass($1)::oid", &[&table])
        .await
        .map_err(call)?;
    let Some(oid) = row.get::<_, Option<tokio_postgres::types::Oid>>(0) else {
        return Err(TableError::Missing {
            table: table.to_owned(),
            create: CREATE,
        });
    };
    let found: Vec<String> = client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 \
             AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .await
        .map_err(call)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let missing: Vec<String> = columns
        .iter()
        .filter(|c| !found.iter().any(|f| f == *c))
        .map(|c| format!("`{c}`"))
        .collect();
    if !missing.is_empty() {
        return Err(TableError::Columns {
            table: table.to_owned(),
            missing: missing.join(", "),
            found: found.join(", "),
        });
    }
    let mut wanted: Vec<&str> = key.split(", ").collect();
    wanted.sort_unstable();
    // A unique index (the primary key's among them), not partial, on exactly those columns.
    let keyed: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique \
             AND i.indpred IS NULL AND (SELECT array_agg(a.attname::text ORDER BY a.attname) \
             FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) \
             = $2::text[] AND i.indnatts = cardinality($2::text[]))",
            &[&oid, &wanted],
        )
        .await
        .map_err(call)?
        .get(0);
    if keyed {
        Ok(())
    } else {
        Err(TableError::NoKey {
            table: table.to_owned(),
            key,
        })
    }
}

/// The calls of the claim.
impl<S> PostgresItems<S> {
    async fn claim_row(&self) -> Result<Claim, TableError> {
        let statement = format!(
            "SELECT application, baseline FROM {} WHERE shard = $1",
            self.positions
        );
        let client = self.client("SELECT of the application row").await?;
        let row = client
            .query_opt(&statement, &[&APPLICATION])
            .await
            .map_err(|e| self.call("SELECT of the application row", e))?;
        let Some(row) = row else {
            return Ok(Claim::Absent);
        };
        let (application, baseline): (String, Option<String>) = (row.get(0), row.get(1));
        Ok(match application {
            app if app != self.application => Claim::Other(app),
            _ if baseline.as_deref() == Some("done") => Claim::Done,
            _ => Claim::Pending,
        })
    }

    async fn insert_claim(&self) -> Result<Claim, TableError> {
        let statement = format!(
            "INSERT INTO {} (shard, application, created_by, baseline) \
             VALUES ($1, $2, $3, 'pending') ON CONFLICT (shard) DO NOTHING",
            self.positions
        );
        let client = self.client("INSERT of the application row").await?;
        let inserted = client
            .execute(&statement, &[&APPLICATION, &self.application, &self.worker])
            .await
            .map_err(|e| self.call("INSERT of the application row", e))?;
        if inserted == 0 {
            // Another worker made it first: what it says.
            return self.claim_row().await;
        }
        tracing::info!(
            table = self.table,
            application = self.application,
            "the exactly-once table's first use by this application: claimed for it"
        );
        Ok(Claim::Pending)
    }

    async fn insert_baseline(&self, lease: &Lease) -> Result<bool, TableError> {
        let statement = format!(
            "INSERT INTO {} (shard, application, checkpoint, sub_sequence, baseline) \
             VALUES ($1, $2, $3, $4, 'recorded') ON CONFLICT (shard) DO NOTHING",
            self.positions
        );
        let checkpoint = lease.checkpoint.as_str().to_owned();
        let sub = bigint(lease.checkpoint.sub_sequence());
        let client = self.client("INSERT of a baseline").await?;
        let inserted = client
            .execute(
                &statement,
                &[&lease.key.as_str(), &self.application, &checkpoint, &sub],
            )
            .await
            .map_err(|e| self.call("INSERT of a baseline", e))?;
        Ok(inserted == 1)
    }

    fn call(&self, operation: &'static str, e: tokio_postgres::Error) -> TableError {
        TableError::Call {
            table: self.table.clone(),
            operation,
            source: Box::new(e),
        }
    }
}

impl<S: Transact<Write = Sql>> Claims for PostgresItems<S> {
    fn read_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>> {
        Box::pin(self.claim_row())
    }

    fn create_claim(&self) -> BoxFuture<'_, Result<Claim, TableError>> {
        Box::pin(self.insert_claim())
    }

    fn record_baseline<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, TableError>> {
        Box::pin(self.insert_baseline(lease))
    }

    fn baseline_done(&self) -> BoxFuture<'_, Result<(), TableError>> {
        Box::pin(async move {
            let statement = format!(
                "UPDATE {} SET baseline = 'done', updated_at = now() \
                 WHERE shard = $1 AND application = $2",
                self.positions
            );
            let client = self.client("UPDATE of the application row").await?;
            client
                .execute(&statement, &[&APPLICATION, &self.application])
                .await
                .map_err(|e| self.call("UPDATE of the application row", e))?;
            Ok(())
        })
    }
}
