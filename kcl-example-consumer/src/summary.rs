//! The fleet's summary job (`--summary-every`): a periodic singleton on the lease table.
//!
//! Every worker of the fleet is a candidate; one at a time runs it, once per period, and a
//! period never twice (see `kcl_core::singleton::periodic`). It prints one JSON line on
//! stdout — the lease table's state, and the messages sent to the job since its last run —
//! and hands the job back at once on the first signal, as the worker hands its leases back.
//! With `--messages-secret-file` any process can send to it (`POST
//! /singletons/summary/messages` on the HTTP server of whichever worker runs it; the row says
//! which), authenticated by the shared secret.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use kcl_core::LeaseStore;
use kcl_core::singleton::{Period, Singleton, SingletonConfig, is_coordination_key};
use kcl_serve::HttpMessenger;
use kcl_serve::messenger::Limits;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::settings::Settings;

/// The job's name: its row is `kcl-coordination/summary`.
pub(crate) const NAME: &str = "summary";

/// The running candidacy.
pub(crate) struct SummaryJob {
    /// Cancelled at the first signal: the row goes back at once.
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<()>,
    /// The messages route, to mount on the HTTP server (with a secret only).
    pub(crate) routes: Option<Router>,
}

/// Starts competing for the summary job, if `--summary-every` is set.
pub(crate) fn start<L: LeaseStore + Clone>(
    settings: &Settings,
    store: &L,
) -> anyhow::Result<Option<SummaryJob>> {
    let Some(summary) = &settings.summary else {
        return Ok(None);
    };
    let config = SingletonConfig::default().failover_time(settings.worker.failover_time);
    let mut job = Singleton::new(NAME, settings.worker_id.as_str(), store.clone(), config)
        .map_err(|e| anyhow::anyhow!("invalid setting `summary-every`: {}", e.reason))?;
    let mut routes = None;
    if let Some((secret, advertise)) = &summary.messages {
        let messenger = HttpMessenger::new(&secret.0, Some(advertise.clone()), Limits::default());
        routes = Some(messenger.router());
        job = job.with_messenger(Arc::new(messenger));
    }
    let stop = CancellationToken::new();
    let (until, every, store) = (stop.clone(), summary.every, store.clone());
    let task = tokio::spawn(async move {
        let result = job
            .every(every, until, move |period| {
                let store = store.clone();
                async move { report(&store, &period).await }
            })
            .await;
        if let Err(error) = result {
            tracing::error!(%error, "the summary job failed");
        }
    });
    Ok(Some(SummaryJob { stop, task, routes }))
}

/// One period's line.
async fn report<L: LeaseStore>(store: &L, period: &Period) {
    let messages: Vec<String> = period
        .messages()
        .iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect();
    let leases = match store.list().await {
        Ok(leases) => leases,
        Err(error) => {
            tracing::warn!(%error, "the summary job cannot read the lease table");
            return;
        }
    };
    let shards: Vec<_> = leases
        .iter()
        .filter(|l| !is_coordination_key(&l.key))
        .collect();
    let mut by_owner: BTreeMap<String, usize> = BTreeMap::new();
    for lease in shards.iter().filter(|l| !l.is_finished()) {
        let owner = lease
            .owner
            .as_ref()
            .map_or("(none)".to_owned(), ToString::to_string);
        *by_owner.entry(owner).or_default() += 1;
    }
    let line = serde_json::json!({
        "fleet_summary": {
            "period": period.index,
            "fencing_token": period.fencing_token().0,
            "leases": shards.len(),
            "finished": shards.iter().filter(|l| l.is_finished()).count(),
            "by_owner": by_owner,
            "messages": messages,
        }
    });
    println!("{line}");
}
