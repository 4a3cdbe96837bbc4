//! The `ExternalScaler` service over a worker's [`Status`] watch.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use kcl_core::{FleetSignals, Status};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response};

use crate::limits::{Conn, InFlight, Limits};
use crate::metric::{Metric, MetricError};
use crate::proto::external_scaler_server::ExternalScaler;
use crate::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, ScaledObjectRef,
};

/// A gRPC answer or its error status.
type Answer<T> = Result<Response<T>, tonic::Status>;

/// KEDA's external scaler answering from a worker's [`Status::fleet`] (see the crate docs).
#[derive(Debug, Clone)]
pub struct Scaler {
    status: watch::Receiver<Status>,
    stop: CancellationToken,
    /// A permit for each `StreamIsActive` stream open.
    streams: Arc<Semaphore>,
    max_streams: usize,
    /// The streams open by each host: at most a quarter of `max_streams` each, so that one
    /// host cannot keep KEDA's out (loopback peers are not told apart).
    by_host: HostStreams,
    stream_lifetime: Duration,
}

impl Scaler {
    /// A scaler following `status` (the worker's
    /// [`status`](kcl_core::Worker::status)); its streams end when `stop` is cancelled, and
    /// are bounded as [`Limits::default`] says.
    pub fn new(status: watch::Receiver<Status>, stop: CancellationToken) -> Self {
        Self::with_limits(status, stop, &Limits::default())
    }

    /// As [`new`](Self::new), with at most `limits.max_streams` `StreamIsActive` streams open
    /// at once (RESOURCE_EXHAUSTED beyond), each ending after `limits.stream_lifetime`.
    pub fn with_limits(
        status: watch::Receiver<Status>,
        stop: CancellationToken,
        limits: &Limits,
    ) -> Self {
        let max_streams = limits.max_streams.min(Semaphore::MAX_PERMITS);
        Self {
            status,
            stop,
            streams: Arc::new(Semaphore::new(max_streams)),
            max_streams,
            by_host: HostStreams {
                open: Arc::default(),
                max: (max_streams / 4).max(1),
            },
            stream_lifetime: limits.stream_lifetime,
        }
    }

    /// The fleet's figures now, or UNAVAILABLE while there are none.
    fn fleet(&self) -> Result<FleetSignals, tonic::Status> {
        self.status.borrow().fleet.clone().ok_or_else(|| {
            tonic::Status::unavailable(
                "no fleet figures: no leader known, nothing published yet, or what was \
                 published stopped changing (older than signals_max_age: the leader stopped \
                 publishing); every worker needs autoscaling publish-interval",
            )
        })
    }
}

/// Whether KEDA should count the fleet active: records arrive, or a backlog waits.
fn active(fleet: &FleetSignals) -> bool {
    fleet.arrival_rate > 0.0 || fleet.backlog_records > 0
}

/// Marks the call in flight on its connection (so that the connection is not closed to make
/// room while it runs); UNAVAILABLE if the connection is closing. A request that came through
/// no connection of [`serve`](crate::serve) (a test's) has nothing to mark.
fn in_flight<T>(request: &Request<T>) -> Result<Option<InFlight>, tonic::Status> {
    match request.extensions().get::<Conn>() {
        None => Ok(None),
        Some(conn) => conn.begin().map(Some).ok_or_else(|| {
            tonic::Status::unavailable("the connection is closing to make room: connect again")
        }),
    }
}

/// What a `StreamIsActive` stream holds while it is open.
struct Watching {
    status: watch::Receiver<Status>,
    stop: CancellationToken,
    /// The answer last sent.
    sent: Option<bool>,
    /// When the stream ends ([`Limits::stream_lifetime`]).
    end: Instant,
    /// Its place among the streams and its host's, and its call in flight on its connection.
    _held: (OwnedSemaphorePermit, HostStream, Option<InFlight>),
}

type HostKey = Option<std::net::IpAddr>;

/// The `StreamIsActive` streams open by each host.
#[derive(Debug, Clone)]
struct HostStreams {
    open: Arc<std::sync::Mutex<std::collections::HashMap<HostKey, usize>>>,
    max: usize,
}

