//! What the Postgres tests share: the server's URL, a store per test on an application of its
//! own, and a schema of its own for tests that change the table.
//!
//! The server is `KCL_POSTGRES_URL` (`localstack/postgres up` prints it; any server the
//! role may create schemas on will do). Without it a test is skipped, except under
//! `CI=true`, where it fails: CI must run them.

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

pub(crate) mod proxy;

use std::sync::atomic::{AtomicU32, Ordering};

use kcl_core::{Checkpoint, Lease, LeaseStore, ShardId, TableFeatures, WorkerId};
use kcl_postgres::{PostgresLeaseStore, TableSetup};

/// The test server's URL; `None`: skip the test (never under CI).
pub(crate) fn url() -> Option<String> {
    match std::env::var("KCL_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("KCL_POSTGRES_URL is not set under CI: start Postgres (localstack/postgres up)")
        }
        _ => {
            eprintln!(
                "*** SKIPPED: KCL_POSTGRES_URL is not set (localstack/postgres up prints it)"
            );
            None
        }
    }
}

/// A name no other test or run uses.
pub(crate) fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A store on the shared table, for an application of this test's own, its table ensured.
pub(crate) async fn store(test: &str) -> Option<PostgresLeaseStore> {
    let url = url()?;
    let store = PostgresLeaseStore::connect(&url, &unique(test))
        .await
        .unwrap();
    store.ensure_table(TableFeatures::ALL).await.unwrap();
    Some(store)
}

/// A second store (another pool) on the same application as `store`.
pub(crate) async fn twin(store: &PostgresLeaseStore) -> PostgresLeaseStore {
    let url = url().unwrap();
    PostgresLeaseStore::connect(&url, store.application())
        .await
        .unwrap()
}

/// A raw connection to the test server (for what the store does not do: drop a table).
pub(crate) async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// `url` with its search path set to `schema`, so a store on it uses a table of its own.
pub(crate) fn in_schema(url: &str, schema: &str) -> String {
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}options=-csearch_path%3D{schema}")
}

/// A schema of one test's own: its URL, and a raw connection whose search path is it.
#[derive(Debug)]
pub(crate) struct Schema {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) client: tokio_postgres::Client,
}

impl Schema {
    /// Drops the schema and what is in it (a test that fails leaves it, to look at).
    pub(crate) async fn drop(self) {
        let sql = format!("DROP SCHEMA {} CASCADE", self.name);
        self.client.batch_execute(&sql).await.unwrap();
    }
}

/// A new, empty schema.
pub(crate) async fn fresh_schema(test: &str) -> Option<Schema> {
    let url = url()?;
    let name = unique(test);
    let client = raw(&url).await;
    client
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await
        .unwrap();
    let url = in_schema(&url, &name);
    let client = raw(&url).await;
    Some(Schema { name, url, client })
}

/// A store on `url` for application `app`, with `setup`.
pub(crate) fn store_at(url: &str, app: &str, setup: TableSetup) -> PostgresLeaseStore {
    PostgresLeaseStore::builder(url, app)
        .table_setup(setup)
        .build()
        .unwrap()
}

/// A fresh lease of `key`, unowned at TRIM_HORIZON.
pub(crate) fn lease(key: &str) -> Lease {
    Lease::new(ShardId::new(key), Checkpoint::TrimHorizon)
}

/// `lease` created and taken by `owner`: the row as stored.
pub(crate) async fn held(store: &PostgresLeaseStore, key: &str, owner: &str) -> Lease {
    let fresh = lease(key);
    assert!(store.create(&fresh).await.unwrap());
    store.take(&fresh, &WorkerId::new(owner)).await.unwrap()
}
