//! A worker on a DynamoDB table's stream (`kcl_aws::DynamoDbStreamsSource`) against moto:
//! inserts, updates and deletes reach the processor in order per item, as the Java adapter's
//! JSON; a table without a stream, another table's stream and a disabled stream are refused
//! at start, naming what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, StreamSpecification};
use kcl_aws::DynamoDbStreamsSource;
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, Worker, WorkerConfig,
};
use kcl_integration_tests::{Context, items, wait_until, with_timeout};
use serde_json::Value;

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

struct Collect(Seen);

impl RecordProcessor for Collect {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        for record in input.records() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_updates_and_deletes_reach_the_processor_in_order_per_item() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("ddb-streams").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(60), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let items = format!("{}-items", ctx.table);
    items::create(&ctx, &items, true).await?;
    let sdk = items::sdk(&ctx).await;
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
async fn a_table_without_a_stream_another_tables_stream_and_a_disabled_stream_are_refused()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("ddb-refusals").await? else {
        return Ok(());
    };
    let sdk = items::sdk(&ctx).await;
    let refusal = |result: Result<DynamoDbStreamsSource, kcl_core::BackendError>| {
        let error = result.expect_err("refused");
        eprintln!("{error}");
        assert!(error.kind().is_permanent(), "{error:?}");
        error.to_string()
    };

    let bare = format!("{}-bare", ctx.table);
    items::create(&ctx, &bare, false).await?;
    let text = refusal(DynamoDbStreamsSource::for_table(&sdk, &bare).await);
    assert!(
        text.contains(&format!("table {bare} has no DynamoDB stream: enable one")),
        "{text}"
    );

    let (orders, payments) = (
        format!("{}-orders", ctx.table),
        format!("{}-payments", ctx.table),
    );
    items::create(&ctx, &orders, true).await?;
    items::create(&ctx, &payments, true).await?;
    let of_payments = DynamoDbStreamsSource::for_table(&sdk, &payments).await?;
    let text =
        refusal(DynamoDbStreamsSource::find(&sdk, Some(&orders), Some(of_payments.arn())).await);
    assert!(
        text.contains(&format!("is table {payments}'s, not table {orders}'s")),
        "{text}"
    );

    ctx.dynamodb
        .update_table()
        .table_name(&orders)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(false)
                .build()?,
        )
        .send()
        .await?;
    let text = refusal(DynamoDbStreamsSource::for_table(&sdk, &orders).await);
    assert!(
        text.contains(&format!("the stream of table {orders}"))
            && text.contains("is disabled: enable the table's stream again"),
        "{text}"
    );
    Ok(())
}
