//! The DynamoDB table of window counts: its items, their writes and reads.
//!
//! Keyed by `shard` (S, partition key: the shard id, or its lease key under multi-stream)
//! and `window_start` (S, sort key). Three kinds of items:
//!
//! - **a window**: `window_start` is the window's start, RFC 3339 in UTC with milliseconds;
//!   `records`, `bytes`, `window_end`, and `commits` (how many owners' commits built it).
//! - **a shard's position** ([`POSITION`]): `window_start` is `#position`. `checkpoint` and
//!   `sub_sequence` (as the lease table stores a checkpoint) are the checkpoint the shard's
//!   last commit wrote, in the same transaction as its windows; `application`, `fence` (the
//!   committing tenure's fencing token), `updated_at`. When a worker finds the shard's lease
//!   out of step with it ([`step`](super::step)), it moves it to the lease's checkpoint and
//!   records what it found: `gaps` and `last_gap` (the lease was ahead: windows missing;
//!   the position moves to the lease), `replays` and `last_replay` (behind: the records up to
//!   the position are delivered again and skipped; the position stays). This is the
//!   position a sink's own resume reads (issue 52).
//! - **the application item** ([`APPLICATION`], both keys): `application`, the one
//!   application (lease table) the table belongs to, `created_by`, `created_at`, and
//!   `baseline` (`pending`, then `done` once the positions of the shards leased at the first
//!   use were recorded). See [`claim`](super::claim).
//!
//! A key starting with `#` is never a window's (a window's starts with a digit).

pub mod setup;

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use chrono::SecondsFormat;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::{Checkpoint, FencingToken, ShardId};

pub use self::setup::ensure_table;
pub use super::TableError;
pub use super::claim::claim;
use super::step::{Mismatch, Step};
use super::{Items, Position, Transactional};
use crate::window::WindowSummary;

/// The partition key: the shard (its lease key under multi-stream).
pub const SHARD: &str = "shard";
/// The sort key: the window's start, RFC 3339 in UTC with milliseconds (sorts by time).
pub const WINDOW_START: &str = "window_start";
/// The sort key of a shard's position item.
pub const POSITION: &str = "#position";
/// Both keys of the application item.
pub const APPLICATION: &str = "#application";

/// Reads at once in a check of every shard's position.
const CONCURRENT_READS: usize = 8;

/// The items of one table, written by one application's workers.
#[derive(Debug, Clone)]
pub struct DynamoDbItems {
    client: Client,
    table: String,
    application: String,
    worker: String,
}

impl DynamoDbItems {
    /// Items of `table`, written by `worker` of `application` (its lease table's name).
    pub fn new(client: Client, table: &str, application: &str, worker: &str) -> Self {
        Self {
            client,
            table: table.to_owned(),
            application: application.to_owned(),
            worker: worker.to_owned(),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A failed call of `operation`, or [`TableError::Gone`] if the table does not exist.
    fn failed<E>(&self, operation: &'static str, shard: &ShardId, error: E) -> TableError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
    {
        if error.code() == Some("ResourceNotFoundException") {
            return TableError::Gone {
                table: self.table.clone(),
                create: super::error::DYNAMODB_SHAPE,
                shard: shard.clone(),
                when: "reading the position of",
            };
        }
        TableError::Call {
            table: self.table.clone(),
            operation,
            source: Box::new(error),
        }
    }

    /// `shard`'s position item, as it is.
    ///
    /// # Errors
    /// [`TableError::Gone`], or the read's.
    pub async fn read_position(&self, shard: &ShardId) -> Result<Option<PositionItem>, TableError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(SHARD, text(shard.as_str()))
            .key(WINDOW_START, text(POSITION))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed("GetItem", shard, e.into_service_error()))?;
        Ok(out.item().map(PositionItem::of))
    }
}

/// What a shard's position item holds (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PositionItem {
    /// `checkpoint` and `sub_sequence`.
    pub checkpoint: Option<Checkpoint>,
    /// `application`.
    pub application: Option<String>,
    /// `fence`, if a commit wrote it last.
    pub fence: Option<u64>,
    /// `gaps`: times the lease was found ahead.
    pub gaps: u64,
    /// `last_gap`.
    pub last_gap: Option<String>,
    /// `replays`: times the lease was found behind.
    pub replays: u64,
}