impl HostStreams {
    /// A place for one more stream of `host`, unless it holds the most a host may. A peer
    /// on loopback (a sidecar proxy carries many hosts' calls) or unknown is not counted by
    /// host, only among all the streams.
    fn admit(&self, host: HostKey) -> Result<HostStream, tonic::Status> {
        let host = host.filter(|h| !h.is_loopback());
        if host.is_none() {
            return Ok(HostStream {
                streams: self.clone(),
                host,
            });
        }
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(host).or_default();
        if *n >= self.max {
            return Err(tonic::Status::resource_exhausted(format!(
                "this host has {n} StreamIsActive streams open, the most one host may: poll \
                 IsActive, or open the stream again later"
            )));
        }
        *n += 1;
        Ok(HostStream {
            streams: self.clone(),
            host,
        })
    }
}

/// One stream's place among its host's; given back when dropped.
#[derive(Debug)]
struct HostStream {
    streams: HostStreams,
    host: HostKey,
}

impl Drop for HostStream {
    fn drop(&mut self) {
        let mut open =
            (self.streams.open.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.host);
            }
        }
    }
}

/// The stream's next answer: the current one when it differs from the last sent; `None` (the
/// stream ends) when the server stops, the worker is gone or the stream's lifetime is over.
async fn next_answer(
    mut w: Watching,
) -> Option<(Result<IsActiveResponse, tonic::Status>, Watching)> {
    loop {
        if w.stop.is_cancelled() {
            return None;
        }
        let now = w.status.borrow_and_update().fleet.as_ref().map(active);
        if let Some(now) = now
            && w.sent != Some(now)
        {
            w.sent = Some(now);
            return Some((Ok(IsActiveResponse { result: now }), w));
        }
        tokio::select! {
            changed = w.status.changed() => changed.ok()?,
            () = w.stop.cancelled() => return None,
            () = tokio::time::sleep_until(w.end) => return None,
        }
    }
}

fn metric(object: Option<&ScaledObjectRef>) -> Result<Metric, tonic::Status> {
    let metadata = object.map(|o| &o.scaler_metadata);
    match metadata {
        Some(metadata) => Metric::from_metadata(metadata),
        None => Metric::from_metadata(&Default::default()),
    }
    .map_err(|e: MetricError| tonic::Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(&self, request: Request<ScaledObjectRef>) -> Answer<IsActiveResponse> {
        let _call = in_flight(&request)?;
        let result = active(&self.fleet()?);
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = BoxStream<'static, Result<IsActiveResponse, tonic::Status>>;

    /// The current answer once figures are known, then each change, until the server stops,
    /// the worker is gone or the stream's lifetime is over. RESOURCE_EXHAUSTED when the most
    /// streams the scaler serves are open.
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Answer<Self::StreamIsActiveStream> {
        let call = in_flight(&request)?;
        let host = request
            .extensions()
            .get::<Conn>()
            .and_then(|c| c.peer)
            .map(|p| p.ip());
        let host = self.by_host.admit(host)?;
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            tonic::Status::resource_exhausted(format!(
                "{} StreamIsActive streams are open, the most this scaler serves: poll IsActive, \
                 or open the stream again later",
                self.max_streams
            ))
        })?;
        let watching = Watching {
            status: self.status.clone(),
            stop: self.stop.clone(),
            sent: None,
            end: Instant::now() + self.stream_lifetime,
            _held: (permit, host, call),
        };
        Ok(Response::new(Box::pin(stream::unfold(
            watching,
            next_answer,
        ))))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Answer<GetMetricSpecResponse> {
        let _call = in_flight(&request)?;
        let metric = metric(Some(request.get_ref()))?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![metric.spec()],
        }))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Answer<GetMetricsResponse> {
        let _call = in_flight(&request)?;
        let request = request.into_inner();
        let metric = metric(request.scaled_object_ref.as_ref())?;
        // KEDA asks by the name the spec gave (without its `s0-` prefix).
        if !request.metric_name.is_empty() && request.metric_name != metric.name() {
            return Err(tonic::Status::not_found(format!(
                "no metric {:?}: this ScaledObject's metric is {}",
                request.metric_name,
                metric.name()
            )));
        }
        let fleet = self.fleet()?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![metric.metric_value(&fleet)],
        }))
    }

    type StreamMetricSpecStream = BoxStream<'static, Result<GetMetricSpecResponse, tonic::Status>>;

    /// UNIMPLEMENTED: the spec never changes, and KEDA then falls back to `GetMetricSpec`.
    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Answer<Self::StreamMetricSpecStream> {
        Err(tonic::Status::unimplemented(
            "the metric spec never changes: GetMetricSpec answers it",
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;
