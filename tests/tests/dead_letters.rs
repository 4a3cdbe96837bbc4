//! kcl-aws's dead-letter sinks and readers against the emulators (moto's SQS and S3,
//! kinesis-mock), through the real SDK clients: each sink's letter reads back whole (payload
//! bytes and every field), an SQS letter over the message limit goes to S3 behind a pointer
//! and reads back whole, a FIFO queue keeps a letter put twice once, and a letter too large
//! for a Kinesis record is refused without an overflow and goes to S3 with one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use kcl_aws::dead_letter::{
    AnySink, KinesisSink, LetterId, LetterStore, Location, S3Sink, SqsSink,
};
use kcl_core::ErrorKind;
use kcl_core::failure::{DeadLetter, DeadLetterSink as _};
use kcl_integration_tests::letters::{bucket, keys, letter, queue};
use kcl_integration_tests::{Context, with_timeout};

const SHARD: &str = "shardId-000000000003";

/// Bytes that are not UTF-8, with a newline and a NUL among them.
fn binary(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i * 7 % 256).unwrap())
        .collect()
}

/// Every message of the queue, received with its system attributes (each hidden 1 s).
async fn messages(ctx: &Context, url: &str) -> anyhow::Result<Vec<aws_sdk_sqs::types::Message>> {
    let sqs = ctx.sqs_client().await;
    let mut by_id = HashMap::new();
    for _ in 0..5 {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await?;
        for m in out.messages.unwrap_or_default() {
            by_id.insert(m.message_id.clone().unwrap_or_default(), m);
        }
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Ok(by_id.into_values().collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_letter_reads_back_whole_and_a_large_one_goes_through_s3() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-sqs").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(90), Box::pin(sqs(ctx))).await
}

async fn sqs(ctx: Context) -> anyhow::Result<()> {
    let (url, bucket) = (queue(&ctx, false).await?, bucket(&ctx).await?);
    let overflow = S3Sink::from_client(ctx.s3_client().await, &bucket, "large/");
    let sink = SqsSink::from_client(ctx.sqs_client().await, &url).with_overflow(overflow);
    let small = letter("orders", SHARD, 10, "user-1", binary(1000));
    // 300 KiB of payload is 400 KiB of base64: over the 256 KiB of a message.
    let large = letter("orders", SHARD, 11, "user-2", binary(300 * 1024));
    sink.put(&small).await?;
    sink.put(&large).await?;

    // The messages: attributes to filter on, and a pointer for the large one.
    let received = messages(&ctx, &url).await?;
    assert_eq!(received.len(), 2);
    for m in &received {
        let attributes = m.message_attributes.clone().unwrap_or_default();
        let attribute = |name: &str| attributes[name].string_value().unwrap().to_owned();
        assert_eq!(attribute("kcl.shard"), SHARD);
        assert_eq!(attribute("kcl.reason"), "parked");
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap())?;
        if attribute("kcl.partition_key") == "user-2" {
            assert_eq!(attribute("kcl.body"), "pointer");
            assert_eq!(body["pointer"]["bucket"], bucket.as_str());
            let key = body["pointer"]["key"].as_str().unwrap();
            assert_eq!(key, format!("large/orders/{SHARD}/11-2.json"));
            assert_eq!(body["id"], LetterId::of(&large).to_string());
        } else {
            assert_eq!(attribute("kcl.body"), "letter");
            assert_eq!(attribute("kcl.sequence_number"), "10");
            assert_eq!(attribute("kcl.sub_sequence_number"), "2");
            assert_eq!(body["version"], 1);
        }
    }

    // Read back: both whole, the large one from S3; then deleted, the object with it.
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let store = LetterStore::open(
        &sdk,
        Location::Sqs {
            queue_url: url.clone(),
        },
    )
    .with_receive_wait(Duration::ZERO);
    let listing = store.list().await?;
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    let letters: Vec<&DeadLetter> = listing.letters.iter().map(|s| &s.letter).collect();
    assert_eq!(letters, [&small, &large]);
    assert!(
        listing.letters[1]
            .place()
            .contains(&format!("s3://{bucket}/large/"))
    );
    let all: Vec<_> = listing.letters.iter().collect();
    assert_eq!(store.remove(&all).await?, 2);
    assert!(store.list().await?.letters.is_empty(), "messages deleted");
    assert!(
        keys(&ctx, &bucket, "large/").await?.is_empty(),
        "object deleted"
    );

    // Without an overflow, a letter over the limit is refused, saying why.
    let bare = SqsSink::from_client(ctx.sqs_client().await, &url).with_message_limit(4096);
    let refused = bare.put(&large).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fatal);
    assert!(
        refused.to_string().contains("over the queue's limit"),
        "{refused}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_keeps_a_letter_put_twice_once() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-fifo").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(fifo(ctx))).await
}

