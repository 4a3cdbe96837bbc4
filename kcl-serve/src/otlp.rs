//! The metrics over OTLP as well as on `/metrics`: teams on ECS alarm on CloudWatch (KCL Java
//! publishes `MillisBehindLatest` there), and an AWS Distro for OpenTelemetry collector beside
//! the task turns OTLP into CloudWatch's embedded metric format (its `awsemf` exporter), with
//! no scraper to run. The recorder is `metrics-exporter-otel`'s, fanned out beside the
//! Prometheus one; the OpenTelemetry SDK pushes every `every` over OTLP/HTTP (protobuf).
//!
//! (The embedded-metric-format recorder for the `metrics` facade, `metrics_cloudwatch_embedded`,
//! cannot sit beside another recorder and keeps at most 100 histogram values per flush: it
//! is built for Lambda, not for a consumer recording a histogram per batch.)

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use crate::ServeError;

/// Where and how often the metrics are pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Otlp {
    /// The collector's metrics endpoint, e.g. `http://localhost:4318/v1/metrics`.
    pub endpoint: String,
    /// How often the metrics are pushed.
    pub every: Duration,
    /// `service.name` of the pushed metrics.
    pub service: String,
    /// `service.instance.id`: the worker id.
    pub instance: String,
}

/// The meter provider pushing to `otlp` (keep it: dropping it stops the pushes; shut it down
/// for a last push), and a recorder that feeds it.
pub(crate) fn recorder(
    otlp: &Otlp,
) -> Result<
    (
        SdkMeterProvider,
        metrics_exporter_otel::OpenTelemetryRecorder,
    ),
    ServeError,
> {
    let exporter = MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(otlp.endpoint.clone())
        .build()
        .map_err(|e| ServeError::Otlp(e.to_string()))?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(otlp.every)
        .build();
    let resource = Resource::builder()
        .with_service_name(otlp.service.clone())
        .with_attribute(KeyValue::new("service.instance.id", otlp.instance.clone()))
        .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    let recorder = metrics_exporter_otel::OpenTelemetryRecorder::new(provider.meter("kcl"));
    Ok((provider, recorder))
}
