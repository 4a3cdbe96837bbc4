//! Where a test's workers keep their leases: the DynamoDB emulator (the default) or Postgres.
//!
//! The fleet tests were written against DynamoDB; kcl-postgres's store must pass the same
//! ones. Rather than copy them, a test body takes a [`Context`] and asks it for the lease rows
//! ([`Context::list`], [`Context::owners`]): a context made by [`Context::new_postgres`] reads
//! them from Postgres, and the worker processes it spawns get `--lease-store postgres://…`
//! ([`Context::lease_store_args`]), with the test's table name as their application. Kinesis
//! stays on the emulator either way.
//!
//! The server is `KCL_POSTGRES_URL` (`localstack/postgres up` prints it). Without it a
//! Postgres test is skipped, except under `CI=true`, where it fails, as with the emulators.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use kcl_core::{Lease, LeaseStore};
use kcl_postgres::PostgresLeaseStore;

use crate::Context;

/// Which store a test's leases are in.
#[derive(Debug, Clone, Default)]
pub enum Leases {
    /// The test's table on the DynamoDB emulator ([`Context::store`]).
    #[default]
    DynamoDb,
    /// Application [`Context::table`]'s rows on a Postgres server (behind an `Arc`: a
    /// test's futures hold its context, and clippy counts their bytes).
    Postgres(Arc<PostgresLeases>),
}

/// Where a test's leases are in Postgres.
#[derive(Debug)]
pub struct PostgresLeases {
    /// The server's URL, handed to worker processes.
    pub url: String,
    /// A store on the test's rows, for the test's own reads.
    pub store: PostgresLeaseStore,
}

/// The Postgres server of the tests; `Ok(None)`: skip the test (never under `CI=true`).
pub fn postgres_url() -> anyhow::Result<Option<String>> {
    match std::env::var("KCL_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Ok(Some(url)),
        _ if crate::is_ci() => {
            bail!("KCL_POSTGRES_URL is not set under CI: start Postgres (localstack/postgres up)")
        }
        _ => {
            eprintln!(
                "\n*** SKIPPED: KCL_POSTGRES_URL is not set (localstack/postgres up prints it)\n"
            );
            Ok(None)
        }
    }
}

impl Context {
    /// As [`new`](Self::new), with the leases in Postgres (`KCL_POSTGRES_URL`): worker
    /// processes keep them there, and [`owners`](Self::owners) and [`list`](Self::list)
    /// read them there. `None` if the test is to be skipped.
    pub async fn new_postgres(test: &str) -> anyhow::Result<Option<Self>> {
        let Some(url) = postgres_url()? else {
            return Ok(None);
        };
        let Some(mut ctx) = Self::new(test).await? else {
            return Ok(None);
        };
        let store = PostgresLeaseStore::builder(&url, &ctx.table)
            .build()
            .context("a Postgres lease store on KCL_POSTGRES_URL")?;
        ctx.leases = Leases::Postgres(Arc::new(PostgresLeases { url, store }));
        Ok(Some(ctx))
    }

    /// The Postgres store of this test's leases, if they are in Postgres.
    pub fn postgres(&self) -> Option<&PostgresLeaseStore> {
        match &self.leases {
            Leases::DynamoDb => None,
            Leases::Postgres(pg) => Some(&pg.store),
        }
    }

    /// Every lease row of this test, from the store its workers use.
    pub async fn list(&self) -> anyhow::Result<Vec<Lease>> {
        Ok(match &self.leases {
            Leases::DynamoDb => self.store().list().await?,
            Leases::Postgres(pg) => pg.store.list().await?,
        })
    }

    /// The command-line arguments that put a worker process's leases where this test's
    /// are: none for DynamoDB (the default), `--lease-store URL` for Postgres.
    pub fn lease_store_args(&self) -> Vec<String> {
        match &self.leases {
            Leases::DynamoDb => Vec::new(),
            Leases::Postgres(pg) => vec!["--lease-store".to_owned(), pg.url.clone()],
        }
    }
}
