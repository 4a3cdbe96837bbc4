//! The dead-letter sinks' start-up checks (`DeadLetterSink::check`) against the emulators
//! (moto's SQS and S3, kinesis-mock): a missing queue, bucket, stream or folder is an error
//! that says what to fix, an overflow bucket is checked with its queue or stream, and a
//! retention shorter than `RETENTION_FLOOR` is a warning naming both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use kcl_aws::dead_letter::{AnySink, FileSink, KinesisSink, S3Sink, SqsSink};
use kcl_core::ErrorKind;
use kcl_core::failure::DeadLetterSink as _;
use kcl_integration_tests::letters::{bucket, queue};
use kcl_integration_tests::{Context, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sink_checks_what_it_writes_to() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("dl-check").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    sqs(&ctx).await?;
    s3(&ctx).await?;
    kinesis(&ctx).await?;
    file(&ctx).await
}

async fn sqs(ctx: &Context) -> anyhow::Result<()> {
    let client = ctx.sqs_client().await;
    let url = queue(ctx, false).await?;
    // moto keeps messages SQS's default 4 days: under the floor of 7.
    let warnings = SqsSink::from_client(client.clone(), &url).check().await?;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for needle in [
        url.as_str(),
        "4 days",
        "345600 s",
        "7 days",
        "MessageRetentionPeriod",
    ] {
        assert!(warnings[0].contains(needle), "`{needle}`: {warnings:?}");
    }
    client
        .set_queue_attributes()
        .queue_url(&url)
        .attributes("MessageRetentionPeriod".into(), "1209600")
        .send()
        .await?;
    let sink = AnySink::Sqs(SqsSink::from_client(client.clone(), &url));
    assert_eq!(sink.check().await?, Vec::<String>::new(), "14 days");

    let gone = format!("{}nope", url.trim_end_matches(|c| c != '/'));
    let e = SqsSink::from_client(client.clone(), &gone)
        .check()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("the SQS queue {gone} does not exist: create it")),
        "{text}"
    );

    // The overflow bucket is checked with the queue.
    let overflow = S3Sink::from_client(ctx.s3_client().await, "kcl-no-such-bucket", "large/");
    let e = SqsSink::from_client(client, &url)
        .with_overflow(overflow)
        .check()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("kcl-no-such-bucket"), "{e}");
    Ok(())
}

async fn s3(ctx: &Context) -> anyhow::Result<()> {
    let client = ctx.s3_client().await;
    let name = bucket(ctx).await?;
    let sink = S3Sink::from_client(client.clone(), &name, "letters/");
    assert_eq!(sink.check().await?, Vec::<String>::new());
    let e = S3Sink::from_client(client, "kcl-no-such-bucket", "letters/")
        .check()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string()
            .contains("the S3 bucket kcl-no-such-bucket (dead letters under `letters/`) does not exist: create it"),
        "{e}"
    );
    Ok(())
}

async fn kinesis(ctx: &Context) -> anyhow::Result<()> {
    let e = KinesisSink::from_client(ctx.kinesis.clone(), ctx.stream.as_str())
        .check()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string().contains(&format!(
            "the Kinesis stream {} does not exist: create it",
            ctx.stream
        )),
        "{e}"
    );
    ctx.create_stream(1).await?;
    // A stream keeps records 24 hours by default.
    let sink = KinesisSink::from_client(ctx.kinesis.clone(), ctx.stream.as_str());
    let warnings = sink.check().await?;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for needle in ["1 day", "24 hours", "7 days", ctx.stream.as_str()] {
        assert!(warnings[0].contains(needle), "`{needle}`: {warnings:?}");
    }
    let overflow = S3Sink::from_client(ctx.s3_client().await, "kcl-no-such-bucket", "");
    let e = sink.with_overflow(overflow).check().await.unwrap_err();
    assert!(e.to_string().contains("kcl-no-such-bucket"), "{e}");
    Ok(())
}

async fn file(ctx: &Context) -> anyhow::Result<()> {
    let sink = AnySink::File(FileSink::new(ctx.path("letters.jsonl")));
    assert_eq!(sink.check().await?, Vec::<String>::new());
    let e = AnySink::File(FileSink::new(ctx.path("nowhere/letters.jsonl")))
        .check()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    Ok(())
}
