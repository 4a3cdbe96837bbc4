//! The table's setup and the errors a worker meets at a real Postgres: the schema applied
//! once by workers starting together, a schema managed elsewhere, a dropped or old table, a
//! bad password, a server that is not there. Each test keeps its table in a schema of its
//! own, so dropping it disturbs no other test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use kcl_core::{ErrorKind, LeaseStore, ShardId, TableFeatures};
use kcl_postgres::{PostgresLeaseStore, SCHEMA_SQL, TableSetup};

#[tokio::test]
async fn workers_starting_together_apply_the_schema_once() {
    let Some(schema) = common::fresh_schema("together").await else {
        return;
    };
    let url = &schema.url;
    let stores: Vec<_> = (0..4)
        .map(|_| common::store_at(url, "app", TableSetup::Managed))
        .collect();
    let ensured = futures_join_all(
        stores
            .iter()
            .cloned()
            .map(|s| async move { s.ensure_table(TableFeatures::ALL).await }),
    )
    .await;
    for features in ensured {
        let features = features.unwrap();
        assert!(features.owner_index, "the owner index is there");
        assert!(!features.change_feed, "no change feed");
    }
    // Again: nothing to do, nothing fails.
    let again = stores[0].ensure_table(TableFeatures::NONE).await.unwrap();
    assert_eq!(again, TableFeatures::NONE, "only what was asked for");
    schema.drop().await;
}

/// Runs the futures at once (no extra dependency for a join_all).
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut outputs = Vec::new();
    for future in futures {
        set.spawn(future);
    }
    while let Some(output) = set.join_next().await {
        outputs.push(output.unwrap());
    }
    outputs
}

#[tokio::test]
async fn an_external_schema_is_checked_not_created() {
    let Some(schema) = common::fresh_schema("external").await else {
        return;
    };
    let (url, client) = (&schema.url, &schema.client);
    let store = common::store_at(url, "app", TableSetup::External);
    let missing = store.ensure_table(TableFeatures::ALL).await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    assert!(
        missing.to_string().contains("schema.sql"),
        "a hint: {missing}"
    );

    // The team's migration: the table without the index.
    let without_index = SCHEMA_SQL.split("CREATE INDEX").next().unwrap();
    client.batch_execute(without_index).await.unwrap();
    let features = store.ensure_table(TableFeatures::ALL).await.unwrap();
    assert!(!features.owner_index, "no index covers owner");
    client.batch_execute(SCHEMA_SQL).await.unwrap();
    let features = store.ensure_table(TableFeatures::ALL).await.unwrap();
    assert!(features.owner_index);

    // An older table: a column missing is fatal, and says what to do.
    client
        .batch_execute("ALTER TABLE kcl_leases DROP COLUMN acked")
        .await
        .unwrap();
    let old = store.ensure_table(TableFeatures::ALL).await.unwrap_err();
    assert_eq!(old.kind(), ErrorKind::Fatal, "{old}");
    assert!(
        old.to_string().contains("older than this kcl-postgres"),
        "{old}"
    );
    schema.drop().await;
}

#[tokio::test]
async fn a_role_that_may_not_create_starts_managed_on_a_schema_made_by_another() {
    let Some(schema) = common::fresh_schema("granted").await else {
        return;
    };
    let (url, client) = (&schema.url, &schema.client);
    client.batch_execute(SCHEMA_SQL).await.unwrap();
    // A role with the External grants only: no CREATE on the schema, not the table's owner.
    let role = common::unique("kcl_worker");
    let s = &schema.name;
    client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {s} TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.kcl_leases, {s}.kcl_positions TO {role}"
        ))
        .await
        .unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    let as_role = format!("{scheme}://{role}@{host}");
    let store = common::store_at(&as_role, "app", TableSetup::Managed);
    let features = store.ensure_table(TableFeatures::ALL).await.unwrap();
    assert!(features.owner_index);
    assert!(store.create(&common::lease("shard-1")).await.unwrap());
    // With the index gone, completing the schema needs the table's owner: refused, fatal.
    client
        .batch_execute("DROP INDEX kcl_leases_owner")
        .await
        .unwrap();
    let refused = store.ensure_table(TableFeatures::ALL).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fatal, "{refused}");
    drop(store);
    let owned = format!("DROP OWNED BY {role}; ");
    client.batch_execute(&owned).await.unwrap();
    schema.drop().await;
    let admin = common::raw(&common::url().unwrap()).await;
    admin
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dropped_table_is_not_found_with_a_hint() {
    let Some(schema) = common::fresh_schema("dropped").await else {
        return;
    };
    let (url, client) = (&schema.url, &schema.client);
    let store = common::store_at(url, "app", TableSetup::Managed);
    store.ensure_table(TableFeatures::ALL).await.unwrap();
    assert!(store.create(&common::lease("shard-1")).await.unwrap());
    client.batch_execute("DROP TABLE kcl_leases").await.unwrap();
    let error = store.get(&ShardId::new("shard-1")).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
    let text = error.to_string();
    assert!(
        text.contains("shard-1") && text.contains("app"),
        "context: {text}"
    );
    assert!(
        text.contains("schema.sql") && text.contains("42P01"),
        "hint: {text}"
    );
    // ensure_table makes it again, and the store works on.
    store.ensure_table(TableFeatures::ALL).await.unwrap();
    assert_eq!(store.get(&ShardId::new("shard-1")).await.unwrap(), None);
    schema.drop().await;
}

#[tokio::test]
async fn a_bad_password_is_fatal_and_not_repeated() {
    let Some(url) = common::url() else {
        return;
    };
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("postgres");
    let password = "pw-that-must-not-show-7f3a";
    // A role that does not exist: refused (class 28) whether the server asks for a
    // password or trusts local connections.
    let bad = format!("postgres://kcl_no_such_role:{password}@{host}:{port}/{db}?sslmode=disable");
    let error = PostgresLeaseStore::connect(&bad, "app").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Fatal, "{error}");
    let text = kcl_core::error_chain(&error);
    assert!(!text.contains(password), "the password leaked: {text}");
    assert!(text.contains("28"), "the SQLSTATE: {text}");
    assert!(
        text.contains("check the user and password"),
        "a hint: {text}"
    );
}

#[tokio::test]
async fn a_server_that_is_not_there_is_retryable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://kcl:secret-pw@127.0.0.1:{port}/kcl");
    let error = PostgresLeaseStore::connect(&url, "app").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Retryable, "{error}");
    assert!(!kcl_core::error_chain(&error).contains("secret-pw"));
}

#[tokio::test]
async fn a_statement_held_up_past_its_timeout_is_retryable() {
    let Some(url) = common::url() else {
        return;
    };
    let app = common::unique("held_up");
    let store = PostgresLeaseStore::builder(&url, &app)
        .statement_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    store.ensure_table(TableFeatures::ALL).await.unwrap();
    let lease = common::held(&store, "shard-1", "a").await;
    // Another session holds the row's lock: the renewal waits, until the server ends it.
    let mut blocker = common::raw(&url).await;
    let lock = blocker.transaction().await.unwrap();
    let select = "SELECT 1 FROM kcl_leases WHERE application = $1 FOR UPDATE";
    lock.execute(select, &[&app]).await.unwrap();
    let renewal = tokio::time::timeout(Duration::from_secs(5), store.renew(&lease)).await;
    let error = renewal
        .expect("ended by the statement timeout")
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Retryable, "{error}");
    assert!(error.to_string().contains("57014"), "{error}");
    lock.rollback().await.unwrap();
    // The connection is sound, and the renewal goes through now.
    store.renew(&lease).await.unwrap();
}
