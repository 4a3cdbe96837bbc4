//! # kcl-serve
//!
//! What a deployable process running a kcl worker serves and how it starts and stops: health
//! and metrics over HTTP (`/healthz`, `/readyz`, `/metrics`, `/status`), the logger, and
//! graceful shutdown on signals. Shared by `kcl-example-consumer` and `kcl-multilang`, and
//! meant for any binary built on kcl.
//!
//! - `/healthz` (liveness) fails when the worker's coordinator loop has not gone round for
//!   [`Probes::liveness`]: the loop itself is stuck, and only a restart helps.
//! - `/readyz` (readiness) fails while the worker is not running, cannot read its lease table,
//!   has not completed a taker cycle for [`Probes::readiness`], or holds a shard whose
//!   attempts keep failing ([`ProblemKind::Failing`]: a rollout of a processor that cannot
//!   work stops at its first pod); the body says which. Other problems (a shard stalled, a
//!   row kcl cannot read) are in its body as `problem="…"`, and leave it ready.
//! - `/status` lists every problem: the worker's, and the process's own
//!   ([`Options::problems`], see [`problems`]), which never touch readiness.
//! - `/metrics` drops counters and gauges not refreshed for 10 taker intervals (at least
//!   10 s): kcl-core refreshes every series it owns every taker interval, and a shard's only
//!   while this worker holds it, so the series of a shard that moved away disappear then.
//! - `POST /drain` (loopback peers carrying the drain token the process wrote at start: a
//!   pod's `preStop`) hands every lease over and stops the process, for a scale-in; see
//!   [`drain`].
//!
//! The server itself is in [`server`]: hardened against clients that never finish a request.

pub mod drain;
pub mod messenger;
#[cfg(feature = "otlp")]
mod otlp;
pub mod problems;
mod run;
pub mod server;
mod signals;
pub mod source;

pub use messenger::HttpMessenger;
#[cfg(feature = "otlp")]
pub use otlp::Otlp;
pub use problems::{AppProblem, AppProblems};
pub use run::{Ended, Options, Serving};
pub use server::ServeError;
pub use signals::{LogFormat, init_logging, on_signals};
pub use source::{SourceError, SourceKey, SourceKeys, SourceKind, SourceSpec};

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kcl_core::{Phase, ProblemKind, Status, WorkerConfig};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::sync::watch;
use tokio::time::Instant;

/// The worker id a deployed process uses unless told otherwise: `POD_NAME` (the Kubernetes
/// downward API), else `<HOSTNAME>-<pid>` (the host name from `/etc/hostname` when the
/// variable is unset). `env` looks up a variable: the binary passes
/// `|name| std::env::var(name).ok()`; this library reads no environment of its own.
pub fn default_worker_id(env: impl Fn(&str) -> Option<String>) -> String {
    if let Some(pod) = env("POD_NAME").filter(|p| !p.trim().is_empty()) {
        return pod.trim().to_owned();
    }
    let host = env("HOSTNAME")
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}-{}", std::process::id())
}

/// How old the worker's heartbeat and last cycle may be before a probe fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probes {
    /// `/healthz` fails when the coordinator loop has not gone round for this long:
    /// 10 taker cycles, at least 30 s (a loop that is merely busy beats every cycle).
    pub liveness: Duration,
    /// `/readyz` fails when no taker cycle completed for this long: 3 taker cycles plus the
    /// call timeout (one slow lease-table read must not flap readiness).
    pub readiness: Duration,
}

impl Probes {
    /// The probes' limits for a worker running with `config`.
    pub fn for_worker(config: &WorkerConfig) -> Self {
        Self {
            liveness: (config.taker_interval * 10).max(Duration::from_secs(30)),
            readiness: config.taker_interval * 3 + config.call_timeout,
        }
    }
}

/// Installs the global recorder, describes kcl's metrics and keeps histograms drained: the
/// Prometheus recorder behind `/metrics`, and with `otlp` (feature `otlp`) one pushing the
/// same metrics over OTLP beside it. Counters and gauges not refreshed for `stale_after` are
/// dropped from `/metrics` (see the module docs). Call once, inside the runtime.
pub fn install_metrics(
    stale_after: Duration,
    otlp: Option<&OtlpSettings>,
) -> Result<Metrics, ServeError> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])?
        .idle_timeout(
            MetricKindMask::COUNTER | MetricKindMask::GAUGE,
            Some(stale_after),
        )
        .build_recorder();
    let handle = prometheus.handle();
    #[cfg_attr(not(feature = "otlp"), allow(unused_mut))]
    let mut metrics = Metrics {
        prometheus: handle.clone(),
        #[cfg(feature = "otlp")]
        otlp: None,
    };
    let installed = match otlp {
        None => ::metrics::set_global_recorder(prometheus).is_ok(),
        #[cfg(feature = "otlp")]
        Some(settings) => {
            let (provider, recorder) = otlp::recorder(settings)?;
            metrics.otlp = Some(provider);
            let both = metrics_util::layers::FanoutBuilder::default()
                .add_recorder(prometheus)
                .add_recorder(recorder);
            ::metrics::set_global_recorder(both.build()).is_ok()
        }
        #[cfg(not(feature = "otlp"))]
        Some(never) => match *never {},
    };
    if !installed {
        return Err(ServeError::RecorderInstalled);
    }
    describe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
    Ok(metrics)
}

