//! A record whose partition key has characters SQS refuses in text (control characters) is
//! dead-lettered into SQS like any other (standard and FIFO queues of moto's): the message's
//! attributes carry the key's bytes, and `kcl-admin dead-letters list` and `show` read the
//! letter back with its exact key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use common::admin;
use kcl_aws::dead_letter::{LetterId, LetterStore, Location, SqsSink};
use kcl_core::failure::DeadLetterSink as _;
use kcl_integration_tests::letters::{letter, queue};
use kcl_integration_tests::{Context, with_timeout};

const KEY: &str = "user\u{1}-7\u{1f}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_control_characters_is_carried_into_sqs_and_read_back() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-dl-keys").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    for fifo in [false, true] {
        one_queue(&ctx, fifo).await?;
    }
    Ok(())
}

async fn one_queue(ctx: &Context, fifo: bool) -> anyhow::Result<()> {
    let url = queue(ctx, fifo).await?;
    let sqs = ctx.sqs_client().await;
    let sink = SqsSink::from_client(sqs.clone(), &url);
    let l = letter(
        &ctx.stream,
        "shardId-000000000002",
        42,
        KEY,
        b"payload".to_vec(),
    );
    tokio::time::timeout(Duration::from_secs(20), sink.put(&l)).await??;

    // The message: the key's bytes as a binary attribute.
    let out = sqs
        .receive_message()
        .queue_url(&url)
        .message_attribute_names("All")
        .visibility_timeout(1)
        .send()
        .await?;
    let message = &out.messages()[0];
    let attribute = &message.message_attributes().unwrap()["kcl.partition_key"];
    assert_eq!(attribute.data_type(), "Binary.utf8");
    assert_eq!(
        attribute.binary_value().map(|b| b.as_ref()),
        Some(KEY.as_bytes())
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // The reader and kcl-admin read it back with its exact key.
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let store = LetterStore::open(
        &sdk,
        Location::Sqs {
            queue_url: url.clone(),
        },
    );
    let listing = store.list().await?;
    store.release(&listing, &Default::default()).await?;
    assert_eq!(listing.letters.len(), 1);
    assert_eq!(listing.letters[0].letter, l);
    let from = format!("sqs:{url}");
    let out = admin(ctx, &["dead-letters", "list", "--from", &from, "--json"])?;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(doc["letters"][0]["letter"]["record"]["partition_key"], KEY);
    let id = LetterId::of(&l).to_string();
    let out = admin(
        ctx,
        &["dead-letters", "show", &id, "--from", &from, "--json"],
    )?;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(doc["letter"]["record"]["partition_key"], KEY, "{doc}");
    Ok(())
}
