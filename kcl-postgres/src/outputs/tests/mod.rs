//! Commits against a real Postgres (the server of `KCL_POSTGRES_URL`, as the integration
//! tests; skipped without it, failing under `CI=true`), called directly: kcl-core's `Commit`
//! is built only by kcl-core, so these make the [`Request`] it is read into. The worker's
//! whole path (retries, reading the row back, the lease following the sink) is in
//! `tests/exactly_once.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod leases;
mod sink;

#[path = "../../../tests/common/proxy.rs"]
mod proxy;

use std::sync::atomic::{AtomicU32, Ordering};

use kcl_core::outputs::CommitError;
use kcl_core::{
    Checkpoint, CheckpointUpdate, ExtendedSequenceNumber, FencingToken, Lease, LeaseStore,
    SequenceNumber, ShardId, TableFeatures, WorkerId,
};

use super::{Request, Sql};
use crate::PostgresLeaseStore;

/// The test server's URL; `None`: skip (never under CI).
fn url() -> Option<String> {
    match std::env::var("KCL_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("KCL_POSTGRES_URL is not set under CI: start Postgres (localstack/postgres up)")
        }
        _ => {
            eprintln!("*** SKIPPED: KCL_POSTGRES_URL is not set");
            None
        }
    }
}

/// A name no other test or run uses.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A plain connection to `url`.
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A sequence checkpoint.
fn at(n: u128) -> Checkpoint {
    Checkpoint::Sequence(ExtendedSequenceNumber::new(SequenceNumber::from(n)))
}

/// A store on an application of its own, an output table `orders (id bigint PRIMARY KEY,
/// total int NOT NULL CHECK (total >= 0))` and a sequence `<orders>_ran` a statement can
/// advance (a sequence is not rolled back: it shows a statement ran in a transaction that
/// did not commit).
struct Fixture {
    url: String,
    store: PostgresLeaseStore,
    client: tokio_postgres::Client,
    orders: String,
}

impl Fixture {
    async fn new(test: &str) -> Option<Self> {
        let url = url()?;
        let store = PostgresLeaseStore::connect(&url, &unique(test))
            .await
            .unwrap();
        store.ensure_table(TableFeatures::ALL).await.unwrap();
        let client = raw(&url).await;
        let orders = unique("orders");
        let sql = format!(
            "CREATE TABLE {orders} (id bigint PRIMARY KEY, total int NOT NULL \
             CHECK (total >= 0)); CREATE SEQUENCE {orders}_ran"
        );
        client.batch_execute(&sql).await.unwrap();
        Some(Self {
            url,
            store,
            client,
            orders,
        })
    }

    /// An order `id` of `total`.
    fn insert(&self, id: i64, total: i32) -> Sql {
        Sql::new(format!(
            "INSERT INTO {} (id, total) VALUES ($1, $2)",
            self.orders
        ))
        .bind(id)
        .bind(total)
    }

    /// A statement that advances the sequence.
    fn ran(&self) -> Sql {
        Sql::new(format!("SELECT nextval('{}_ran')", self.orders))
    }

    /// A statement that holds its transaction open for `seconds`.
    fn sleep(seconds: f64) -> Sql {
        Sql::new("SELECT pg_sleep($1)").bind(seconds)
    }

    /// The orders' ids, in order.
    async fn ids(&self) -> Vec<i64> {
        let sql = format!("SELECT id FROM {} ORDER BY id", self.orders);
        let rows = self.client.query(&sql, &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// Whether a statement of `ran` ever ran.
    async fn any_ran(&self) -> bool {
        let sql = format!("SELECT is_called FROM {}_ran", self.orders);
        self.client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// The row of `key`.
    async fn row(&self, key: &str) -> Lease {
        self.store.get(&ShardId::new(key)).await.unwrap().unwrap()
    }

    /// Lease `key` at checkpoint 100, taken by `owner`.
    async fn held(&self, key: &str, owner: &str) -> Lease {
        let fresh = Lease::new(ShardId::new(key), at(100));
        assert!(self.store.create(&fresh).await.unwrap());
        self.store
            .take(&fresh, &WorkerId::new(owner))
            .await
            .unwrap()
    }
}

/// One commit's parts, kept to be sent (and sent again).
#[derive(Debug, Clone)]
struct Call {
    shard: ShardId,
    owner: WorkerId,
    fence: FencingToken,
    before: Checkpoint,
    update: CheckpointUpdate,
    writes: Vec<Sql>,
}

impl Call {
    /// A commit by `row`'s tenure from its checkpoint to `to`.
    fn new(row: &Lease, to: Checkpoint, writes: Vec<Sql>) -> Self {
        Self {
            shard: row.key.clone(),
            owner: row.owner.clone().unwrap(),
            fence: row.fence.unwrap(),
            before: row.checkpoint.clone(),
            update: CheckpointUpdate::new(to),
            writes,
        }
    }

    /// A commit by the tenure of `owner` and `fence` on `shard`.
    fn of(shard: &str, owner: &str, fence: u64, before: Checkpoint, to: Checkpoint) -> Self {
        Self {
            shard: ShardId::new(shard),
            owner: WorkerId::new(owner),
            fence: FencingToken(fence),
            before,
            update: CheckpointUpdate::new(to),
            writes: Vec::new(),
        }
    }

    fn with(mut self, writes: Vec<Sql>) -> Self {
        self.writes = writes;
        self
    }

    fn request(&self) -> Request<'_> {
        Request {
            shard: &self.shard,
            owner: &self.owner,
            fence: self.fence,
            before: &self.before,
            update: &self.update,
            writes: &self.writes,
        }
    }

    async fn send(&self, store: &PostgresLeaseStore) -> Result<(), CommitError> {
        store.transact(self.request()).await
    }
}

/// Fails unless `result` is the lease row's refusal.
#[track_caller]
#[allow(
    clippy::needless_pass_by_value,
    reason = "called with a commit's outcome"
)]
fn lease_row(result: Result<(), CommitError>) {
    assert!(
        matches!(result, Err(CommitError::LeaseRow)),
        "expected LeaseRow, got {result:?}"
    );
}

#[test]
fn the_proxy_splits_a_url_around_its_host() {
    let (a, b, c) = proxy::split("postgres://kcl@127.0.0.1:5432/kcl?x=1");
    assert_eq!((a, b, c), ("postgres://kcl@", "127.0.0.1:5432", "/kcl?x=1"));
    let (a, b, c) = proxy::split("postgres://db:5432");
    assert_eq!((a, b, c), ("postgres://", "db:5432", ""));
}