/// What [`install_metrics`] installed.
#[derive(Debug)]
pub struct Metrics {
    /// What `/metrics` renders.
    pub prometheus: PrometheusHandle,
    /// The OTLP pushes, with `otlp`.
    #[cfg(feature = "otlp")]
    otlp: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

impl Metrics {
    /// Pushes over OTLP one last time (at exit), if the metrics go there.
    pub async fn last_push(self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.otlp {
            let pushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(error)) = pushed {
                tracing::warn!(%error, "the last OTLP push failed");
            }
        }
    }
}

/// Where the metrics are pushed over OTLP: [`otlp::Otlp`] with feature `otlp`, nothing without.
#[cfg(feature = "otlp")]
pub type OtlpSettings = otlp::Otlp;
/// Where the metrics are pushed over OTLP: nothing without feature `otlp`.
#[cfg(not(feature = "otlp"))]
pub type OtlpSettings = std::convert::Infallible;

/// The process metrics (CPU seconds, resident memory, open file descriptors, threads, start
/// time) are this binary's to describe; kcl's own describe themselves when the worker starts
/// (`kcl_core::metrics::describe`).
fn describe() {
    process_collector().describe();
}

/// The process collector (`process_*` series, collected at each scrape).
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

#[derive(Clone)]
struct AppState {
    worker_id: String,
    status: watch::Receiver<Status>,
    metrics: PrometheusHandle,
    probes: Probes,
    /// The process's own problems, listed in `/status` after the worker's.
    extra: Option<AppProblems>,
}

/// The router; `status` is the worker's [`status`](kcl_core::Worker::status) watch.
pub fn router(
    worker_id: String,
    status: watch::Receiver<Status>,
    metrics: PrometheusHandle,
    probes: Probes,
) -> Router {
    router_with(worker_id, status, metrics, probes, None)
}

/// As [`router`], `/status` listing the process's own problems too.
pub fn router_with(
    worker_id: String,
    status: watch::Receiver<Status>,
    metrics: PrometheusHandle,
    probes: Probes,
    extra: Option<AppProblems>,
) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(prometheus))
        .route("/status", get(status_json))
        .with_state(AppState {
            worker_id,
            status,
            metrics,
            probes,
            extra,
        })
}

