//! DynamoDB item tables whose streams the DynamoDB Streams tests read, and a writer of
//! changes to them that remembers what each write changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use aws_config::SdkConfig;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use serde_json::Value;

use crate::Context;

/// An SDK config whose DynamoDB and DynamoDB Streams endpoints are the emulator's, for
/// sources built in the test process.
pub async fn sdk(ctx: &Context) -> SdkConfig {
    crate::sdk_config()
        .await
        .into_builder()
        .endpoint_url(&ctx.endpoints.dynamodb)
        .build()
}

/// Creates table `name` keyed by `id` (a string), with a `NEW_AND_OLD_IMAGES` stream if
/// `stream`.
pub async fn create(ctx: &Context, name: &str, stream: bool) -> anyhow::Result<()> {
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
    request.send().await.context("CreateTable")?;
    Ok(())
}

/// What one write changed, as its stream record names it: `eventName`, the item's `id` and
/// its `v` (the new image's; a removal's old image's). Each is unique within a test.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Written {
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event: String,
    /// The item's key.
    pub id: String,
    /// Its `v`.
    pub v: u64,
}

impl Written {
    /// The partition key of its records: the item's key in canonical DynamoDB JSON.
    pub fn partition_key(&self) -> String {
        format!(r#"{{"id":{{"S":"{}"}}}}"#, self.id)
    }

    /// The change a stream record (the adapter's JSON) carries; `None` for other data.
    pub fn of_record(data: &str) -> Option<Self> {
        let change: Value = serde_json::from_str(data).ok()?;
        let d = &change["dynamodb"];
        let image = if d["NewImage"].is_object() {
            &d["NewImage"]
        } else {
            &d["OldImage"]
        };
        Some(Self {
            event: change["eventName"].as_str()?.to_owned(),
            id: d["Keys"]["id"]["S"].as_str()?.to_owned(),
            v: image["v"]["N"].as_str()?.parse().ok()?,
        })
    }
}

/// Writes to `items` on `items` item ids in turn: write `i` puts `v = i`, or every seventh
/// deletes the item if it exists.
#[derive(Debug)]
pub struct Writer {
    ctx: Context,
    table: String,
    ids: u64,
    next: u64,
    /// Each id's `v`, while it exists.
    present: HashMap<String, u64>,
    /// Every write so far, in order.
    pub written: Vec<Written>,
}

impl Writer {
    /// A writer to `table` over `ids` items.
    pub fn new(ctx: &Context, table: &str, ids: u64) -> Self {
        Self {
            ctx: ctx.clone(),
            table: table.to_owned(),
            ids,
            next: 0,
            present: HashMap::new(),
            written: Vec::new(),
        }
    }

    /// Makes the next write.
    pub async fn write(&mut self) -> anyhow::Result<()> {
        let i = self.next;
        let id = format!("item-{}", i % self.ids);
        let key = AttributeValue::S(id.clone());
        let written = match self.present.get(&id).copied() {
            Some(v) if i % 7 == 6 => {
                self.ctx
                    .dynamodb
                    .delete_item()
                    .table_name(&self.table)
                    .key("id", key)
                    .send()
                    .await
                    .context("DeleteItem")?;
                self.present.remove(&id);
                Written {
                    event: "REMOVE".into(),
                    id,
                    v,
                }
            }
            before => {
                self.ctx
                    .dynamodb
                    .put_item()
                    .table_name(&self.table)
                    .item("id", key)
                    .item("v", AttributeValue::N(i.to_string()))
                    .send()
                    .await
                    .context("PutItem")?;
                self.present.insert(id.clone(), i);
                let event = if before.is_some() { "MODIFY" } else { "INSERT" };
                Written {
                    event: event.into(),
                    id,
                    v: i,
                }
            }
        };
        self.written.push(written);
        self.next += 1;
        Ok(())
    }

    /// Writes `n` times.
    pub async fn write_n(&mut self, n: usize) -> anyhow::Result<()> {
        for _ in 0..n {
            self.write().await?;
        }
        Ok(())
    }

    /// Writes every `every` in a task until the returned handle is stopped.
    pub fn start(mut self, every: Duration) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            while !flag.load(Ordering::SeqCst) {
                self.write().await?;
                tokio::time::sleep(every).await;
            }
            Ok(self)
        });
        Running { stop, task }
    }
}

/// A writer at work.
#[derive(Debug)]
pub struct Running {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Writer>>,
}

impl Running {
    /// Stops writing; the writer, with everything it wrote.
    pub async fn stop(self) -> anyhow::Result<Writer> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}
