//! The backends `run` consumes through: Kinesis and DynamoDB via kcl-aws (feature `aws`), the
//! leases in Postgres via kcl-postgres (`--lease-store postgres://…`, feature `postgres`), or
//! in-process ones to try the binary without AWS.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use kcl_core::failure::DeadLetters;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::multi_stream::{MultiStreamSource, StreamId, Streams};

#[cfg(feature = "aws")]
use crate::settings::Leases;
use crate::settings::{Backend, Settings, SourceSpec};

/// Consumes the stream of `settings` until shut down.
pub(crate) async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    match settings.backend {
        Backend::Aws => Box::pin(aws(settings)).await,
        Backend::Memory => memory(settings).await,
    }
}

/// Kinesis (or a DynamoDB table's stream), and the leases in DynamoDB or Postgres.
#[cfg(feature = "aws")]
async fn aws(settings: Settings) -> anyhow::Result<ExitCode> {
    // The standard chain: env, profile, web identity (IRSA), ECS task role, IMDS; endpoints
    // from AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_KINESIS, AWS_ENDPOINT_URL_DYNAMODB and
    // AWS_ENDPOINT_URL_DYNAMODB_STREAMS.
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let letters = letters(&settings, Some(&sdk));
    match &settings.lease_store {
        Leases::DynamoDb => {
            let store = kcl_aws::DynamoDbLeaseStore::new(&sdk, settings.application_name.clone())
                .with_table_setup(settings.table_setup);
            // The window table in DynamoDB, or in Postgres through a sink.
            let exactly_once = match (&settings.exactly_once_store, &settings.exactly_once_table) {
                #[cfg(feature = "postgres")]
                (Some(url), Some(table)) => {
                    Some(crate::postgres::table_in_sink(&settings, url, table, &store).await?)
                }
                _ => crate::exactly_once::setup(&settings, &store).await?,
            };
            consume(&settings, sdk, store, exactly_once, letters).await
        }
        #[cfg(feature = "postgres")]
        Leases::Postgres(url) => {
            let store = crate::postgres::lease_store(&settings, url).await?;
            let exactly_once = crate::postgres::table_in_leases(&settings, url, &store).await?;
            consume(&settings, sdk, store, exactly_once, letters).await
        }
        #[cfg(not(feature = "postgres"))]
        Leases::Postgres(_) => anyhow::bail!("this build has no Postgres lease store"),
    }
}

/// Consumes the configured streams with the leases in `store`, the windows also committed to
/// `exactly_once`'s table if there is one.
#[cfg(feature = "aws")]
async fn consume<L: kcl_core::LeaseStore + Clone>(
    settings: &Settings,
    sdk: aws_config::SdkConfig,
    store: L,
    exactly_once: Option<crate::exactly_once::ExactlyOnce>,
    letters: Option<DeadLetters>,
) -> anyhow::Result<ExitCode> {
    use kcl_aws::{AnySource, KinesisShardSource};
    let extras = crate::Extras {
        letters,
        served: exactly_once
            .as_ref()
            .map(crate::exactly_once::ExactlyOnce::served),
        #[cfg(feature = "postgres")]
        positions: exactly_once.as_ref().and_then(|e| e.positions.clone()),
    };
    let factory = crate::window_counters(settings, exactly_once.map(|e| e.table));
    match &settings.input {
        SourceSpec::Streams {
            names,
            removal_grace,
        } => {
            // A stream is known by account, name and creation time: look each one up, and
            // read it by what was given (an ARN reaches another account's stream).
            let mut given = BTreeMap::new();
            for name in names {
                let id = KinesisShardSource::new(&sdk, name.clone())
                    .stream_id()
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("invalid setting `streams`: cannot look up {name}: {e}")
                    })?;
                given.insert(id, name.clone());
            }
            let ids: Vec<StreamId> = given.keys().cloned().collect();
            let source = multi_stream(settings, ids, *removal_grace, move |id: &StreamId| {
                // A stream found only in the lease table is read by name until its grace ends.
                let name = given.get(id).cloned().unwrap_or_else(|| id.name.clone());
                KinesisShardSource::new(&sdk, name)
            });
            crate::run_worker(settings, source, store, factory, extras).await
        }
        SourceSpec::DynamoDbStreams {
            arns,
            removal_grace,
        } => {
            // Each stream looked up at start, so that a wrong ARN stops the worker; then read
            // by the adapter's multi-stream id, which leads back to its ARN.
            let mut ids = Vec::new();
            for arn in arns {
                let one = SourceSpec::DynamoDb {
                    table: None,
                    arn: Some(arn.clone()),
                };
                open(&sdk, &one).await?;
                ids.push(kcl_aws::streams::stream_id(arn).ok_or_else(|| {
                    anyhow::anyhow!("invalid setting `streams`: {arn} has no multi-stream id")
                })?);
            }
            let source = multi_stream(settings, ids, *removal_grace, move |id: &StreamId| {
                kcl_aws::DynamoDbStreamsSource::for_stream_id(&sdk, id)
            });
            crate::run_worker(settings, source, store, factory, extras).await
        }
        one @ (SourceSpec::Stream(_) | SourceSpec::DynamoDb { .. }) => {
            let source = open(&sdk, one).await?;
            if let AnySource::DynamoDb(stream) = &source {
                tracing::info!(
                    table = stream.table(),
                    stream = stream.arn(),
                    "reading a DynamoDB stream"
                );
            }
            crate::run_worker(settings, source, store, factory, extras).await
        }
    }
}