/// A probe for a container's `HEALTHCHECK`: GET `path` on `listen` (an unspecified address
/// means this host) with a blocking socket, within `timeout`; `Ok` on a 200, else what
/// happened.
pub fn healthcheck(listen: &str, path: &str, timeout: Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut addr: SocketAddr = listen
        .trim()
        .parse()
        .map_err(|e| format!("invalid setting `listen`: {e}"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let mut conn = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .and_then(|()| conn.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut head = [0u8; 64];
    let n = conn
        .read(&mut head)
        .map_err(|e| format!("no answer: {e}"))?;
    let code: u16 = String::from_utf8_lossy(&head[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    if code == 200 {
        Ok(())
    } else {
        Err(format!("{path} answered {code}"))
    }
}

/// How long ago `at` was, if it was.
fn age(at: Option<Instant>) -> Option<Duration> {
    at.map(|t| Instant::now().saturating_duration_since(t))
}

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

async fn healthz(State(state): State<AppState>) -> Response {
    let heartbeat = age(state.status.borrow().heartbeat);
    match heartbeat {
        Some(age) if age > state.probes.liveness => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "coordinator loop stuck: last heartbeat {} ago\n",
                seconds(age)
            ),
        )
            .into_response(),
        _ => "ok\n".into_response(),
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Starting => "starting",
        Phase::Running => "running",
        Phase::ShuttingDown => "shutting_down",
        Phase::Stopped => "stopped",
        _ => "unknown",
    }
}

/// Why the worker is not ready, if it is not.
fn not_ready(status: &Status, probes: Probes) -> Option<String> {
    if status.phase != Phase::Running {
        return Some(format!("phase is {}", phase_name(status.phase)));
    }
    if !status.store_reachable {
        return Some("the lease table cannot be read".to_owned());
    }
    let mut failing = status
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::Failing);
    if let Some(first) = failing.next() {
        let more = match failing.count() {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        return Some(format!(
            "shard {}{more} failing: its attempts or its checkpoint writes keep failing (see /status)",
            first.key
        ));
    }
    match age(status.last_cycle) {
        None => Some("no taker cycle completed yet".to_owned()),
        Some(age) if age > probes.readiness => Some(format!("last cycle {} ago", seconds(age))),
        Some(_) => None,
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    let status = state.status.borrow().clone();
    let why = not_ready(&status, state.probes);
    let body = format!(
        "phase={} store_reachable={} leases={}{}{}\n",
        phase_name(status.phase),
        status.store_reachable,
        status.held.len(),
        why.as_deref()
            .map(|w| format!(" not_ready=\"{w}\""))
            .unwrap_or_default(),
        status
            .problem
            .as_deref()
            .map(|p| format!(" problem={p:?}"))
            .unwrap_or_default()
    );
    let code = if why.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body).into_response()
}

async fn prometheus(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            process_collector().collect();
            state.metrics.render()
        },
    )
        .into_response()
}

async fn status_json(State(state): State<AppState>) -> Response {
    let status = state.status.borrow().clone();
    let extra = state
        .extra
        .as_ref()
        .map(AppProblems::list)
        .unwrap_or_default();
    axum::Json(serde_json::json!({
        "worker_id": state.worker_id,
        "phase": phase_name(status.phase),
        "ready": not_ready(&status, state.probes).is_none(),
        "store_reachable": status.store_reachable,
        "problem": status.problem,
        "problems": status.problems.iter().map(|p| serde_json::json!({
            "kind": p.kind.as_str(),
            "key": p.key,
            "detail": p.detail,
        })).chain(extra.iter().map(|p| serde_json::json!({
            "kind": p.kind,
            "key": p.key,
            "detail": p.detail,
        }))).collect::<Vec<_>>(),
        "leases": status.held.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "leader": status.leader.as_ref().map(ToString::to_string),
        "leading": status.leading,
        "draining": status.draining,
        "shards": status.shards.iter().map(|shard| serde_json::json!({
            "shard": shard.shard.to_string(),
            "owner": state.worker_id,
            "checkpoint": shard.checkpoint.as_ref().map(ToString::to_string),
            "millis_behind_latest": shard.millis_behind_latest,
            "last_progress_seconds_ago": shard.last_progress.map(|at| at.elapsed().as_secs()),
            "failures": {
                "retries": shard.failures.retries,
                "dead_lettered": shard.failures.dead_lettered,
                "skipped": shard.failures.skipped,
                "parked_keys": shard.failures.parked_keys,
                "sink_refusing": shard.failures.sink_refusing,
                "sink_refusals": shard.failures.sink_refusals,
                "outage": shard.failures.outage,
            },
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use kcl_core::Problem;

    use super::*;

    pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut response = String::new();
        conn.read_to_string(&mut response)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let code = response
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    #[tokio::test]
    async fn probes_follow_the_worker_status() {
        let (tx, rx) = watch::channel(Status::default());
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!(kcl_core::metrics::RECORDS, "shard" => "shardId-0").increment(3);
        });
        let listener = server::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let probes = Probes {
            liveness: Duration::from_secs(30),
            readiness: Duration::from_secs(10),
        };
        let server = tokio::spawn(server::serve(
            listener,
            router("w-1".into(), rx, handle, probes),
            stop.clone().cancelled_owned(),
            server::Limits::default(),
        ));

        assert_eq!(get(addr, "/healthz").await.0, 200, "starting: alive");
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("phase=starting"), "{body}");

        let ago = |secs| Instant::now().checked_sub(Duration::from_secs(secs));
        tx.send_modify(|s| {
            s.phase = Phase::Running;
            s.store_reachable = true;
            s.heartbeat = ago(1);
            s.last_cycle = ago(1);
        });
        assert_eq!(get(addr, "/readyz").await.0, 200);
        assert_eq!(get(addr, "/healthz").await.0, 200);
        // A shard stalled is said, not unready; a shard failing is unready.
        let stalled = Problem::new(ProblemKind::Stalled, "shardId-1", "waited");
        tx.send_modify(|s| {
            s.problems = vec![stalled.clone()];
            s.problem = Some("1 shard or row problem: stalled shardId-1".to_owned());
        });
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("problem=\"1 shard or row problem"), "{body}");
        let failing = Problem::new(ProblemKind::Failing, "shardId-2", "boom");
        tx.send_modify(|s| s.problems = vec![stalled, failing]);
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("shard shardId-2 failing"), "{body}");
        let (_, body) = get(addr, "/status").await;
        assert!(body.contains("\"ready\":false"), "{body}");
        tx.send_modify(|s| {
            s.problems.clear();
            s.problem = None;
        });
        assert_eq!(get(addr, "/readyz").await.0, 200);
        tx.send_modify(|s| s.store_reachable = false);
        assert_eq!(get(addr, "/readyz").await.0, 503, "lease table unreachable");
        tx.send_modify(|s| {
            s.store_reachable = true;
            s.last_cycle = ago(20);
        });
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("last cycle 20."), "{body}");
        tx.send_modify(|s| s.heartbeat = ago(60));
        let (code, body) = get(addr, "/healthz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("coordinator loop stuck"), "{body}");

        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains("kcl_records_processed_total{shard=\"shardId-0\"} 3"),
            "{body}"
        );
        let (code, body) = get(addr, "/status").await;
        assert_eq!(code, 200);
        assert!(body.contains("\"worker_id\":\"w-1\""), "{body}");

        stop.cancel();
        assert!(matches!(server.await, Ok(Ok(()))));
    }
}
