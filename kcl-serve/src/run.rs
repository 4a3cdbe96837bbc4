//! A worker run as a deployed process runs it: probes and metrics served from before it starts
//! until it has stopped, graceful shutdown on the first signal (or on `POST /drain`, see
//! [`drain`](crate::drain)), forced on the second; with feature `scaler`, KEDA's external
//! scaler on a port of its own while the worker runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use kcl_core::{LeaseStore, ProcessorFactory, ShardSource, Worker, WorkerConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::drain;
use crate::{
    Metrics, OtlpSettings, Probes, ServeError, install_metrics, on_signals, router_with, server,
};

/// How long a forced shutdown may take before the run ends regardless.
const FORCE_GRACE: Duration = Duration::from_secs(3);

/// The HTTP side of a process, set up before its worker exists: a bad listen address or a
/// second metrics recorder fails before anything else starts.
#[derive(Debug)]
pub struct Serving {
    listener: TcpListener,
    metrics: Metrics,
    probes: Probes,
    shutdown_timeout: Duration,
    /// Whether the worker keeps its leases for its restart on a shutdown (`restart_grace`).
    restart_grace: bool,
    /// Where the drain token is written; `None`: [`drain::token::default_path`] of the HTTP
    /// port.
    drain_token: Option<PathBuf>,
    /// KEDA's external scaler's address, bound (feature `scaler`).
    #[cfg(feature = "scaler")]
    scaler: Option<TcpListener>,
}

/// What else a run serves and obeys.
#[derive(Debug, Default)]
pub struct Options {
    /// Routes served next to the probes and metrics.
    pub routes: Option<Router>,
    /// Cancelled at the first signal, for the process's own jobs.
    pub on_signal: CancellationToken,
    /// Cancelled by the process when it must exit at once: the worker is stopped by force.
    pub exit: CancellationToken,
    /// More counters for the summary line logged at the end of the run, each a metric name
    /// and what one and several count (e.g. `("kcl_multilang_children_failed_total", "child
    /// exited non-zero", "children exited non-zero")`), after the records processed and the
    /// leases handed back or over.
    pub summary: Vec<(&'static str, &'static str, &'static str)>,
    /// The process's own problems, listed in `/status` with the worker's (never in
    /// readiness; see [`problems`](crate::problems)).
    pub problems: Option<crate::AppProblems>,
}

/// How a run ended.
#[derive(Debug)]
pub enum Ended {
    /// Shut down gracefully: processors checkpointed, leases handed back.
    Stopped,
    /// Forced by a second signal: leases not handed back move after the failover time.
    Forced,
    /// [`Options::exit`] was cancelled.
    Exited,
    /// The worker failed.
    Failed(kcl_core::Error),
}

impl Serving {
    /// One line of what this process did, from its own counters: records processed, leases
    /// handed back (at shutdown) or over (to another worker), and `more` (metric, what one
    /// counts, what several count).
    fn summary(metrics: &Metrics, more: &[(&'static str, &'static str, &'static str)]) -> String {
        let text = metrics.prometheus.render();
        let count = |metric: &str, one: &str, many: &str| {
            let n = total(&text, metric);
            format!("{n} {}", if n == 1 { one } else { many })
        };
        let mut parts = vec![
            count(
                kcl_core::metrics::RECORDS,
                "record processed",
                "records processed",
            ),
            count(
                kcl_core::metrics::LEASES_RELEASED,
                "lease handed back or over",
                "leases handed back or over",
            ),
        ];
        parts.extend(
            more.iter()
                .map(|(metric, one, many)| count(metric, one, many)),
        );
        parts.join(", ")
    }

    /// Raises the open file limit, installs the Prometheus recorder and binds `listen`, for a
    /// worker that will run with `config`.
    pub async fn start(listen: SocketAddr, config: &WorkerConfig) -> Result<Self, ServeError> {
        Self::start_with(listen, config, None).await
    }

    /// As [`start`](Self::start), pushing the metrics over OTLP as well with `otlp`.
    pub async fn start_with(
        listen: SocketAddr,
        config: &WorkerConfig,
        otlp: Option<&OtlpSettings>,
    ) -> Result<Self, ServeError> {
        server::raise_open_file_limit();
        // kcl-core refreshes its series every taker interval while they mean something.
        let stale_after = (config.taker_interval * 10).max(Duration::from_secs(10));
        Ok(Self {
            metrics: install_metrics(stale_after, otlp)?,
            listener: server::bind(listen).await?,
            probes: Probes::for_worker(config),
            shutdown_timeout: config.shutdown_timeout,
            restart_grace: config.restart_grace.is_some(),
            drain_token: None,
            #[cfg(feature = "scaler")]
            scaler: None,
        })
    }

    /// Also serves KEDA's external scaler (gRPC, [`kcl_scaler`]) on `addr` while the worker
    /// runs, until its shutdown begins (so that KEDA reconnects to a worker that stays). The
    /// address is bound now.
    #[cfg(feature = "scaler")]
    pub async fn with_scaler(mut self, addr: SocketAddr) -> Result<Self, ServeError> {
        self.scaler = Some(kcl_scaler::bind(addr).await?);
        Ok(self)
    }

    /// Writes the drain token (`POST /drain`'s, see [`drain`]) to `path` instead of its
    /// default place ([`drain::token::default_path`] of the HTTP port), when the run starts.
    #[must_use]
    pub fn with_drain_token(mut self, path: PathBuf) -> Self {
        self.drain_token = Some(path);
        self
    }

    /// Where the drain token is written when the run starts.
    pub fn drain_token_path(&self) -> PathBuf {
        self.drain_token.clone().unwrap_or_else(|| {
            let port = self.http_addr().map_or(0, |a| a.port());
            drain::token::default_path(port)
        })
    }

    /// The address the HTTP server listens on (its port, when bound to port 0).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// The address the scaler listens on, if it is served.
    pub fn scaler_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "scaler")]
        if let Some(listener) = &self.scaler {
            return listener.local_addr().ok();
        }
        None
    }

