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
//!
//! The server runs inside the worker, which must keep renewing its leases whatever connects:
//! [`serve`] bounds connections, calls, streams and their time ([`Limits`]: at most 64
//! connections, the oldest idle one of the host holding the most closed to make room; 16 calls
//! on one, 32 `StreamIsActive` streams in all and a quarter of them from one host,
//! RESOURCE_EXHAUSTED beyond; a stream ends after 5 min, and
//! KEDA opens another). It listens where it is told: the binaries serve it on `--listen`'s host
//! (every address with their default `0.0.0.0`, as KEDA's operator connects from another
//! pod).

mod limits;
mod metric;
mod service;

pub use limits::Limits;
pub use metric::{Metric, MetricError};
pub use service::Scaler;

#[cfg(feature = "client")]
use std::time::Duration;

use kcl_core::Status;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::limits::{Admitted, Connections};

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
/// starts shutting down, so that KEDA reconnects to a worker that stays. Bounded as
/// [`Limits::default`] says.
pub async fn serve(
    listener: TcpListener,
    status: watch::Receiver<Status>,
    stop: CancellationToken,
) -> Result<(), ScalerError> {
    serve_with(listener, status, stop, Limits::default()).await
}

/// As [`serve`], within `limits`.
pub async fn serve_with(
    listener: TcpListener,
    status: watch::Receiver<Status>,
    stop: CancellationToken,
    limits: Limits,
) -> Result<(), ScalerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving KEDA's external scaler (gRPC)");
    }
    let scaler = Scaler::with_limits(status, stop.clone(), &limits);
    let connections = Connections::new(limits.max_connections);
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(limits.keepalive));
    let incoming = futures_util::StreamExt::filter_map(incoming, move |accepted| {
        let connections = connections.clone();
        async move { admit(accepted, &connections).await }
    });
    Server::builder()
        .timeout(limits.request_timeout)
        .concurrency_limit_per_connection(
            usize::try_from(limits.max_calls_per_connection).unwrap_or(usize::MAX),
        )
        .load_shed(true)
        .max_concurrent_streams(limits.max_calls_per_connection)
        .http2_keepalive_interval(Some(limits.keepalive))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_connection_age(limits.connection_age)
        .max_connection_age_grace(limits.connection_grace)
        .add_service(proto::external_scaler_server::ExternalScalerServer::new(
            scaler,
        ))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await
        .map_err(ScalerError::Serve)
}

/// An accepted connection given a place, or refused (dropped: closed) when every place has a
/// call in flight. A failed accept (out of file descriptors, a peer gone) waits a little.
async fn admit(
    accepted: std::io::Result<TcpStream>,
    connections: &Connections,
) -> Option<std::io::Result<Admitted>> {
    let stream = match accepted {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%error, "accepting a scaler connection failed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            return None;
        }
    };
    let peer = stream.peer_addr().ok();
    match connections.admit(peer) {
        Some(slot) => Some(Ok(Admitted::new(stream, slot))),
        None => {
            tracing::debug!(
                ?peer,
                "every scaler connection has a call in flight: refused"
            );
            None
        }
    }
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
        .timeout(Limits::default().request_timeout)
        .connect()
        .await?;
    Ok(proto::external_scaler_client::ExternalScalerClient::new(
        channel,
    ))
}
