//! The `ExternalScaler` service over a worker's [`Status`] watch.

use futures_util::stream::{self, BoxStream};
use kcl_core::{FleetSignals, Status};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response};

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
}

impl Scaler {
    /// A scaler following `status` (the worker's
    /// [`status`](kcl_core::Worker::status)); its streams end when `stop` is cancelled.
    pub fn new(status: watch::Receiver<Status>, stop: CancellationToken) -> Self {
        Self { status, stop }
    }

    /// The fleet's figures now, or UNAVAILABLE while there are none.
    fn fleet(&self) -> Result<FleetSignals, tonic::Status> {
        self.status.borrow().fleet.clone().ok_or_else(|| {
            tonic::Status::unavailable(
                "no fleet figures yet: no leader known, or nothing published yet \
                 (every worker needs autoscaling publish-interval)",
            )
        })
    }
}

/// Whether KEDA should count the fleet active: records arrive, or a backlog waits.
fn active(fleet: &FleetSignals) -> bool {
    fleet.arrival_rate > 0.0 || fleet.backlog_records > 0
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
    async fn is_active(&self, _request: Request<ScaledObjectRef>) -> Answer<IsActiveResponse> {
        let result = active(&self.fleet()?);
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = BoxStream<'static, Result<IsActiveResponse, tonic::Status>>;

    /// The current answer once figures are known, then each change, until the server stops
    /// or the worker is gone.
    async fn stream_is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Answer<Self::StreamIsActiveStream> {
        let stop = self.stop.clone();
        let changes = stream::unfold(
            (self.status.clone(), None::<bool>),
            move |(mut status, sent)| {
                let stop = stop.clone();
                async move {
                    loop {
                        if stop.is_cancelled() {
                            return None;
                        }
                        let now = status.borrow_and_update().fleet.as_ref().map(active);
                        if let Some(now) = now
                            && sent != Some(now)
                        {
                            let answer = Ok(IsActiveResponse { result: now });
                            return Some((answer, (status, Some(now))));
                        }
                        tokio::select! {
                            changed = status.changed() => changed.ok()?,
                            () = stop.cancelled() => return None,
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(changes)))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Answer<GetMetricSpecResponse> {
        let metric = metric(Some(request.get_ref()))?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![metric.spec()],
        }))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Answer<GetMetricsResponse> {
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
