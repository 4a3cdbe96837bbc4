//! The conformance suite of every `LeaseStore` (`kcl_core::conformance`) against the
//! in-memory store, the reference the suite's expectations are read from: every check of
//! the lease protocol, and the commit checks of its exactly-once outputs.
//!
//! The same suite runs against DynamoDB on moto (`tests/tests/conformance.rs`) and against
//! Postgres (`kcl-postgres/tests/conformance.rs`, on the server `localstack/postgres up`
//! starts): one macro call per store, with a fresh store per test.

use std::future::Future;

use kcl_core::BoxError;
use kcl_core::conformance::TransactFixture;
use kcl_core::memory::{Condition, MemoryLeaseStore, MemoryWrite};

kcl_core::lease_store_conformance!(MemoryLeaseStore::new());

/// The in-memory store's commits: its output table holds counts per key.
#[derive(Debug, Default)]
struct MemoryCommits {
    store: MemoryLeaseStore,
}

impl TransactFixture for MemoryCommits {
    type Store = MemoryLeaseStore;

    fn store(&self) -> &MemoryLeaseStore {
        &self.store
    }

    fn add(&self, item: &str) -> MemoryWrite {
        MemoryWrite::add(item, 1)
    }

    fn create(&self, item: &str) -> MemoryWrite {
        MemoryWrite::put(item, "created").when(Condition::Absent)
    }

    fn item(&self, item: &str) -> impl Future<Output = Result<Option<i64>, BoxError>> + Send {
        std::future::ready(Ok(self.store.output(item).map(|i| i.count)))
    }

    /// For 10 minutes, as DynamoDB.
    fn keeps_tokens(&self) -> bool {
        true
    }
}

mod commits {
    use super::MemoryCommits;

    kcl_core::transact_conformance!(MemoryCommits::default());
}
