//! A worker on a DynamoDB table's stream (`kcl_aws::DynamoDbStreamsSource`) against moto:
//! inserts, updates and deletes reach the processor in order per item, as the Java adapter's
//! JSON; a table without a stream is refused at start, naming what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use kcl_aws::DynamoDbStreamsSource;
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, Worker, WorkerConfig,
};
use kcl_integration_tests::{Context, wait_until, with_timeout};
use serde_json::Value;

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

struct Collect(Seen);

impl RecordProcessor for Collect {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in &input.records {
            let change: Value = serde_json::from_slice(&record.data)?;
            self.0
                .lock()
                .unwrap()
                .push((record.partition_key.clone(), change));
        }
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

async fn sdk(ctx: &Context) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&ctx.endpoints.dynamodb)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test",
            "test",
            None,
            None,
            "kcl-tests",
        ))
        .load()
        .await
}

async fn create_table(ctx: &Context, name: &str, stream: bool) -> anyhow::Result<()> {
    let mut request = ctx
        .dynamodb
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()?,
        );
    if stream {
        request = request.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()?,
        );
    }
    request.send().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_updates_and_deletes_reach_the_processor_in_order_per_item() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ddb-streams").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let items = format!("{}-items", ctx.table);
    create_table(&ctx, &items, true).await?;
    let sdk = sdk(&ctx).await;
    let put = |id: &str, n: &str| {
        ctx.dynamodb
            .put_item()
            .table_name(&items)
            .item("id", AttributeValue::S(id.into()))
            .item("n", AttributeValue::N(n.into()))
            .send()
    };
    put("a", "1").await?;
    put("b", "1").await?;
    put("a", "2").await?;
    put("c", "1").await?;
    put("a", "3").await?;
    ctx.dynamodb
        .delete_item()
        .table_name(&items)
        .key("id", AttributeValue::S("b".into()))
        .send()
        .await?;
    let source = DynamoDbStreamsSource::for_table(&sdk, &items).await?;
    let seen = Seen::default();
    let collected = seen.clone();
    let config = WorkerConfig::default().idle_time_between_reads(Duration::from_millis(200));
    let worker = Worker::builder(source, ctx.store())
        .id("w")
        .config(config)
        .build(move |_| Collect(collected.clone()))?;
    let stop = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    wait_until(
        "six changes",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(seen.lock().unwrap().len() >= 6),
    )
    .await?;
    stop.shutdown();
    task.await??;
    let seen = seen.lock().unwrap().clone();
    let of = |id: &str| -> Vec<(String, Option<String>)> {
        seen.iter()
            .filter(|(_, c)| c["dynamodb"]["Keys"]["id"]["S"] == id)
            .map(|(_, c)| {
                let name = c["eventName"].as_str().unwrap_or_default().to_owned();
                let n = c["dynamodb"]["NewImage"]["n"]["N"]
                    .as_str()
                    .map(str::to_owned);
                (name, n)
            })
            .collect()
    };
    let s = |x: &str| Some(x.to_owned());
    assert_eq!(
        of("a"),
        [
            ("INSERT".into(), s("1")),
            ("MODIFY".into(), s("2")),
            ("MODIFY".into(), s("3"))
        ]
    );
    assert_eq!(
        of("b"),
        [("INSERT".into(), s("1")), ("REMOVE".into(), None)]
    );
    assert_eq!(of("c"), [("INSERT".into(), s("1"))]);
    // The partition key is the item's key: Parallel orders per item.
    assert!(
        seen.iter()
            .all(|(pk, c)| pk == &c["dynamodb"]["Keys"].to_string())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_stream_is_refused_naming_what_to_do() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ddb-no-stream").await? else {
        return Ok(());
    };
    let items = format!("{}-items", ctx.table);
    create_table(&ctx, &items, false).await?;
    let error = DynamoDbStreamsSource::for_table(&sdk(&ctx).await, &items)
        .await
        .expect_err("no stream");
    let text = error.to_string();
    eprintln!("{text}");
    assert!(
        text.contains(&items) && text.contains("no DynamoDB stream enabled"),
        "{text}"
    );
    Ok(())
}
