//! `--outputs-table`, `--plain-table` and `--work-ms`: each record's output written twice,
//! exactly once and at least once, so that one run yields both counts.
//!
//! Per record, an item keyed by shard, sequence and sub-sequence number (`id`) gets
//! `ADD n :1` (and its payload in `data`):
//! - in the plain table with an `UpdateItem` while the batch is processed, before the
//!   checkpoint, as a consumer without transactions does: a batch processed again after a
//!   crash or a takeover adds 1 again;
//! - in the outputs table through [`Checkpointer::commit_outputs`], in the transaction of the
//!   batch's checkpoint, conditioned on this worker's lease: every record's item ends at 1.
//!
//! Between the two, the batch "works" for `--work-ms` on its thread (a processor busy with
//! CPU, or blocked in a synchronous call): the hook is not at an `.await` there, so a process
//! frozen (SIGSTOP) in that stretch and thawed after its lease moved goes on to commit, as a
//! zombie does; the commit then runs to its end on this thread too (`block_in_place`), so its
//! refusal reaches the journal. A journal line says what came of each commit: `work` when
//! the stretch starts, `worked` when it ends (the commit starts), then `committed`, or `commit_refused` for a commit refused because
//! the lease was lost (`lease_lost: true`), or `commit_failed`.
//!
//! With `--outputs-postgres URL` both tables are Postgres tables (`id text primary key, n
//! bigint, data text`, made by the test), each write an `INSERT … ON CONFLICT (id) DO UPDATE
//! SET n = n + 1`: the plain one autocommitted, the exactly-once one in the transaction of
//! the checkpoint — the lease row's, when the leases are in that database too
//! (`PostgresLeaseStore` commits), else the shard's `kcl_positions` row (`PostgresSink`,
//! which the worker is given with `WorkerBuilder::positions`).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::outputs::{Outputs, Transact};
use kcl_core::{BoxError, CheckpointError, Checkpointer, Record, ShardId};
use kcl_postgres::{PostgresLeaseStore, PostgresSink, Sql};
use serde_json::json;

use super::Journal;

/// Where the exactly-once outputs commit, and the table they go to.
#[derive(Debug, Clone)]
pub(crate) enum Exactly {
    /// In a DynamoDB transaction with the lease row.
    DynamoDb(DynamoDbLeaseStore, String),
    /// In a Postgres transaction with the lease row (the leases in that database).
    PostgresLeases(PostgresLeaseStore, String),
    /// In a Postgres transaction with the shard's `kcl_positions` row.
    PostgresSink(PostgresSink, String),
}

/// Where the at-least-once outputs go.
#[derive(Debug, Clone)]
pub(crate) enum Plain {
    DynamoDb(aws_sdk_dynamodb::Client, String),
    Postgres(Arc<tokio_postgres::Client>, String),
}

/// The two tables and the stretch of work.
#[derive(Debug, Clone)]
pub(crate) struct OutputTables {
    /// Written exactly once, with the checkpoint.
    pub(crate) exactly: Option<Exactly>,
    /// Written at least once, before the checkpoint.
    pub(crate) plain: Option<Plain>,
    /// How long each batch works on its thread before its commit.
    pub(crate) work: Duration,
}

/// A record's item key: `shard/sequence/sub-sequence`.
fn id(shard: &ShardId, record: &Record) -> String {
    format!(
        "{}/{}/{}",
        shard.as_str(),
        record.sequence_number.as_str(),
        record.sub_sequence_number
    )
}

fn data(record: &Record) -> String {
    String::from_utf8_lossy(&record.data).into_owned()
}

/// A record's write to the Postgres table `table` (its id and data the values): counts each
/// time it applies.
fn upsert_statement(table: &str) -> String {
    format!(
        "INSERT INTO {table} (id, n, data) VALUES ($1, 1, $2) \
         ON CONFLICT (id) DO UPDATE SET n = {table}.n + 1"
    )
}

/// Connects to `url` without TLS (the tests' local server) for the plain writes.
pub(crate) async fn plain_client(url: &str) -> anyhow::Result<Arc<tokio_postgres::Client>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "the plain table's connection ended");
        }
    });
    Ok(Arc::new(client))
}

