//! The service against a `watch` of `Status` values, as a worker publishes them.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use tonic::Code;

use super::*;
use crate::proto::GetMetricsRequest;

/// Figures with `arrival` records/s arriving, `backlog` records behind and `desired` workers.
fn fleet(arrival: f64, backlog: u64, desired: u32) -> FleetSignals {
    let line = format!("v1 3 8 0 {backlog} {arrival:.3} 0 0 0 {desired} {desired}");
    FleetSignals::decode(&line).unwrap()
}

fn with(fleet: Option<FleetSignals>) -> Status {
    let mut status = Status::default();
    status.fleet = fleet;
    status
}

fn object(pairs: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: "kcl".into(),
        namespace: "default".into(),
        scaler_metadata: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

fn scaler() -> (watch::Sender<Status>, Scaler, CancellationToken) {
    let (tx, rx) = watch::channel(Status::default());
    let stop = CancellationToken::new();
    (tx, Scaler::new(rx, stop.clone()), stop)
}

async fn active(s: &Scaler) -> Result<bool, Code> {
    let answer = s.is_active(Request::new(object(&[]))).await;
    answer.map(|r| r.into_inner().result).map_err(|e| e.code())
}

async fn value(s: &Scaler, name: &str, pairs: &[(&str, &str)]) -> Result<(String, i64, f64), Code> {
    let request = GetMetricsRequest {
        scaled_object_ref: Some(object(pairs)),
        metric_name: name.into(),
    };
    let answer = s
        .get_metrics(Request::new(request))
        .await
        .map_err(|e| e.code())?;
    let values = answer.into_inner().metric_values;
    assert_eq!(values.len(), 1, "{values:?}");
    let v = &values[0];
    Ok((v.metric_name.clone(), v.metric_value, v.metric_value_float))
}

#[tokio::test]
async fn no_figures_is_unavailable_never_a_zero() {
    let (_tx, s, _stop) = scaler();
    assert_eq!(active(&s).await, Err(Code::Unavailable));
    assert_eq!(
        value(&s, "desiredWorkers", &[]).await,
        Err(Code::Unavailable)
    );
    // The spec needs no figures: KEDA builds its HPA before the fleet has any.
    let spec = s.get_metric_spec(Request::new(object(&[]))).await.unwrap();
    let specs = spec.into_inner().metric_specs;
    assert_eq!(specs.len(), 1);
    assert_eq!(
        (
            specs[0].metric_name.as_str(),
            specs[0].target_size,
            specs[0].target_size_float
        ),
        ("desiredWorkers", 1, 1.0)
    );
}

#[tokio::test]
async fn answers_follow_the_fleet_figures() {
    let (tx, s, _stop) = scaler();
    tx.send_replace(with(Some(fleet(0.0, 5_000, 4))));
    assert_eq!(active(&s).await, Ok(true), "a backlog waits");
    assert_eq!(
        value(&s, "desiredWorkers", &[]).await,
        Ok(("desiredWorkers".into(), 4, 4.0))
    );
    tx.send_replace(with(Some(fleet(12.5, 0, 2))));
    assert_eq!(active(&s).await, Ok(true), "records arrive");
    assert_eq!(
        value(&s, "", &[]).await,
        Ok(("desiredWorkers".into(), 2, 2.0))
    );
    tx.send_replace(with(Some(fleet(0.0, 0, 1))));
    assert_eq!(
        active(&s).await,
        Ok(false),
        "nothing arrives, nothing waits"
    );
    assert_eq!(
        value(&s, "desiredWorkers", &[]).await,
        Ok(("desiredWorkers".into(), 1, 1.0))
    );
    // Figures gone again (a new leader, nothing published yet): unavailable again.
    tx.send_replace(with(None));
    assert_eq!(active(&s).await, Err(Code::Unavailable));
}

#[tokio::test]
async fn the_backlog_metric_is_chosen_by_metadata_and_bad_metadata_is_refused() {
    let (tx, s, _stop) = scaler();
    tx.send_replace(with(Some(fleet(10.0, 12_345, 3))));
    let backlog = [("metric", "backlogRecords"), ("targetPerWorker", "1000")];
    assert_eq!(
        value(&s, "backlogRecords", &backlog).await,
        Ok(("backlogRecords".into(), 12_345, 12_345.0))
    );
    let spec = s
        .get_metric_spec(Request::new(object(&backlog)))
        .await
        .unwrap();
    let spec = &spec.into_inner().metric_specs[0];
    assert_eq!(
        (spec.metric_name.as_str(), spec.target_size_float),
        ("backlogRecords", 1000.0)
    );
    assert_eq!(
        value(&s, "desiredWorkers", &backlog).await,
        Err(Code::NotFound)
    );
    assert_eq!(value(&s, "s0-backlog", &[]).await, Err(Code::NotFound));
    let bad = [("metric", "backlogRecords")];
    assert_eq!(
        value(&s, "backlogRecords", &bad).await,
        Err(Code::InvalidArgument)
    );
    let refused = s.get_metric_spec(Request::new(object(&bad))).await.err();
    let refused = refused.map(|e| (e.code(), e.message().to_owned()));
    assert!(
        refused
            .as_ref()
            .is_some_and(|(code, message)| *code == Code::InvalidArgument
                && message.contains("`targetPerWorker`")),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_stream_sends_the_current_answer_then_each_change_and_ends_on_stop() {
    let (tx, s, stop) = scaler();
    let answer = s.stream_is_active(Request::new(object(&[]))).await.unwrap();
    let mut stream = answer.into_inner();
    let next = async |stream: &mut ActiveStream| {
        let item = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
        item.map(|i| i.map(|r| r.map(|r| r.result).map_err(|e| e.code())))
    };
    assert!(
        next(&mut stream).await.is_err(),
        "nothing while no figures are known"
    );
    tx.send_replace(with(Some(fleet(0.0, 10, 2))));
    assert_eq!(next(&mut stream).await, Ok(Some(Ok(true))));
    tx.send_replace(with(Some(fleet(5.0, 0, 3))));
    assert!(
        next(&mut stream).await.is_err(),
        "still active: nothing sent"
    );
    tx.send_replace(with(Some(fleet(0.0, 0, 1))));
    assert_eq!(next(&mut stream).await, Ok(Some(Ok(false))));
    tx.send_replace(with(None));
    tx.send_replace(with(Some(fleet(0.0, 0, 1))));
    assert!(
        next(&mut stream).await.is_err(),
        "the same answer is not sent again"
    );
    tx.send_replace(with(Some(fleet(1.0, 0, 1))));
    assert_eq!(next(&mut stream).await, Ok(Some(Ok(true))));
    stop.cancel();
    assert_eq!(
        next(&mut stream).await,
        Ok(None),
        "the server stops: the stream ends"
    );

    // A new stream sends the current answer at once; the worker gone ends it.
    let answer = s.stream_is_active(Request::new(object(&[]))).await.unwrap();
    let mut stream = answer.into_inner();
    assert_eq!(next(&mut stream).await, Ok(None), "stopped before it began");
    let (tx, s, _stop) = scaler();
    tx.send_replace(with(Some(fleet(1.0, 0, 1))));
    let mut stream = s
        .stream_is_active(Request::new(object(&[])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next(&mut stream).await, Ok(Some(Ok(true))));
    drop(tx);
    assert_eq!(next(&mut stream).await, Ok(None));
}

/// The stream `stream_is_active` answers.
type ActiveStream = <Scaler as ExternalScaler>::StreamIsActiveStream;

#[tokio::test]
async fn the_metric_spec_is_not_streamed() {
    let (_tx, s, _stop) = scaler();
    let answer = s.stream_metric_spec(Request::new(object(&[]))).await;
    assert_eq!(answer.err().map(|e| e.code()), Some(Code::Unimplemented));
}

#[tokio::test(start_paused = true)]
async fn a_stream_ends_at_its_lifetime_and_another_begins_with_the_current_answer() {
    let (tx, s, _stop) = scaler();
    tx.send_replace(with(Some(fleet(1.0, 0, 1))));
    let open = |s: &Scaler| {
        let s = s.clone();
        async move {
            let answer = s.stream_is_active(Request::new(object(&[]))).await;
            answer.unwrap().into_inner()
        }
    };
    let mut stream = open(&s).await;
    let started = tokio::time::Instant::now();
    assert_eq!(
        stream.next().await.map(|r| r.map(|r| r.result).ok()),
        Some(Some(true))
    );
    // Nothing changes: the stream waits, then ends at its lifetime (KEDA opens another).
    let lifetime = crate::Limits::default().stream_lifetime;
    let end = tokio::time::timeout(lifetime * 2, stream.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "still open after {:?}",
        lifetime * 2
    );
    assert_eq!(started.elapsed(), lifetime);
    let mut again = open(&s).await;
    assert_eq!(
        again.next().await.map(|r| r.map(|r| r.result).ok()),
        Some(Some(true))
    );
}

#[tokio::test]
async fn a_stream_past_the_most_is_refused_with_resource_exhausted_until_one_ends() {
    let (_tx, rx) = watch::channel(Status::default());
    let limits = crate::Limits {
        max_streams: 2,
        ..crate::Limits::default()
    };
    let s = Scaler::with_limits(rx, CancellationToken::new(), &limits);
    let first = s.stream_is_active(Request::new(object(&[]))).await.unwrap();
    let _second = s.stream_is_active(Request::new(object(&[]))).await.unwrap();
    let third = s.stream_is_active(Request::new(object(&[]))).await;
    assert_eq!(third.err().map(|e| e.code()), Some(Code::ResourceExhausted));
    drop(first);
    assert!(s.stream_is_active(Request::new(object(&[]))).await.is_ok());
}

/// One host may hold a quarter of the streams: a host that opens more is refused, another
/// host still gets one; a stream given back makes room for its host again.
#[test]
fn one_host_holds_at_most_a_quarter_of_the_streams() {
    let streams = super::HostStreams {
        open: std::sync::Arc::default(),
        max: 8,
    };
    let flooder = Some(std::net::IpAddr::from([10, 0, 0, 2]));
    let keda = Some(std::net::IpAddr::from([10, 0, 0, 1]));
    let held: Vec<_> = (0..8).map(|_| streams.admit(flooder).unwrap()).collect();
    let refused = streams.admit(flooder).err().map(|e| e.code());
    assert_eq!(refused, Some(Code::ResourceExhausted));
    assert!(streams.admit(keda).is_ok(), "another host was refused");
    let loopback = Some(std::net::IpAddr::from([127, 0, 0, 1]));
    let local: Vec<_> = (0..20).map(|_| streams.admit(loopback).unwrap()).collect();
    drop((held, local));
    assert!(streams.admit(flooder).is_ok());
}
