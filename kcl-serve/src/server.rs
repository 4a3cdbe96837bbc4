//! The HTTP server of the probes and metrics, hardened so that no client can starve them.
//!
//! A liveness probe that times out gets a healthy worker killed, so the server must answer the
//! kubelet whatever else connects. `axum::serve` has neither a header-read timeout nor a
//! connection limit: a client that opens connections and never finishes its request headers
//! (slowloris) holds a task and a file descriptor each, until the process runs out of
//! descriptors and cannot accept the probe at all. Here:
//! - a request's headers must arrive within [`Limits::header_timeout`] (hyper's
//!   `header_read_timeout`, also the idle timeout of a kept-alive connection), and its answer
//!   within [`Limits::request_timeout`] (else 503);
//! - at most [`Limits::max_connections`] are open. When a new connection finds them all taken,
//!   the oldest one with no request in flight (a slow or idle client) is closed to make room,
//!   so a client that sends its request at once (a probe, a scrape) always gets in; only if
//!   every connection is busy answering is the new one refused. A request is in flight from
//!   the moment its headers are read until the last byte of its answer is written, and a
//!   connection is chosen for eviction and marked so under one lock, so a request that has
//!   begun is never cut off to make room.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// What the server allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once. 256: a probe endpoint needs a handful (the kubelet, a
    /// scraper, a person), and 256 stays far below even a 1,024 file-descriptor limit.
    pub max_connections: usize,
    /// Time to receive a request's headers (and the idle time of a kept-alive connection).
    /// 5 s: a probe or a scraper sends its headers in milliseconds.
    pub header_timeout: Duration,
    /// Time to answer a request. 10 s: rendering any of the endpoints takes milliseconds.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on a bound `listener` until `stop` resolves; see the module docs.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /healthz, /readyz, /metrics and /status");
    }
    let connections = Connections::new(limits.max_connections);
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, or the peer gave up: try again shortly.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = connections.admit() else {
            tracing::debug!(%peer, "every connection is busy: refused");
            continue;
        };
        let service = answer(router.clone(), slot.handle(), limits.request_timeout, peer);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                () = slot.evicted.cancelled() => tracing::debug!(%peer, "idle connection closed to make room"),
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(2), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("HTTP connections still open at shutdown: dropped");
    }
    Ok(())
}

/// The service of one connection: `router`, with a deadline, in flight (not evictable) from
/// the request's headers to the last byte of its answer. Each request carries its `peer` as
/// axum's `ConnectInfo<SocketAddr>` (`POST /drain` answers local peers only).
fn answer(
    router: Router,
    slot: SlotRef,
    limit: Duration,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<Response<Body>, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let router = router.clone();
        let in_flight = slot.begin();
        async move {
            let Some(in_flight) = in_flight else {
                // Chosen for eviction before this request arrived: the connection is closing.
                return Ok((StatusCode::SERVICE_UNAVAILABLE, "closing\n").into_response());
            };
            let response = match tokio::time::timeout(limit, router.oneshot(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out\n").into_response(),
            };
            Ok(in_flight_until_written(response, in_flight))
        }
    })
}

/// Moves the guard into the response body, which hyper drops once it has written all of it
/// (or the connection is gone).
fn in_flight_until_written(response: Response<Body>, in_flight: InFlight) -> Response<Body> {
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _in_flight = &in_flight;
            frame
        }))
    })
}

/// The open connections, oldest first.
#[derive(Debug, Clone)]
struct Connections {
    open: Arc<Mutex<BTreeMap<u64, Entry>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
    max: usize,
}

#[derive(Debug)]
struct Entry {
    busy: Arc<AtomicUsize>,
    evicted: CancellationToken,
}

/// A connection's place; gives it back when dropped.
struct Slot {
    id: u64,
    busy: Arc<AtomicUsize>,
    evicted: CancellationToken,
    connections: Connections,
}

/// What a connection's service needs of its slot: to mark requests in flight.
#[derive(Clone)]
struct SlotRef {
    busy: Arc<AtomicUsize>,
    evicted: CancellationToken,
    connections: Connections,
}