impl PositionItem {
    fn of(item: &HashMap<String, AttributeValue>) -> Self {
        let s = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        let n = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<u64>().ok())
        };
        Self {
            checkpoint: s("checkpoint")
                .and_then(|c| Checkpoint::parse(&c, n("sub_sequence").unwrap_or(0))),
            application: s("application"),
            fence: n("fence"),
            gaps: n("gaps").unwrap_or(0),
            last_gap: s("last_gap"),
            replays: n("replays").unwrap_or(0),
        }
    }
}

fn text(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn now() -> AttributeValue {
    text(&chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// Windows written to `table` with the checkpoints of `store` (which must be the worker's
/// lease store: same client, account and region), by `worker`.
pub fn windows(
    store: DynamoDbLeaseStore,
    table: &str,
    worker: &str,
) -> Transactional<DynamoDbItems> {
    let items = DynamoDbItems::new(store.client().clone(), table, store.table_name(), worker);
    Transactional::new(store, items)
}

/// `ADD records, bytes, commits; SET window_end` on the window's item.
pub fn write(table: &str, summary: &WindowSummary) -> TransactWriteItem {
    let time = |t: chrono::DateTime<chrono::Utc>| {
        AttributeValue::S(t.to_rfc3339_opts(SecondsFormat::Millis, true))
    };
    let update = Update::builder()
        .table_name(table)
        .key(SHARD, AttributeValue::S(summary.shard.clone()))
        .key(WINDOW_START, time(summary.window_start))
        .update_expression("ADD #r :r, #b :b, #c :one SET #e = :e")
        .expression_attribute_names("#r", "records")
        .expression_attribute_names("#b", "bytes")
        .expression_attribute_names("#c", "commits")
        .expression_attribute_names("#e", "window_end")
        .expression_attribute_values(":r", number(summary.records))
        .expression_attribute_values(":b", number(summary.bytes))
        .expression_attribute_values(":one", number(1))
        .expression_attribute_values(":e", time(summary.window_end))
        .build();
    // The builder fails only without a table, key or expression, all given above.
    TransactWriteItem::builder().set_update(update.ok()).build()
}

impl Items for DynamoDbItems {
    type Store = DynamoDbLeaseStore;

    fn table(&self) -> &str {
        &self.table
    }

    fn application(&self) -> &str {
        &self.application
    }

    fn worker(&self) -> &str {
        &self.worker
    }

    fn window(&self, summary: &WindowSummary) -> TransactWriteItem {
        write(&self.table, summary)
    }

    fn position(
        &self,
        shard: &ShardId,
        checkpoint: &Checkpoint,
        fence: FencingToken,
    ) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .key(SHARD, text(shard.as_str()))
            .key(WINDOW_START, text(POSITION))
            .update_expression(
                "SET #cp = :cp, #sub = :sub, #app = :app, #fence = :fence, #at = :at",
            )
            .condition_expression("attribute_not_exists(#app) OR #app = :app")
            .expression_attribute_names("#cp", "checkpoint")
            .expression_attribute_names("#sub", "sub_sequence")
            .expression_attribute_names("#app", "application")
            .expression_attribute_names("#fence", "fence")
            .expression_attribute_names("#at", "updated_at")
            .expression_attribute_values(":cp", text(checkpoint.as_str()))
            .expression_attribute_values(":sub", number(checkpoint.sub_sequence()))
            .expression_attribute_values(":app", text(&self.application))
            .expression_attribute_values(":fence", number(fence.0))
            .expression_attribute_values(":at", now())
            .build();
        // The builder fails only without a table, key or expression, all given above.
        TransactWriteItem::builder().set_update(update.ok()).build()
    }

    fn read_positions<'a>(
        &'a self,
        shards: &'a [ShardId],
    ) -> BoxFuture<'a, Result<HashMap<ShardId, Position>, TableError>> {
        Box::pin(async move {
            let reads = futures_util::stream::iter(shards.iter().cloned())
                .map(|shard| async move {
                    let read = self.read_position(&shard).await;
                    (shard, read)
                })
                .buffer_unordered(CONCURRENT_READS)
                .collect::<Vec<_>>()
                .await;
            let mut found = HashMap::new();
            for (shard, read) in reads {
                let Some(item) = read? else { continue };
                if let Some(checkpoint) = item.checkpoint {
                    let application = item.application;
                    found.insert(
                        shard,
                        Position {
                            checkpoint,
                            application,
                        },
                    );
                }
            }
            Ok(found)
        })
    }

    fn realign<'a>(&'a self, mismatch: &'a Mismatch) -> BoxFuture<'a, Result<bool, TableError>> {
        Box::pin(realign(self, mismatch))
    }

    fn diagnose<'a>(&'a self, shard: &'a ShardId) -> BoxFuture<'a, Option<TableError>> {
        Box::pin(async move {
            let described = self
                .client
                .describe_table()
                .table_name(&self.table)
                .send()
                .await;
            match described {
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    Some(TableError::Gone {
                        table: self.table.clone(),
                        create: super::error::DYNAMODB_SHAPE,
                        shard: shard.clone(),
                        when: "committing windows of",
                    })
                }
                _ => None,
            }
        })
    }
}

