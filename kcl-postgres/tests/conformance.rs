//! The conformance suite of every `LeaseStore` (`kcl_core::conformance`) against
//! `PostgresLeaseStore` on the server of `KCL_POSTGRES_URL`: each test on an application of
//! its own in the shared table (a store reads and writes only its application's rows, so
//! that is a table of its own to the suite). The commit checks (`transact_conformance!`) run
//! against the store's exactly-once outputs, each with an output table of its own.

#![allow(clippy::expect_used)]

mod common;

use std::future::Future;

use kcl_core::BoxError;
use kcl_core::conformance::TransactFixture;
use kcl_postgres::{PostgresLeaseStore, Sql};

/// A store on a fresh application, its table ensured by the check; `None` skips the test
/// (no `KCL_POSTGRES_URL`, never under `CI=true`).
async fn fresh_store() -> Option<PostgresLeaseStore> {
    let url = common::url()?;
    let app = common::unique("conformance");
    let store = PostgresLeaseStore::builder(&url, &app).build();
    Some(store.expect("a store on KCL_POSTGRES_URL"))
}

kcl_core::lease_store_conformance!(fresh_store().await);

/// A store on a fresh application and an output table of its own: `(item, count)`.
struct Outputs {
    store: PostgresLeaseStore,
    client: tokio_postgres::Client,
    table: String,
}

/// The commit checks' fixture, or `None` to skip.
async fn fresh_outputs() -> Option<Outputs> {
    let store = fresh_store().await?;
    let client = common::raw(&common::url()?).await;
    let table = common::unique("outputs");
    let create = format!("CREATE TABLE {table} (item text PRIMARY KEY, count bigint NOT NULL)");
    client
        .batch_execute(&create)
        .await
        .expect("an output table");
    Some(Outputs {
        store,
        client,
        table,
    })
}

impl TransactFixture for Outputs {
    type Store = PostgresLeaseStore;

    fn store(&self) -> &PostgresLeaseStore {
        &self.store
    }

    fn add(&self, item: &str) -> Sql {
        let t = &self.table;
        Sql::new(format!(
            "INSERT INTO {t} (item, count) VALUES ($1, 1) \
             ON CONFLICT (item) DO UPDATE SET count = {t}.count + 1"
        ))
        .bind(item.to_owned())
    }

    fn create(&self, item: &str) -> Sql {
        let t = &self.table;
        Sql::new(format!("INSERT INTO {t} (item, count) VALUES ($1, 0)")).bind(item.to_owned())
    }

    fn item(&self, item: &str) -> impl Future<Output = Result<Option<i64>, BoxError>> + Send {
        let sql = format!("SELECT count FROM {} WHERE item = $1", self.table);
        let item = item.to_owned();
        async move {
            let rows = self.client.query(&sql, &[&item]).await?;
            Ok(rows.first().map(|r| r.try_get(0)).transpose()?)
        }
    }

    /// Postgres keeps no idempotency tokens: a retry of an applied commit is refused by the
    /// lease row's checkpoint, and the core reads the row.
    fn keeps_tokens(&self) -> bool {
        false
    }
}

kcl_core::transact_conformance!(fresh_outputs().await);
