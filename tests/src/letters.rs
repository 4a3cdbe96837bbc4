//! Dead letters for the tests of kcl-aws's sinks and readers and of `kcl-admin dead-letters`:
//! letters with every field set, and SQS queues and S3 buckets of their own on the emulator.

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use chrono::{DateTime, TimeZone as _, Utc};
use kcl_core::failure::{DeadLetter, Reason};
use kcl_core::{ExtendedSequenceNumber, Record, SequenceNumber, ShardId, WorkerId};

use crate::{Context, unique};

/// A time with nanoseconds, `seconds` after 2023-11-14T22:13:20Z.
fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + seconds, 123_456_789)
        .single()
        .unwrap_or_default()
}

/// A letter of `stream`'s shard `shard`, at sequence number `sequence` (sub-sequence 2),
/// with `key` and `data`, and every other field set (parked behind an earlier record, an
/// explicit hash key, errors with quotes and non-ASCII text).
pub fn letter(stream: &str, shard: &str, sequence: u128, key: &str, data: Vec<u8>) -> DeadLetter {
    let record = Record::new(SequenceNumber::from(sequence), key, data)
        .with_sub_sequence_number(2)
        .with_approximate_arrival(at(0))
        .with_explicit_hash_key("170141183460469231731687303715884105728");
    let behind = ExtendedSequenceNumber {
        sequence: SequenceNumber::from(sequence.saturating_sub(1)),
        sub_sequence: 0,
    };
    let mut letter = DeadLetter::new(
        WorkerId::new("worker-a"),
        ShardId::new(shard),
        record,
        Reason::Parked { behind },
    );
    letter.application = Some("orders-app".into());
    letter.stream = Some(stream.into());
    letter.attempts = 3;
    letter.first_error = "timeout after \"5 s\"".into();
    letter.last_error = "refusé: ✓ invalid total".into();
    letter.first_failed = at(5);
    letter.dead_lettered = at(9);
    letter.parked_key = Some(key.into());
    letter
}

/// A new SQS queue (FIFO if `fifo`); its URL.
pub async fn queue(ctx: &Context, fifo: bool) -> anyhow::Result<String> {
    let sqs = ctx.sqs_client().await;
    let name = unique("dlq");
    let request = if fifo {
        sqs.create_queue()
            .queue_name(format!("{name}.fifo"))
            .attributes(QueueAttributeName::FifoQueue, "true")
    } else {
        sqs.create_queue().queue_name(name)
    };
    let out = request.send().await.context("CreateQueue")?;
    out.queue_url.context("CreateQueue gave no URL")
}

/// A new S3 bucket; its name.
pub async fn bucket(ctx: &Context) -> anyhow::Result<String> {
    let name = unique("dl").to_ascii_lowercase();
    ctx.s3_client()
        .await
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .context("CreateBucket")?;
    Ok(name)
}

/// The keys of `bucket` under `prefix`.
pub async fn keys(ctx: &Context, bucket: &str, prefix: &str) -> anyhow::Result<Vec<String>> {
    let out = ctx
        .s3_client()
        .await
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .context("ListObjectsV2")?;
    Ok(out
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect())
}
