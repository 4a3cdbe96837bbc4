//! Writing records to a stream: what the demo, the tests and the benchmarks share. A kcl
//! worker only reads; an application's own producer writes as it sees fit (the KPL, or
//! PutRecords with its own batching).

use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use backon::{BackoffBuilder, ExponentialBuilder};
use kcl_core::{BackendError, ErrorKind};

use crate::error::backend_error;

/// Entries per PutRecords call: the service's maximum.
const BATCH: usize = 500;

/// Writes `records` (partition key, data) to `stream` with PutRecords, 500 a call, one
/// call after the other. Entries the service fails (a shard's write limit) are sent again
/// with backoff, ten times at most; then the call fails as throttled, naming how many were
/// left. Records of one partition key keep their order only if none of them is retried:
/// PutRecords itself promises no order within a call.
pub async fn put_records<K, D>(
    client: &Client,
    stream: &str,
    records: &[(K, D)],
) -> Result<(), BackendError>
where
    K: AsRef<str>,
    D: AsRef<[u8]>,
{
    for chunk in records.chunks(BATCH) {
        let mut pending: Vec<&(K, D)> = chunk.iter().collect();
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(10)
            .with_jitter()
            .build();
        loop {
            pending = put_once(client, stream, pending).await?;
            if pending.is_empty() {
                break;
            }
            let Some(delay) = delays.next() else {
                let message = format!(
                    "{stream}: {} records still failed after retries",
                    pending.len()
                );
                return Err(BackendError::new(
                    ErrorKind::Throttled,
                    "put_records",
                    message,
                ));
            };
            tokio::time::sleep(delay).await;
        }
    }
    Ok(())
}

/// One PutRecords call; returns the entries the service failed.
async fn put_once<'a, K, D>(
    client: &Client,
    stream: &str,
    pending: Vec<&'a (K, D)>,
) -> Result<Vec<&'a (K, D)>, BackendError>
where
    K: AsRef<str>,
    D: AsRef<[u8]>,
{
    let entries = pending.iter().map(|(key, data)| {
        PutRecordsRequestEntry::builder()
            .partition_key(key.as_ref())
            .data(Blob::new(data.as_ref()))
            .build()
            .map_err(|e| BackendError::new(ErrorKind::Fatal, "put_records", e.to_string()))
    });
    let entries = entries.collect::<Result<Vec<_>, _>>()?;
    let out = client
        .put_records()
        .stream_name(stream)
        .set_records(Some(entries))
        .send()
        .await
        .map_err(|e| backend_error("put_records", stream, e))?;
    let failed = pending.into_iter().zip(out.records());
    Ok(failed
        .filter(|(_, result)| result.error_code().is_some())
        .map(|(entry, _)| entry)
        .collect())
}