/// A request in flight; its connection cannot be evicted until every one is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SlotRef {
    /// Marks a request in flight, unless the connection was already chosen for eviction.
    /// Under the lock [`Connections::admit`] chooses under, so the two cannot interleave.
    fn begin(&self) -> Option<InFlight> {
        let _open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.evicted.is_cancelled() {
            return None;
        }
        self.busy.fetch_add(1, Ordering::SeqCst);
        Some(InFlight(self.busy.clone()))
    }
}

impl Connections {
    fn new(max: usize) -> Self {
        Self {
            open: Arc::default(),
            next: Arc::default(),
            max: max.max(1),
        }
    }

    /// A place for a new connection: free, or taken from the oldest idle one (which is told
    /// to close). `None` if every connection has a request in flight.
    fn admit(&self) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= self.max {
            let idle = open
                .iter()
                .find(|(_, e)| e.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id)?;
            if let Some(entry) = open.remove(&idle) {
                entry.evicted.cancel();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let slot = Slot {
            id,
            busy: Arc::default(),
            evicted: CancellationToken::new(),
            connections: self.clone(),
        };
        open.insert(
            id,
            Entry {
                busy: slot.busy.clone(),
                evicted: slot.evicted.clone(),
            },
        );
        Some(slot)
    }
}

impl Slot {
    fn handle(&self) -> SlotRef {
        SlotRef {
            busy: self.busy.clone(),
            evicted: self.evicted.clone(),
            connections: self.connections.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Raises this process's soft limit of open files to its hard limit, so that a burst of
/// connections runs into the server's own limit long before the kernel's.
pub fn raise_open_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open file limit"),
        Err(error) => tracing::debug!(%error, "cannot raise the open file limit"),
    }
}

/// Binds the listen address first, so that a bad `listen` fails before the worker starts.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address cannot be bound.
    #[error("invalid setting `listen`: cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The Prometheus recorder could not be built.
    #[error("cannot build the metrics recorder")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// A global metrics recorder is installed already.
    #[error("cannot install the metrics recorder: one is installed already")]
    RecorderInstalled,
    /// The OTLP exporter could not be built (feature `otlp`).
    #[error("invalid setting `otlp_endpoint`: {0}")]
    Otlp(String),
    /// The scaler's address cannot be bound (feature `scaler`).
    #[cfg(feature = "scaler")]
    #[error(transparent)]
    Scaler(#[from] kcl_scaler::ScalerError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_server_makes_room_by_closing_the_oldest_idle_connection_only() {
        let c = Connections::new(2);
        let first = c.admit().unwrap_or_else(|| unreachable!());
        let second = c.admit().unwrap_or_else(|| unreachable!());
        let answering = first.handle().begin(); // the oldest is answering a request
        assert!(answering.is_some());
        let third = c
            .admit()
            .unwrap_or_else(|| unreachable!("the idle one makes room"));
        assert!(second.evicted.is_cancelled() && !first.evicted.is_cancelled());
        assert!(
            second.handle().begin().is_none(),
            "a request arriving on an evicted connection does not begin"
        );
        let _third_answering = third.handle().begin();
        assert!(c.admit().is_none(), "every connection busy: refused");
        drop(answering); // the first's answer is written
        assert!(c.admit().is_some(), "an idle connection makes room again");
        assert!(first.evicted.is_cancelled());
        drop((first, second));
    }

    #[test]
    fn a_closed_connection_gives_its_place_back() {
        let c = Connections::new(1);
        let only = c.admit().unwrap_or_else(|| unreachable!());
        let _answering = only.handle().begin();
        assert!(c.admit().is_none());
        drop(only);
        assert!(c.admit().is_some());
    }

    #[tokio::test]
    async fn a_request_stays_in_flight_until_its_answer_is_written() {
        let c = Connections::new(1);
        let slot = c.admit().unwrap_or_else(|| unreachable!());
        let in_flight = slot.handle().begin().unwrap_or_else(|| unreachable!());
        let response = in_flight_until_written(Response::new(Body::from("answer")), in_flight);
        assert!(c.admit().is_none(), "the answer is not written yet");
        let written = response.into_body().collect().await;
        assert_eq!(
            written.map(|b| b.to_bytes()).ok().as_deref(),
            Some(&b"answer"[..])
        );
        assert!(c.admit().is_some(), "written: the connection is idle again");
    }
}
