//! # kcl-scaler
//!
//! KEDA's external scaler, served by a process running a kcl worker: the `ExternalScaler`
//! gRPC service of KEDA's `externalscaler.proto` (in `proto/`, unchanged), answering from the
//! worker's [`Status::fleet`](kcl_core::Status::fleet).
//!
//! KEDA's own Kinesis scaler counts shards (a target of 2 a replica), which says nothing of
//! whether the fleet keeps up. kcl's leader already follows the whole lease table and works
//! out how many workers the fleet needs to read its backlog in time
//! ([`FleetSignals::desired_workers`](kcl_core::FleetSignals::desired_workers), damped so that
//! it does not flap); with `Autoscaling::publish_interval` it writes them to one row that every
//! other worker reads. So any worker can answer: KEDA reaches whichever pod its Service picks.
//!
//! - `IsActive`: true while records arrive or a backlog waits.
//! - `StreamIsActive`: the current answer, then each change.
//! - `GetMetricSpec`: one metric. By default `desiredWorkers` with a target of 1 a replica, so
//!   that the HPA's replicas equal `desired_workers`; with `metric: backlogRecords` and
//!   `targetPerWorker: N` in the trigger's metadata, the fleet's backlog at N records a replica
//!   (see [`Metric`]).
//! - `GetMetrics`: that metric's value now.
//! - `StreamMetricSpec`: UNIMPLEMENTED. The spec never changes, and the proto says KEDA then
//!   falls back to `GetMetricSpec`.
//!
//! While no figures are known (no leader yet, nothing published yet, or publishing off on a
//! worker that is not the leader), `IsActive`, `GetMetrics` answer UNAVAILABLE, never a zero
//! made up; `StreamIsActive` sends nothing until they are known.

mod metric;
mod service;

pub use metric::{Metric, MetricError};
pub use service::Scaler;

use std::time::Duration;

use kcl_core::Status;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

/// The code generated from KEDA's `externalscaler.proto`: messages, the server and a client.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::semicolon_if_nothing_returned,
    clippy::needless_pass_by_value,
    clippy::cast_possible_truncation
)]
pub mod proto {
    tonic::include_proto!("externalscaler");
}

/// How long one call may take: every answer is read from memory, in microseconds.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle connection is pinged, so that one whose client is gone closes.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Why the scaler stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ScalerError {
    /// The address cannot be bound.
    #[error("invalid setting `scaler-port`: cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("the scaler's gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// Binds the scaler's address (first, so that a taken port fails before the worker starts).
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, ScalerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ScalerError::Bind { addr, source })
}

/// Serves the scaler on `listener`, answering from `status` (the worker's
/// [`status`](kcl_core::Worker::status)), until `stop` is cancelled: new connections are
/// refused, open streams end, and the calls in flight are answered. Stop it when the worker
/// starts shutting down, so that KEDA reconnects to a worker that stays.
pub async fn serve(
    listener: TcpListener,
    status: watch::Receiver<Status>,
    stop: CancellationToken,
) -> Result<(), ScalerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving KEDA's external scaler (gRPC)");
    }
    let scaler = Scaler::new(status, stop.clone());
    Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .add_service(proto::external_scaler_server::ExternalScalerServer::new(
            scaler,
        ))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop.cancelled_owned())
        .await
        .map_err(ScalerError::Serve)
}

/// A client of the scaler at `url` (`http://127.0.0.1:9091`), as KEDA talks to it.
#[cfg(feature = "client")]
pub async fn connect(
    url: String,
) -> Result<
    proto::external_scaler_client::ExternalScalerClient<tonic::transport::Channel>,
    tonic::transport::Error,
> {
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(REQUEST_TIMEOUT)
        .connect()
        .await?;
    Ok(proto::external_scaler_client::ExternalScalerClient::new(
        channel,
    ))
}
