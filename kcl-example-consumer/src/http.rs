//! Health and metrics over HTTP: `/healthz`, `/readyz`, `/metrics`, `/status`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kcl_core::{Phase, Status};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

/// Installs the global Prometheus recorder, describes kcl's metrics and keeps histograms
/// drained. Call once, inside the runtime.
pub(crate) fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])?
        .install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

fn describe() {
    use kcl_core::metrics as m;
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(m::RECORDS, "Records delivered to processors");
    describe_counter!(
        m::BYTES,
        Unit::Bytes,
        "Payload bytes delivered to processors"
    );
    describe_histogram!(
        m::BATCH_DURATION,
        Unit::Seconds,
        "Time spent processing one batch"
    );
    describe_histogram!(
        m::DELIVERY_DELAY,
        Unit::Seconds,
        "Delay from a batch's oldest record arriving in the stream to its delivery"
    );
    describe_gauge!(
        m::MILLIS_BEHIND_LATEST,
        Unit::Milliseconds,
        "How far behind the newest record of its shard the last batch was"
    );
    describe_gauge!(m::LEASES_HELD, "Leases held by this worker");
    describe_counter!(
        m::LEASES_TAKEN,
        "Leases taken (expired=true: from a worker that stopped renewing)"
    );
    describe_counter!(
        m::LEASES_STOLEN,
        "Handoffs requested from more loaded workers (lease steals)"
    );
    describe_counter!(
        m::LEASES_LOST,
        "Leases lost: taken by others or expired locally"
    );
    describe_counter!(m::CHECKPOINTS, "Checkpoint writes");
    describe_counter!(
        m::PROCESSOR_FAILURES,
        "Processor failures that restarted a shard"
    );
    describe_counter!(m::THROTTLED, "Throttled backend calls");
}

#[derive(Clone)]
struct AppState {
    worker_id: String,
    status: watch::Receiver<Status>,
    metrics: PrometheusHandle,
}

/// The router; `status` is the worker's [`status`](kcl_core::Worker::status) watch.
pub(crate) fn router(
    worker_id: String,
    status: watch::Receiver<Status>,
    metrics: PrometheusHandle,
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
        })
}

/// Binds the listen address first, so that a bad `listen` fails before the worker starts.
pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("invalid setting `listen`: cannot listen on {addr}: {e}"))
}

/// Serves `router` on a bound `listener` until `stop` resolves.
pub(crate) async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /healthz, /readyz, /metrics and /status");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await?;
    Ok(())
}

/// `healthcheck`: GET `path` on `listen` with a blocking socket; success on a 200.
#[allow(clippy::print_stderr)]
pub(crate) fn healthcheck(args: &crate::cli::HealthcheckArgs) -> std::process::ExitCode {
    use std::io::{Read, Write};
    let probe = || -> Result<u16, String> {
        let mut addr: SocketAddr = args
            .listen
            .trim()
            .parse()
            .map_err(|e| format!("invalid setting `listen`: {e}"))?;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let mut conn = std::net::TcpStream::connect_timeout(&addr, args.timeout)
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        conn.set_read_timeout(Some(args.timeout))
            .and_then(|()| conn.set_write_timeout(Some(args.timeout)))
            .map_err(|e| e.to_string())?;
        write!(
            conn,
            "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
            args.path
        )
        .map_err(|e| format!("cannot send the request: {e}"))?;
        let mut head = [0u8; 64];
        let n = conn
            .read(&mut head)
            .map_err(|e| format!("no answer: {e}"))?;
        String::from_utf8_lossy(&head[..n])
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| "not an HTTP answer".to_owned())
    };
    match probe() {
        Ok(200) => std::process::ExitCode::SUCCESS,
        Ok(code) => {
            eprintln!("{} answered {code}", args.path);
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("healthcheck failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
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

fn is_ready(status: &Status) -> bool {
    status.phase == Phase::Running && status.store_reachable
}

async fn readyz(State(state): State<AppState>) -> Response {
    let status = state.status.borrow().clone();
    let body = format!(
        "phase={} store_reachable={} leases={}\n",
        phase_name(status.phase),
        status.store_reachable,
        status.held.len()
    );
    let code = if is_ready(&status) {
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
        state.metrics.render(),
    )
        .into_response()
}

async fn status_json(State(state): State<AppState>) -> Response {
    let status = state.status.borrow().clone();
    axum::Json(serde_json::json!({
        "worker_id": state.worker_id,
        "phase": phase_name(status.phase),
        "ready": is_ready(&status),
        "store_reachable": status.store_reachable,
        "leases": status.held.iter().map(ToString::to_string).collect::<Vec<_>>(),
    }))
    .into_response()
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
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
    async fn readiness_follows_the_worker_status() {
        let (tx, rx) = watch::channel(Status::default());
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!(kcl_core::metrics::RECORDS, "shard" => "shardId-0").increment(3);
        });
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_on(
            listener,
            router("w-1".into(), rx, handle),
            stop.clone().cancelled_owned(),
        ));

        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("phase=starting"), "{body}");

        tx.send_modify(|s| {
            s.phase = Phase::Running;
            s.store_reachable = true;
        });
        assert_eq!(get(addr, "/readyz").await.0, 200);
        tx.send_modify(|s| s.store_reachable = false);
        assert_eq!(get(addr, "/readyz").await.0, 503, "lease table unreachable");

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