async fn fifo(ctx: Context) -> anyhow::Result<()> {
    let url = queue(&ctx, true).await?;
    let sink = SqsSink::from_client(ctx.sqs_client().await, &url);
    let one = letter("orders", SHARD, 20, "user-1", b"{\"order\": 1}".to_vec());
    sink.put(&one).await?;
    sink.put(&one).await?;
    let received = messages(&ctx, &url).await?;
    assert_eq!(received.len(), 1, "deduplicated");
    let system = received[0].attributes.clone().unwrap_or_default();
    let id = LetterId::of(&one).to_string();
    // A group per letter: SQS hides a group while any of its messages is in flight, so a
    // reader holding letters of one shard would see no more of them (docs/dead-letters.md).
    assert!(system[&MessageSystemAttributeName::MessageGroupId].starts_with("kcl-letter-"));
    assert_eq!(
        system[&MessageSystemAttributeName::MessageDeduplicationId].as_str(),
        id
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_letter_has_one_object_at_its_key_and_reads_back_whole() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-s3").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(s3(ctx))).await
}

async fn s3(ctx: Context) -> anyhow::Result<()> {
    let bucket = bucket(&ctx).await?;
    let sink = S3Sink::from_client(ctx.s3_client().await, &bucket, "app/");
    let named = letter("orders", SHARD, 30, "user-1", binary(5000));
    let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/payments";
    let by_arn = letter(arn, SHARD, 31, "user-2", Vec::new());
    sink.put(&named).await?;
    sink.put(&named).await?;
    sink.put(&by_arn).await?;
    let mut found = keys(&ctx, &bucket, "app/").await?;
    found.sort();
    assert_eq!(
        found,
        [
            format!("app/orders/{SHARD}/30-2.json"),
            format!("app/payments/{SHARD}/31-2.json"),
        ]
    );
    let sdk = ctx.sdk_at(&ctx.endpoints.s3).await;
    let store = LetterStore::open(&sdk, format!("s3://{bucket}/app/").parse()?);
    let listing = store.list().await?;
    let letters: Vec<&DeadLetter> = listing.letters.iter().map(|s| &s.letter).collect();
    assert_eq!(letters, [&named, &by_arn]);
    assert_eq!(store.remove(&[&listing.letters[0]]).await?, 1);
    assert_eq!(
        keys(&ctx, &bucket, "app/").await?,
        [format!("app/payments/{SHARD}/31-2.json")]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kinesis_letter_reads_back_whole_and_one_too_large_needs_s3() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-kinesis").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(kinesis(ctx))).await
}

async fn kinesis(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let bucket = bucket(&ctx).await?;
    let small = letter("orders", SHARD, 40, "user-1", binary(2000));
    // 800 KiB of payload is over 1 MiB as a letter.
    let large = letter("orders", SHARD, 41, "user-2", binary(800 * 1024));
    let bare = KinesisSink::from_client(ctx.kinesis.clone(), ctx.stream.as_str());
    bare.put(&small).await?;
    let refused = bare.put(&large).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fatal);
    assert!(
        refused.to_string().contains("over a Kinesis record"),
        "{refused}"
    );
    let overflow = S3Sink::from_client(ctx.s3_client().await, &bucket, "");
    let sink = bare.with_overflow(overflow);
    sink.put(&large).await?;

    // The letters' records carry their records' partition keys.
    let shard = "shardId-000000000000";
    let iterator = ctx
        .kinesis
        .get_shard_iterator()
        .stream_name(&ctx.stream)
        .shard_id(shard)
        .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
        .send()
        .await?
        .shard_iterator
        .unwrap();
    let out = ctx
        .kinesis
        .get_records()
        .shard_iterator(iterator)
        .send()
        .await?;
    let keys: Vec<&str> = out
        .records
        .iter()
        .filter_map(|r| r.partition_key())
        .collect();
    assert_eq!(keys, ["user-1", "user-2"]);

    let sdk = ctx.sdk_at(&ctx.endpoints.kinesis).await;
    let store = LetterStore::open(&sdk, Location::Kinesis(ctx.stream.clone().into()))
        .with_s3_client(ctx.s3_client().await);
    let listing = store.list().await?;
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    let letters: Vec<&DeadLetter> = listing.letters.iter().map(|s| &s.letter).collect();
    assert_eq!(letters, [&small, &large]);
    assert!(!store.removes());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_letter_reads_back_whole_and_is_removed_by_rewriting() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-file").await? else {
        return Ok(());
    };
    let path = ctx.path("letters.jsonl");
    let location: Location = format!("file:{}", path.display()).parse()?;
    let sink = location.sink(&ctx.sdk_at(&ctx.endpoints.s3).await);
    assert!(matches!(&sink, AnySink::File(file) if file.path() == path));
    let (a, b) = (
        letter("orders", SHARD, 50, "user-1", binary(300)),
        letter("orders", SHARD, 51, "user-2", b"plain text".to_vec()),
    );
    for l in [&a, &b, &a] {
        sink.put(l).await?;
    }
    let store = LetterStore::open(&ctx.sdk_at(&ctx.endpoints.s3).await, location);
    let listing = store.list().await?;
    let letters: Vec<&DeadLetter> = listing.letters.iter().map(|s| &s.letter).collect();
    assert_eq!(letters, [&a, &a, &b], "a put twice is two lines");
    assert_eq!(
        store.remove(&[&listing.letters[0]]).await?,
        2,
        "both copies"
    );
    let rest = store.list().await?;
    assert_eq!(rest.letters.len(), 1);
    assert_eq!(rest.letters[0].letter, b);
    Ok(())
}
