//! Window counts written to a table exactly once, in the same transaction as the checkpoint.
//!
//! Why windows and not records: a window's counts are what this consumer makes of its
//! records, and one write per window costs one item of a transaction however busy the shard
//! is, where one write per record would cost an item per record (and a transaction item costs
//! twice a plain write). Each closed window adds its counts to the item of its shard and
//! window start (`ADD`), committed with the checkpoint at the window's last record
//! ([`Checkpointer::commit_outputs_at`]): a window committed before a crash is never added
//! again (the next owner starts after its checkpoint), one not committed is recounted whole by
//! the next owner, and a worker that lost the lease cannot add anything (the transaction is
//! conditioned on its lease). A window emitted early at a graceful shutdown or handoff
//! (`"complete": false`) adds what it counted, and the next owner adds the rest to the same
//! item: the item holds each window's exact count, across any number of owners.
//!
//! The stdout lines stay at least once: they are printed before the commit, outside the
//! transaction, so a line may be printed again by the next owner after a crash.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use kcl_core::outputs::{Outputs, Transact};
use kcl_core::{CheckpointError, Checkpointer, ExtendedSequenceNumber};

use crate::window::WindowSummary;

/// A closed window and the position of its last record.
pub type Closed = (WindowSummary, ExtendedSequenceNumber);

/// Where closed windows are committed with the checkpoint that covers them.
pub trait WindowTable: Send + Sync + fmt::Debug + 'static {
    /// Checkpoints at `position` (`None`: every record delivered; `SHARD_END` inside
    /// `shard_ended`), with `windows` written in the same transaction.
    ///
    /// # Errors
    /// As [`Checkpointer::commit_outputs`]: [`CheckpointError::LeaseLost`] when this worker
    /// no longer holds the lease (nothing was written).
    fn commit<'a>(
        &'a self,
        checkpointer: &'a mut Checkpointer,
        windows: Vec<Closed>,
        position: Option<ExtendedSequenceNumber>,
    ) -> BoxFuture<'a, Result<(), CheckpointError>>;
}

/// A [`WindowTable`] on a transactional lease store: `write` makes a window's write.
pub struct Transactional<T: Transact> {
    store: T,
    write: WriteFn<T>,
}

/// What a window becomes in the store.
type WriteFn<T> = Arc<dyn Fn(&WindowSummary) -> <T as Transact>::Write + Send + Sync>;

impl<T: Transact> Transactional<T> {
    /// Windows written through `store` (the worker's lease store, or a clone of it), each as
    /// `write` makes it.
    pub fn new(
        store: T,
        write: impl Fn(&WindowSummary) -> T::Write + Send + Sync + 'static,
    ) -> Self {
        Self {
            store,
            write: Arc::new(write),
        }
    }
}

impl<T: Transact> fmt::Debug for Transactional<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactional")
            .field("store", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T: Transact> WindowTable for Transactional<T> {
    fn commit<'a>(
        &'a self,
        checkpointer: &'a mut Checkpointer,
        windows: Vec<Closed>,
        position: Option<ExtendedSequenceNumber>,
    ) -> BoxFuture<'a, Result<(), CheckpointError>> {
        let mut outputs = Outputs::new();
        for (summary, last) in &windows {
            outputs.push_at(last.clone(), (self.write)(summary));
        }
        Box::pin(async move {
            match position {
                Some(position) => {
                    checkpointer
                        .commit_outputs_at(&self.store, outputs, position)
                        .await
                }
                None => checkpointer.commit_outputs(&self.store, outputs).await,
            }
        })
    }
}

/// The DynamoDB table of window counts: its schema, the write of a window, its creation.
#[cfg(feature = "aws")]
pub mod dynamodb {
    use std::collections::HashMap;
    use std::time::Duration;

