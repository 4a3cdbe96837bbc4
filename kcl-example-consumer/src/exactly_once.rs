//! `--exactly-once-table` at start: the table checked (created under `--table-setup
//! managed`), claimed for this application, the lease table compared with it at once and
//! every minute; the shards found ahead of the table listed as problems on `/status`
//! (`outputs_out_of_step`), and `GET /exactly-once` to show everything found (shards behind
//! included, which are not problems: their records are skipped, the table stays exact).
//!
//! Why a worker that finds records checkpointed without their windows does not fail its
//! readiness, nor refuse to start: the windows are missing already, and no restart brings them
//! back; the worker at fault is the one *without* the flag, which cannot be told, and a
//! flagged worker that stops (or a rollout that stalls on it) only leaves the shards longer
//! to the worker at fault. What an operator needs is to learn it at once and where they look:
//! an ERROR line naming the shard, the table and both positions, the counter and the gauge of
//! [`step`](kcl_example_consumer::table::step) (an alert on either), a problem on `/status`
//! (never in readiness, for the reasons above), this route, and the position item of the
//! shard, which records the gap for whoever reads the table. A table of
//! another application, or of another key, is refused at start: nothing would be right.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use kcl_example_consumer::table::WindowTable;

use crate::settings::Settings;

/// The table of `--exactly-once-table`, and its route.
pub(crate) struct ExactlyOnce {
    pub(crate) table: Arc<dyn WindowTable>,
    pub(crate) routes: Router,
    /// The sink it commits through, if it keeps each shard's position itself
    /// (`--exactly-once-store`): the worker must be given it.
    #[cfg(feature = "postgres")]
    pub(crate) positions: Option<kcl_postgres::PostgresSink>,
}

impl ExactlyOnce {
    /// Its route, and the shards found ahead of the table as problems on `/status`.
    pub(crate) fn served(&self) -> crate::Served {
        let table = self.table.clone();
        let problems = kcl_serve::AppProblems::new(move || {
            let found = table.mismatches().problems();
            found
                .into_iter()
                .map(|(kind, shard, detail)| kcl_serve::AppProblem::new(kind, shard, detail))
                .collect()
        });
        crate::Served {
            routes: self.routes.clone(),
            problems,
        }
    }
}

/// Sets the table of `--exactly-once-table` up, if there is one, in DynamoDB: its writes
/// commit through `store`, the worker's lease store (`--exactly-once-store` puts it in
/// Postgres instead: `crate::postgres`).
pub(crate) async fn setup(
    settings: &Settings,
    store: &kcl_aws::DynamoDbLeaseStore,
) -> anyhow::Result<Option<ExactlyOnce>> {
    use kcl_example_consumer::table::dynamodb;
    let Some(name) = &settings.exactly_once_table else {
        return Ok(None);
    };
    let invalid = |e| anyhow::Error::new(e).context("invalid setting `exactly-once-table`");
    let create = settings.table_setup == kcl_aws::TableSetup::Managed;
    dynamodb::ensure_table(store.client(), name, create)
        .await
        .map_err(invalid)?;
    let worker = settings.worker_id.to_string();
    let items =
        dynamodb::DynamoDbItems::new(store.client().clone(), name, store.table_name(), &worker);
    dynamodb::claim(&items, store).await.map_err(invalid)?;
    let table = kcl_example_consumer::table::Transactional::new(store.clone(), items);
    tracing::info!(
        table = name,
        application = store.table_name(),
        "each window's counts commit with its checkpoint, exactly once"
    );
    finish(store.clone(), Arc::new(table), store.table_name())
        .await
        .map(Some)
}

/// The table, claimed already, compared with the lease table of `leases` at once and every
/// minute, and its route.
pub(crate) async fn finish<L: kcl_core::LeaseStore + Clone>(
    leases: L,
    table: Arc<dyn WindowTable>,
    application: &str,
) -> anyhow::Result<ExactlyOnce> {
    // At start, before any shard is opened: what happened while no flagged worker ran.
    if let Ok(found) = leases.list().await {
        table
            .check(&found, None)
            .await
            .map_err(|e| anyhow::Error::new(e).context("invalid setting `exactly-once-table`"))?;
    }
    kcl_example_consumer::table::watch(leases, table.clone());
    let routes = routes(table.clone(), application);
    Ok(ExactlyOnce {
        table,
        routes,
        #[cfg(feature = "postgres")]
        positions: None,
    })
}

/// `GET /exactly-once`: the table, and the shards found out of step by this process.
fn routes(table: Arc<dyn WindowTable>, application: &str) -> Router {
    let state = (table, application.to_owned());
    Router::new()
        .route("/exactly-once", get(show))
        .with_state(Arc::new(state))
}

async fn show(
    State(state): State<Arc<(Arc<dyn WindowTable>, String)>>,
) -> axum::Json<serde_json::Value> {
    let (table, application) = &*state;
    let found = table.mismatches();
    let listed: Vec<serde_json::Value> = found
        .recent()
        .iter()
        .map(|m| {
            serde_json::json!({
                "shard": m.shard.to_string(),
                "kind": m.step.as_str(),
                "lease_checkpoint": m.lease.to_string(),
                "table_position": m.table.as_ref().map(ToString::to_string),
                "found": m.found.as_str(),
                "at": m.at.to_rfc3339(),
                "detail": m.to_string(),
            })
        })
        .collect();
    axum::Json(serde_json::json!({
        "table": table.name(),
        "application": application,
        "shards_ahead": found.ahead().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "out_of_step": listed,
    }))
}