impl OutputTables {
    /// The plain writes of a batch, one a record, all at once.
    async fn plain(&self, shard: &ShardId, records: &[Record]) -> Result<(), BoxError> {
        match &self.plain {
            None => Ok(()),
            Some(Plain::DynamoDb(client, table)) => {
                let mut writes = tokio::task::JoinSet::new();
                for record in records {
                    let update = client
                        .update_item()
                        .table_name(table)
                        .key("id", AttributeValue::S(id(shard, record)))
                        .update_expression("ADD n :one SET #d = :d")
                        .expression_attribute_names("#d", "data")
                        .expression_attribute_values(":one", AttributeValue::N("1".into()))
                        .expression_attribute_values(":d", AttributeValue::S(data(record)));
                    writes.spawn(update.send());
                }
                while let Some(done) = writes.join_next().await {
                    done??;
                }
                Ok(())
            }
            Some(Plain::Postgres(client, table)) => {
                let statement = upsert_statement(table);
                for record in records {
                    let values = (id(shard, record), data(record));
                    client.execute(&statement, &[&values.0, &values.1]).await?;
                }
                Ok(())
            }
        }
    }

    /// Commits the batch's outputs with the checkpoint (or checkpoints alone, without an
    /// outputs table).
    async fn commit(
        &self,
        shard: &ShardId,
        records: &[Record],
        checkpointer: &mut Checkpointer,
    ) -> Result<(), CheckpointError> {
        match &self.exactly {
            None => checkpointer.checkpoint().await,
            Some(Exactly::DynamoDb(store, table)) => {
                let outputs = dynamodb_outputs(table, shard, records);
                checkpointer.commit_outputs(store, outputs).await
            }
            Some(Exactly::PostgresLeases(store, table)) => {
                commit_sql(checkpointer, store, table, shard, records).await
            }
            Some(Exactly::PostgresSink(sink, table)) => {
                commit_sql(checkpointer, sink, table, shard, records).await
            }
        }
    }

    /// Writes the batch's plain outputs, works, then commits its outputs with the
    /// checkpoint (or checkpoints alone, without an outputs table). Ok after a commit refused
    /// because the lease was lost: the worker notices and stops the shard.
    pub(crate) async fn process(
        &self,
        shard: &ShardId,
        records: &[Record],
        checkpointer: &mut Checkpointer,
        journal: &Journal,
    ) -> Result<(), BoxError> {
        self.plain(shard, records).await?;
        let seq = records.last().map(|r| r.position().to_string());
        let line = json!({"shard": shard.as_str(), "seq": seq, "count": records.len()});
        let result = tokio::task::block_in_place(|| {
            journal.write("work", line.clone());
            std::thread::sleep(self.work);
            journal.write("worked", line.clone());
            let handle = tokio::runtime::Handle::current();
            handle.block_on(self.commit(shard, records, checkpointer))
        });
        let mut line = line;
        match result {
            Ok(()) => {
                journal.write("committed", line);
                Ok(())
            }
            Err(error @ CheckpointError::LeaseLost { .. }) => {
                line["lease_lost"] = json!(true);
                line["error"] = json!(error.to_string());
                journal.write("commit_refused", line);
                Ok(())
            }
            Err(error) => {
                line["error"] = json!(error.to_string());
                journal.write("commit_failed", line);
                Err(error.into())
            }
        }
    }
}

/// A batch's outputs into DynamoDB, one write a record.
fn dynamodb_outputs(
    table: &str,
    shard: &ShardId,
    records: &[Record],
) -> Outputs<TransactWriteItem> {
    let mut outputs = Outputs::new();
    for record in records {
        let update = Update::builder()
            .table_name(table)
            .key("id", AttributeValue::S(id(shard, record)))
            .update_expression("ADD n :one SET #d = :d")
            .expression_attribute_names("#d", "data")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":d", AttributeValue::S(data(record)))
            .build();
        let write = TransactWriteItem::builder().set_update(update.ok()).build();
        outputs.push(record, write);
    }
    outputs
}

/// Commits a batch's outputs into Postgres through `store`.
async fn commit_sql<T: Transact<Write = Sql>>(
    checkpointer: &mut Checkpointer,
    store: &T,
    table: &str,
    shard: &ShardId,
    records: &[Record],
) -> Result<(), CheckpointError> {
    let statement: Arc<str> = Arc::from(upsert_statement(table));
    let mut outputs = Outputs::new();
    for record in records {
        let sql = Sql::new(statement.clone())
            .bind(id(shard, record))
            .bind(data(record));
        outputs.push(record, sql);
    }
    checkpointer.commit_outputs(store, outputs).await
}