    use aws_sdk_dynamodb::Client;
    use aws_sdk_dynamodb::error::BuildError;
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
        ScalarAttributeType, TableStatus, TransactWriteItem, Update,
    };
    use chrono::SecondsFormat;
    use kcl_aws::DynamoDbLeaseStore;

    use super::Transactional;
    use crate::window::WindowSummary;

    /// The partition key: the shard (its lease key under multi-stream).
    pub const SHARD: &str = "shard";
    /// The sort key: the window's start, RFC 3339 in UTC with milliseconds (sorts by time).
    pub const WINDOW_START: &str = "window_start";

    /// Windows written to `table` with the checkpoints of `store` (which must be the worker's
    /// lease store: same client, account and region).
    pub fn windows(store: DynamoDbLeaseStore, table: &str) -> Transactional<DynamoDbLeaseStore> {
        let table = table.to_owned();
        Transactional::new(store, move |summary| write(&table, summary))
    }

    /// `ADD records, bytes, commits; SET window_end` on the window's item.
    pub fn write(table: &str, summary: &WindowSummary) -> TransactWriteItem {
        let number = |n: u64| AttributeValue::N(n.to_string());
        let text = |t: chrono::DateTime<chrono::Utc>| {
            AttributeValue::S(t.to_rfc3339_opts(SecondsFormat::Millis, true))
        };
        let update = Update::builder()
            .table_name(table)
            .key(SHARD, AttributeValue::S(summary.shard.clone()))
            .key(WINDOW_START, text(summary.window_start))
            .update_expression("ADD #r :r, #b :b, #c :one SET #e = :e")
            .expression_attribute_names("#r", "records")
            .expression_attribute_names("#b", "bytes")
            .expression_attribute_names("#c", "commits")
            .expression_attribute_names("#e", "window_end")
            .expression_attribute_values(":r", number(summary.records))
            .expression_attribute_values(":b", number(summary.bytes))
            .expression_attribute_values(":one", number(1))
            .expression_attribute_values(":e", text(summary.window_end))
            .build();
        // The builder fails only without a table, key or expression, all given above.
        TransactWriteItem::builder().set_update(update.ok()).build()
    }

    /// Why the table of window counts cannot be used.
    #[derive(Debug, thiserror::Error)]
    pub enum TableError {
        /// `external` setup and no such table.
        #[error(
            "table {table} does not exist (table-setup external creates nothing): create it with partition key `shard` (S) and sort key `window_start` (S)"
        )]
        Missing {
            /// The table.
            table: String,
        },
        /// The table's key is not `shard` + `window_start`.
        #[error("table {table} has key {found}, not `shard` (HASH) + `window_start` (RANGE)")]
        WrongKey {
            /// The table.
            table: String,
            /// Its key schema.
            found: String,
        },
        /// A DynamoDB call failed.
        #[error("{operation} of table {table} failed")]
        Call {
            /// The table.
            table: String,
            /// `DescribeTable` or `CreateTable`.
            operation: &'static str,
            /// Why.
            #[source]
            source: Box<dyn std::error::Error + Send + Sync>,
        },
        /// Created, but not ACTIVE in time.
        #[error("table {table} is not ACTIVE after {waited:?}")]
        NotActive {
            /// The table.
            table: String,
            /// How long it was waited for.
            waited: Duration,
        },
    }

    /// Checks that `table` exists with the right key; creates it (on-demand) if it is missing
    /// and `create`, and waits until it is ACTIVE.
    ///
    /// # Errors
    /// [`TableError`].
    pub async fn ensure_table(
        client: &Client,
        table: &str,
        create: bool,
    ) -> Result<(), TableError> {
        let call = |operation| {
            let table = table.to_owned();
            move |e: Box<dyn std::error::Error + Send + Sync>| TableError::Call {
                table,
                operation,
                source: e,
            }
        };
        let described = client.describe_table().table_name(table).send().await;
        let missing = matches!(&described, Err(e)
            if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()));
        if missing {
            if !create {
                return Err(TableError::Missing {
                    table: table.to_owned(),
                });
            }
            let (attributes, keys) = schema().map_err(|e| call("CreateTable")(Box::new(e)))?;
            let created = client
                .create_table()
                .table_name(table)
                .billing_mode(BillingMode::PayPerRequest)
                .set_attribute_definitions(Some(attributes))
                .set_key_schema(Some(keys))
                .send()
                .await;
            match created {
                Ok(_) => {}
                // Another worker created it meanwhile.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_in_use_exception()) => {}
                Err(e) => return Err(call("CreateTable")(Box::new(e))),
            }
            return wait_active(client, table).await;
        }
        let described = described.map_err(|e| call("DescribeTable")(Box::new(e)))?;
        let schema = described
            .table()
            .map(|t| t.key_schema().to_vec())
            .unwrap_or_default();
        let names: Vec<(String, KeyType)> = schema
            .iter()
            .map(|k| (k.attribute_name().to_owned(), k.key_type().clone()))
            .collect();
        let want = vec![
            (SHARD.to_owned(), KeyType::Hash),
            (WINDOW_START.to_owned(), KeyType::Range),
        ];
        if names != want {
            return Err(TableError::WrongKey {
                table: table.to_owned(),
                found: format!("{names:?}"),
            });
        }
        wait_active(client, table).await
    }

    /// The table's key: `shard` (HASH) and `window_start` (RANGE), both strings.
    fn schema() -> Result<(Vec<AttributeDefinition>, Vec<KeySchemaElement>), BuildError> {
        let attribute = |name| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        Ok((
            vec![attribute(SHARD)?, attribute(WINDOW_START)?],
            vec![
                key(SHARD, KeyType::Hash)?,
                key(WINDOW_START, KeyType::Range)?,
            ],
        ))
    }

    /// Waits (up to a minute) until `table` is ACTIVE.
    async fn wait_active(client: &Client, table: &str) -> Result<(), TableError> {
        let limit = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        loop {
            let out = client.describe_table().table_name(table).send().await;
            let status = out
                .ok()
                .and_then(|o| o.table().and_then(|t| t.table_status().cloned()));
            if status == Some(TableStatus::Active) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(TableError::NotActive {
                    table: table.to_owned(),
                    waited: limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Every item of `table`: `(shard, window_start) → records` (for tests and tools).
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
                if let (Some(shard), Some(start)) = (text(SHARD), text(WINDOW_START)) {
                    out.insert((shard, start), records);
                }
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(out),
            }
        }
    }
}
