//! Problems a process finds beside its worker's: an application's own checks (the example
//! consumer's exactly-once table found out of step with the lease table, say), listed in
//! `/status`'s `problems` with the worker's, where an operator already looks, and where
//! `kcl-admin` and dashboards read them.
//!
//! Why never in readiness: readiness is what kcl decides makes a pod unfit for traffic (a
//! shard whose every attempt fails, so a rollout of a broken processor stops at its first
//! pod). A problem an application reports is often one no restart of this pod fixes (a
//! worker elsewhere at fault, data already missing): an unready pod would only stall the
//! rollout that could bring the fix, or hand its shards to the worker at fault.

use std::fmt;
use std::sync::Arc;

/// One problem the process reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppProblem {
    /// A short `snake_case` name, as kcl's own kinds are shown
    /// ([`ProblemKind::as_str`](kcl_core::ProblemKind::as_str)).
    pub kind: String,
    /// What it is about: a shard (its lease key), a table, a row.
    pub key: String,
    /// What was found and what to do.
    pub detail: String,
}

impl AppProblem {
    /// A problem of `kind` about `key`.
    pub fn new(kind: impl Into<String>, key: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            key: key.into(),
            detail: detail.into(),
        }
    }
}

/// Where the process's own problems are read: called at each `/status`, so it should be
/// cheap (read what a background check found; do not check there).
#[derive(Clone)]
pub struct AppProblems(Arc<dyn Fn() -> Vec<AppProblem> + Send + Sync>);

impl AppProblems {
    /// Problems as `list` says at the time of each `/status`.
    pub fn new(list: impl Fn() -> Vec<AppProblem> + Send + Sync + 'static) -> Self {
        Self(Arc::new(list))
    }

    /// The problems now.
    pub fn list(&self) -> Vec<AppProblem> {
        (self.0)()
    }
}

impl fmt::Debug for AppProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AppProblems").finish_non_exhaustive()
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Mutex;
    use std::time::Duration;

    use kcl_core::{Phase, Problem, ProblemKind, Status, WorkerConfig};
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tokio::sync::watch;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tests::get;
    use crate::{Probes, router_with, server};

    /// The process's own problems are listed in `/status` after the worker's, as they are
    /// when asked, and never make it unready.
    #[tokio::test]
    async fn the_process_problems_are_listed_and_leave_it_ready() {
        let ago = Instant::now().checked_sub(Duration::from_secs(1));
        let (tx, rx) = watch::channel(Status::default());
        tx.send_modify(|s| {
            s.phase = Phase::Running;
            s.store_reachable = true;
            s.heartbeat = ago;
            s.last_cycle = ago;
            s.problems = vec![Problem::new(ProblemKind::Stalled, "shardId-1", "waited")];
        });
        let found = Arc::new(Mutex::new(Vec::new()));
        let extra = {
            let found = found.clone();
            AppProblems::new(move || found.lock().map(|v| v.clone()).unwrap_or_default())
        };
        let listener = server::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let probes = Probes::for_worker(&WorkerConfig::default());
        let metrics = PrometheusBuilder::new().build_recorder().handle();
        let routes = router_with("w-1".into(), rx, metrics, probes, Some(extra));
        let limits = server::Limits::default();
        let server = tokio::spawn(server::serve(
            listener,
            routes,
            stop.clone().cancelled_owned(),
            limits,
        ));
        let problems = async || {
            let (_, body) = get(addr, "/status").await;
            let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let listed = status["problems"].as_array().cloned().unwrap_or_default();
            let kinds: Vec<String> = listed
                .iter()
                .map(|p| format!("{} {}", p["kind"], p["key"]))
                .collect();
            (kinds, status["ready"].clone())
        };
        let (kinds, ready) = problems().await;
        assert_eq!(kinds, ["\"stalled\" \"shardId-1\""]);
        assert_eq!(ready, serde_json::json!(true));
        let out_of_step = AppProblem::new("outputs_out_of_step", "shardId-2", "lease ahead");
        found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(out_of_step);
        let (kinds, ready) = problems().await;
        assert_eq!(
            kinds,
            [
                "\"stalled\" \"shardId-1\"",
                "\"outputs_out_of_step\" \"shardId-2\""
            ]
        );
        assert_eq!(ready, serde_json::json!(true), "never in readiness");
        assert_eq!(get(addr, "/readyz").await.0, 200);
        stop.cancel();
        assert!(matches!(server.await, Ok(Ok(()))));
    }
}
