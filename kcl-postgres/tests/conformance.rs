//! The conformance suite of every `LeaseStore` (`kcl_core::conformance`) against
//! `PostgresLeaseStore` on the server of `KCL_POSTGRES_URL`: each test on an application of
//! its own in the shared table (a store reads and writes only its application's rows, so
//! that is a table of its own to the suite). The commit checks (`transact_conformance!`)
//! come with the store's exactly-once outputs.

#![allow(clippy::expect_used)]

mod common;

/// A store on a fresh application, its table ensured by the check; `None` skips the test
/// (no `KCL_POSTGRES_URL`, never under `CI=true`).
async fn fresh_store() -> Option<kcl_postgres::PostgresLeaseStore> {
    let url = common::url()?;
    let app = common::unique("conformance");
    let store = kcl_postgres::PostgresLeaseStore::builder(&url, &app).build();
    Some(store.expect("a store on KCL_POSTGRES_URL"))
}

kcl_core::lease_store_conformance!(fresh_store().await);