    /// Runs `worker` (whose id is `worker_id`) to its end, serving its probes and metrics.
    pub async fn run<S, L, F>(
        self,
        worker: Worker<S, L, F>,
        worker_id: String,
        options: Options,
    ) -> Ended
    where
        S: ShardSource,
        L: LeaseStore,
        F: ProcessorFactory,
    {
        let handle = worker.shutdown_handle();
        let token = self.drain_token();
        let mut routes = router_with(
            worker_id,
            worker.status(),
            self.metrics.prometheus.clone(),
            self.probes,
            options.problems.clone(),
        )
        .merge(drain::routes(drain::Setup {
            handle: handle.clone(),
            status: worker.status(),
            also: options.on_signal.clone(),
            token: token.clone(),
            restart_grace: self.restart_grace,
        }));
        if let Some(extra) = options.routes {
            routes = routes.merge(extra);
        }
        let stop_http = CancellationToken::new();
        let http = tokio::spawn(server::serve(
            self.listener,
            routes,
            stop_http.clone().cancelled_owned(),
            server::Limits::default(),
        ));
        #[cfg(feature = "scaler")]
        let scaler = self.scaler.map(|listener| {
            // Stops when the worker's shutdown begins (the handle's token is cancelled then).
            tokio::spawn(kcl_scaler::serve(listener, worker.status(), handle.token()))
        });
        let forced = CancellationToken::new();
        let signals = tokio::spawn(on_signals(
            handle.clone(),
            forced.clone(),
            self.shutdown_timeout,
            options.on_signal.clone(),
        ));
        let ended = tokio::select! {
            result = worker.run() => match result {
                Ok(()) if forced.is_cancelled() => Ended::Forced,
                Ok(()) => Ended::Stopped,
                Err(error) => Ended::Failed(error),
            },
            () = options.exit.cancelled() => {
                handle.force();
                tokio::time::sleep(FORCE_GRACE).await;
                Ended::Exited
            }
            () = async { forced.cancelled().await; tokio::time::sleep(FORCE_GRACE).await } => {
                tracing::error!("forced shutdown did not finish in time; exiting");
                Ended::Forced
            }
        };
        signals.abort();
        options.on_signal.cancel();
        stop_http.cancel();
        #[cfg(feature = "scaler")]
        if let Some(scaler) = scaler {
            joined("the scaler", scaler).await;
        }
        joined("the HTTP server", http).await;
        if let Some(token) = token {
            token.remove();
        }
        said(&ended, &Self::summary(&self.metrics, &options.summary));
        self.metrics.last_push().await;
        ended
    }
}

impl Serving {
    /// Writes a fresh drain token; `None` (said in the log) when it cannot be written, and
    /// `POST /drain` then refuses every call.
    fn drain_token(&self) -> Option<drain::token::Token> {
        let path = self.drain_token_path();
        match drain::token::Token::write(&path) {
            Ok(token) => {
                tracing::debug!(path = %path.display(), "drain token written");
                Some(token)
            }
            Err(error) => {
                tracing::warn!(
                    path = %path.display(),
                    %error,
                    "cannot write the drain token: POST /drain refuses every call (a preStop \
                     `drain` needs a writable path: an emptyDir at /tmp, or --drain-token-file)"
                );
                None
            }
        }
    }
}

/// Waits a little for a server's task to end, saying if it failed.
async fn joined<E: std::fmt::Display>(what: &str, task: JoinHandle<Result<(), E>>) {
    match tokio::time::timeout(Duration::from_secs(2), task).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "{what} failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "{what}'s task failed"),
        Ok(Ok(Ok(()))) | Err(_) => {}
    }
}

/// The run's last line: how it ended, and what the process did.
fn said(ended: &Ended, summary: &str) {
    match ended {
        Ended::Stopped => tracing::info!("stopped: {summary}"),
        Ended::Forced => {
            tracing::warn!(
                "stopped by force: {summary}; leases not handed back move after the failover time"
            );
        }
        Ended::Exited | Ended::Failed(_) => tracing::info!("ended: {summary}"),
    }
}

/// The sum of a counter's samples (every label set) in a Prometheus exposition.
fn total(text: &str, metric: &str) -> u64 {
    let samples = text.lines().filter_map(|line| {
        let rest = line.strip_prefix(metric)?;
        let value = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once("} ")?.1,
            None => rest.strip_prefix(' ')?,
        };
        value.trim().parse::<f64>().ok()
    });
    // Counters are whole numbers well within f64's exact range.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let sum = samples.sum::<f64>().round() as u64;
    sum
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_counter_is_summed_over_its_label_sets() {
        let text = "# TYPE kcl_records_processed_total counter\n\
                    kcl_records_processed_total{shard=\"a\"} 3\n\
                    kcl_records_processed_total{shard=\"b\"} 4\n\
                    kcl_records_processed_total_other 100\n\
                    kcl_leases_released_total 2\n";
        assert_eq!(super::total(text, "kcl_records_processed_total"), 7);
        assert_eq!(super::total(text, "kcl_leases_released_total"), 2);
        assert_eq!(super::total(text, "kcl_missing_total"), 0);
    }
}
