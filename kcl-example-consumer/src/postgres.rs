//! `--lease-store postgres://…` and the exactly-once table in Postgres (feature `postgres`):
//! the lease store, and the window table committed through it or through a sink.
//!
//! - **Leases in Postgres**: a [`PostgresLeaseStore`] on the application's rows of
//!   `kcl_leases` (created under `--table-setup managed`, as kcl-postgres does); the window
//!   table is a table of the same database, each commit one transaction with the lease row
//!   (the store is the `Transact`).
//! - **Leases in DynamoDB, table in Postgres** (`--exactly-once-store`): a [`PostgresSink`]
//!   keeps each shard's position in `kcl_positions` beside the windows; the worker is given
//!   it (`WorkerBuilder::positions`, in `run_worker`) and fences it for each tenure, and the
//!   lease's checkpoint follows each commit.
//!
//! The URL's password is never shown: errors and logs name the store by its redacted URL
//! ([`kcl_postgres::redacted_url`]), and kcl-postgres's own errors never carry it.

use std::sync::Arc;

use anyhow::Context as _;
use kcl_example_consumer::table::postgres::{self, PostgresItems};
use kcl_example_consumer::table::{Transactional, WindowTable, claim::claim};
use kcl_postgres::{PostgresLeaseStore, PostgresSink, TableSetup};

use crate::exactly_once::{ExactlyOnce, finish};
use crate::settings::{PostgresUrl, Settings};

/// kcl-postgres's table setup for `--table-setup`.
fn table_setup(settings: &Settings) -> TableSetup {
    match settings.table_setup {
        kcl_aws::TableSetup::External => TableSetup::External,
        _ => TableSetup::Managed,
    }
}

/// The worker's lease store on the database of `url` (`--lease-store`), once a connection
/// could be opened: a wrong password or an unreachable server stops the consumer here.
pub(crate) async fn lease_store(
    settings: &Settings,
    url: &PostgresUrl,
) -> anyhow::Result<PostgresLeaseStore> {
    let store = PostgresLeaseStore::builder(url.expose(), &settings.application_name)
        .table_setup(table_setup(settings))
        .connect()
        .await
        .with_context(|| format!("cannot open the lease store at {url} (--lease-store)"))?;
    tracing::info!(store = %url, application = settings.application_name, "leases in Postgres");
    Ok(store)
}

/// The window table of `--exactly-once-table`, if there is one, with the leases in Postgres:
/// a table of the lease database, committed with the lease row.
pub(crate) async fn table_in_leases(
    settings: &Settings,
    url: &PostgresUrl,
    store: &PostgresLeaseStore,
) -> anyhow::Result<Option<ExactlyOnce>> {
    let Some(name) = &settings.exactly_once_table else {
        return Ok(None);
    };
    let items: PostgresItems<PostgresLeaseStore> = items(settings, url, name).await?;
    claim(&items, store).await.map_err(invalid)?;
    let table: Arc<dyn WindowTable> = Arc::new(Transactional::new(store.clone(), items));
    tracing::info!(
        table = name,
        store = %url,
        application = settings.application_name,
        "each window's counts commit with its checkpoint in one Postgres transaction, exactly once"
    );
    finish(store.clone(), table, &settings.application_name)
        .await
        .map(Some)
}

/// The window table of `--exactly-once-table` in the database of `--exactly-once-store`,
/// for a worker whose leases are in DynamoDB (`leases`): committed through a sink, which the
/// worker must be given.
pub(crate) async fn table_in_sink(
    settings: &Settings,
    url: &PostgresUrl,
    name: &str,
    leases: &kcl_aws::DynamoDbLeaseStore,
) -> anyhow::Result<ExactlyOnce> {
    let sink = PostgresSink::builder(url.expose(), &settings.application_name)
        .table_setup(table_setup(settings))
        .connect()
        .await
        .with_context(|| {
            format!("cannot open the exactly-once store at {url} (--exactly-once-store)")
        })?;
    let items: PostgresItems<PostgresSink> = items(settings, url, name).await?;
    claim(&items, leases).await.map_err(invalid)?;
    let table: Arc<dyn WindowTable> = Arc::new(Transactional::new(sink.clone(), items));
    tracing::info!(
        table = name,
        store = %url,
        application = settings.application_name,
        "each window's counts commit with the shard's position in one Postgres transaction \
         (the lease's checkpoint follows), exactly once"
    );
    let mut found = finish(leases.clone(), table, &settings.application_name).await?;
    found.positions = Some(sink);
    Ok(found)
}

/// The table's rows in the database of `url`, its tables checked (created first under
/// `--table-setup managed`).
async fn items<S>(
    settings: &Settings,
    url: &PostgresUrl,
    name: &str,
) -> anyhow::Result<PostgresItems<S>> {
    let pool = postgres::pool(url.expose()).map_err(invalid)?;
    let create = table_setup(settings) == TableSetup::Managed;
    postgres::ensure_tables(&pool, name, create)
        .await
        .map_err(invalid)?;
    let worker = settings.worker_id.as_str();
    Ok(PostgresItems::new(
        pool,
        name,
        &settings.application_name,
        worker,
    ))
}

fn invalid(e: kcl_example_consumer::table::TableError) -> anyhow::Error {
    anyhow::Error::new(e).context("invalid setting `exactly-once-table`")
}
