//! The backends `run` consumes through: Kinesis and DynamoDB via kcl-aws (feature `aws`), or
//! in-process ones to try the binary without AWS.

use std::process::ExitCode;
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};

use crate::settings::{Backend, Settings};

/// Consumes the stream of `settings` until shut down.
pub(crate) async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    match settings.backend {
        Backend::Aws => aws(settings).await,
        Backend::Memory => memory(settings).await,
    }
}

/// Kinesis and DynamoDB. Assumed kcl-aws API: `KinesisShardSource::new(&SdkConfig, stream)`
/// (name or ARN) and `DynamoDbLeaseStore::new(&SdkConfig, table)`.
#[cfg(feature = "aws")]
async fn aws(settings: Settings) -> anyhow::Result<ExitCode> {
    // The standard chain: env, profile, web identity (IRSA), ECS task role, IMDS; endpoints
    // from AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_KINESIS, AWS_ENDPOINT_URL_DYNAMODB and
    // AWS_ENDPOINT_URL_DYNAMODB_STREAMS.
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let source = kcl_aws::KinesisShardSource::new(&sdk, settings.stream.clone());
    let leader = settings.worker.coordination == kcl_core::Coordination::Leader;
    let mut store = kcl_aws::DynamoDbLeaseStore::new(&sdk, settings.application_name.clone())
        .with_owner_index(leader);
    if leader {
        store = store.with_change_feed(&sdk);
    }
    let factory = crate::window_counters(&settings);
    crate::run_worker(&settings, source, store, factory).await
}

#[cfg(not(feature = "aws"))]
#[allow(clippy::unused_async, clippy::needless_pass_by_value)]
async fn aws(settings: Settings) -> anyhow::Result<ExitCode> {
    let _ = settings;
    anyhow::bail!(
        "this build has no AWS backends: build with `--features aws`, or try `--backend memory` or `demo`"
    )
}

/// An in-process stream of 4 shards with a producer writing 20 records a second.
async fn memory(settings: Settings) -> anyhow::Result<ExitCode> {
    let stream = MemoryStream::new(4);
    let store = MemoryLeaseStore::new();
    tracing::warn!(
        "backend `memory`: consuming an in-process stream fed by a built-in producer; nothing is persisted"
    );
    let producer = {
        let stream = stream.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            for i in 0u64.. {
                tick.tick().await;
                stream.put(&format!("user-{}", i % 16), format!("{{\"order\":{i}}}"));
            }
        })
    };
    let factory = crate::window_counters(&settings);
    let worker_id = settings.worker_id.clone();
    let result = crate::run_worker(
        &settings,
        stream.client(&worker_id),
        store.client(&worker_id),
        factory,
    )
    .await;
    producer.abort();
    result
}