/// [`Items::realign`]: the mismatch counted and described in the position item, if it still
/// holds what was found; a lease ahead also moves it to the lease's checkpoint.
async fn realign(items: &DynamoDbItems, mismatch: &Mismatch) -> Result<bool, TableError> {
    let (count, last, set) = match mismatch.step {
        Step::Behind => ("replays", "last_replay", ""),
        Step::Missing | Step::InStep => ("gaps", "last_gap", "#cp = :cp, #sub = :sub, "),
    };
    let found = match &mismatch.table {
        None => "attribute_not_exists(#cp)",
        Some(_) => "#cp = :was AND #sub = :wassub",
    };
    let description = mismatch.description(&items.worker);
    let mut update = items
        .client
        .update_item()
        .table_name(&items.table)
        .key(SHARD, text(mismatch.shard.as_str()))
        .key(WINDOW_START, text(POSITION))
        .update_expression(format!(
            "SET {set}#app = :app, #at = :at, #last = :last ADD #count :one"
        ))
        .condition_expression(format!(
            "({found}) AND (attribute_not_exists(#app) OR #app = :app)"
        ))
        .expression_attribute_names("#cp", "checkpoint")
        .expression_attribute_names("#sub", "sub_sequence")
        .expression_attribute_names("#app", "application")
        .expression_attribute_names("#at", "updated_at")
        .expression_attribute_names("#last", last)
        .expression_attribute_names("#count", count)
        .expression_attribute_values(":app", text(&items.application))
        .expression_attribute_values(":at", now())
        .expression_attribute_values(":last", text(&description))
        .expression_attribute_values(":one", number(1));
    if !set.is_empty() {
        update = update
            .expression_attribute_values(":cp", text(mismatch.lease.as_str()))
            .expression_attribute_values(":sub", number(mismatch.lease.sub_sequence()));
    }
    if let Some(was) = &mismatch.table {
        update = update
            .expression_attribute_values(":was", text(was.as_str()))
            .expression_attribute_values(":wassub", number(was.sub_sequence()));
    }
    match update.send().await {
        Ok(_) => Ok(true),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            Ok(false)
        }
        Err(e) => Err(items.failed("UpdateItem", &mismatch.shard, e.into_service_error())),
    }
}

/// Every window item of `table`: `(shard, window_start) → records` (for tests and tools).
///
/// # Errors
/// The Scan's.
pub async fn read_counts(
    client: &Client,
    table: &str,
) -> Result<HashMap<(String, String), u64>, TableError> {
    let mut out = HashMap::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| TableError::Call {
                table: table.to_owned(),
                operation: "Scan",
                source: Box::new(e),
            })?;
        for item in page.items() {
            let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
            let records = item
                .get("records")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if let (Some(shard), Some(start)) = (text(SHARD), text(WINDOW_START))
                && !start.starts_with('#')
            {
                out.insert((shard, start), records);
            }
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => return Ok(out),
        }
    }
}