/// The one stream `spec` names, opened: a DynamoDB table's current stream, or the stream ARN
/// given (checked to be the table's). A refusal names the setting to fix.
#[cfg(feature = "aws")]
async fn open(
    sdk: &aws_config::SdkConfig,
    spec: &SourceSpec,
) -> anyhow::Result<kcl_aws::AnySource> {
    match spec.open_one(sdk).await {
        Ok(Some(source)) => Ok(source),
        Ok(None) => anyhow::bail!("{spec}: several streams, read in multi-stream mode"),
        Err(e) if e.kind().is_permanent() => {
            anyhow::bail!("invalid setting `{}`: {e}", spec.key().name())
        }
        Err(e) => anyhow::bail!("cannot look up the DynamoDB stream: {e}"),
    }
}

#[cfg(not(feature = "aws"))]
#[allow(clippy::unused_async, clippy::needless_pass_by_value)]
async fn aws(settings: Settings) -> anyhow::Result<ExitCode> {
    let _ = settings;
    anyhow::bail!(
        "this build has no AWS backends: build with `--features aws`, or try `--backend memory` or `demo`"
    )
}

/// Where the worker's dead letters go (`--dead-letters`): with `sdk`, any sink; without
/// (backend memory), a file only (the settings refuse the others).
#[cfg(feature = "aws")]
fn letters(settings: &Settings, sdk: Option<&aws_config::SdkConfig>) -> Option<DeadLetters> {
    use kcl_aws::dead_letter::{AnySink, FileSink, Location, SinkReader};
    let location: Location = settings.dead_letters.as_deref()?.parse().ok()?;
    // The reader replays a parked key's letters when `kcl-admin dead-letters redrive` asks
    // (every sink but a Kinesis stream).
    let (sink, reader) = match (&location, sdk) {
        (_, Some(sdk)) => (location.sink(sdk), location.reader(sdk)),
        (Location::File(path), None) => (
            AnySink::File(FileSink::new(path.clone())),
            Some(SinkReader::file(path.clone())),
        ),
        _ => return None,
    };
    let mut letters = DeadLetters::new(sink)
        .application(settings.application_name.clone())
        .stream(settings.input.to_string());
    if let Some(reader) = reader {
        letters = letters.reader(reader);
    }
    Some(letters)
}

/// No sinks in this build (the settings refuse `--dead-letters`).
#[cfg(not(feature = "aws"))]
fn letters(settings: &Settings, sdk: Option<&()>) -> Option<DeadLetters> {
    let _ = (settings, sdk);
    None
}

/// An in-process stream of 4 shards with a producer writing 20 records a second; or, with
/// `streams`, one of 2 shards per stream, the producer writing to each in turn.
async fn memory(settings: Settings) -> anyhow::Result<ExitCode> {
    let store = MemoryLeaseStore::new();
    tracing::warn!(
        "backend `memory`: consuming in-process streams fed by a built-in producer; nothing is persisted"
    );
    let factory = crate::window_counters(&settings, None);
    let worker_id = settings.worker_id.clone();
    let dead_letters = letters(&settings, None);
    let (producer, result) = match &settings.input {
        SourceSpec::Stream(_) => {
            let stream = MemoryStream::new(4);
            let producer = produce(vec![stream.clone()]);
            let source = stream.client(&worker_id);
            let extras = crate::Extras {
                letters: dead_letters,
                ..crate::Extras::default()
            };
            let result =
                crate::run_worker(&settings, source, store.client(&worker_id), factory, extras)
                    .await;
            (producer, result)
        }
        SourceSpec::Streams {
            names,
            removal_grace,
        } => {
            let by_id: BTreeMap<StreamId, MemoryStream> = names
                .iter()
                .map(|name| {
                    let id = StreamId::new(MEMORY_ACCOUNT, name.as_str(), 0);
                    (id, MemoryStream::new(2))
                })
                .collect();
            let producer = produce(by_id.values().cloned().collect());
            let ids: Vec<StreamId> = by_id.keys().cloned().collect();
            let reader = worker_id.clone();
            let source = multi_stream(&settings, ids, *removal_grace, move |id: &StreamId| {
                // Only tracked streams exist in this process's table.
                by_id
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| MemoryStream::new(1))
                    .client(&reader)
            });
            let extras = crate::Extras {
                letters: dead_letters,
                ..crate::Extras::default()
            };
            let result =
                crate::run_worker(&settings, source, store.client(&worker_id), factory, extras)
                    .await;
            (producer, result)
        }
        SourceSpec::DynamoDb { .. } | SourceSpec::DynamoDbStreams { .. } => {
            anyhow::bail!("invalid setting `source`: dynamodb-streams needs backend aws")
        }
    };
    producer.abort();
    result
}

/// A source over `ids`, each from the configured initial position, read through `make`.
fn multi_stream<S, M>(
    settings: &Settings,
    ids: Vec<StreamId>,
    removal_grace: Option<Duration>,
    make: M,
) -> MultiStreamSource<S, Streams, M>
where
    S: kcl_core::ShardSource,
    M: Fn(&StreamId) -> S + Send + Sync + 'static,
{
    let tracker = Streams::default();
    for id in ids {
        tracker.add(id, settings.worker.initial_position);
    }
    let source = MultiStreamSource::new(tracker, make);
    match removal_grace {
        Some(grace) => source.removal_grace(grace),
        None => source,
    }
}

/// The account of the in-memory streams' multi-stream ids.
const MEMORY_ACCOUNT: &str = "000000000000";

/// Puts a record every 50 ms, to each stream in turn.
fn produce(streams: Vec<MemoryStream>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for (i, stream) in (0u64..).zip(streams.iter().cycle()) {
            tick.tick().await;
            stream.put(&format!("user-{}", i % 16), format!("{{\"order\":{i}}}"));
        }
    })
}
