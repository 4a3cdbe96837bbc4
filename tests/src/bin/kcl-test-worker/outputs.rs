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
//! the stretch starts, then `committed`, or `commit_refused` for a commit refused because
//! the lease was lost (`lease_lost: true`), or `commit_failed`.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use kcl_aws::DynamoDbLeaseStore;
use kcl_core::outputs::Outputs;
use kcl_core::{BoxError, CheckpointError, Checkpointer, Record, ShardId};
use serde_json::json;

use super::Journal;

/// The two tables and the stretch of work.
#[derive(Debug, Clone)]
pub(crate) struct OutputTables {
    /// The worker's lease store: commits go through it.
    pub(crate) store: DynamoDbLeaseStore,
    /// Written exactly once, with the checkpoint.
    pub(crate) exactly: Option<String>,
    /// Written at least once, before the checkpoint.
    pub(crate) plain: Option<String>,
    /// How long each batch works on its thread before its commit.
    pub(crate) work: Duration,
}

/// A record's item key: `shard/sequence/sub-sequence`.
fn id(shard: &ShardId, record: &Record) -> AttributeValue {
    AttributeValue::S(format!(
        "{}/{}/{}",
        shard.as_str(),
        record.sequence_number.as_str(),
        record.sub_sequence_number
    ))
}

fn data(record: &Record) -> AttributeValue {
    AttributeValue::S(String::from_utf8_lossy(&record.data).into_owned())
}

impl OutputTables {
    /// The plain writes of a batch, one `UpdateItem` a record, all at once.
    async fn plain(&self, shard: &ShardId, records: &[Record]) -> Result<(), BoxError> {
        let Some(table) = &self.plain else {
            return Ok(());
        };
        let mut writes = tokio::task::JoinSet::new();
        for record in records {
            let update = self
                .store
                .client()
                .update_item()
                .table_name(table)
                .key("id", id(shard, record))
                .update_expression("ADD n :one SET #d = :d")
                .expression_attribute_names("#d", "data")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .expression_attribute_values(":d", data(record));
            writes.spawn(update.send());
        }
        while let Some(done) = writes.join_next().await {
            done??;
        }
        Ok(())
    }

    /// The batch's outputs, one write a record.
    fn outputs(
        &self,
        table: &str,
        shard: &ShardId,
        records: &[Record],
    ) -> Outputs<TransactWriteItem> {
        let mut outputs = Outputs::new();
        for record in records {
            let update = Update::builder()
                .table_name(table)
                .key("id", id(shard, record))
                .update_expression("ADD n :one SET #d = :d")
                .expression_attribute_names("#d", "data")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .expression_attribute_values(":d", data(record))
                .build();
            let write = TransactWriteItem::builder().set_update(update.ok()).build();
            outputs.push(record, write);
        }
        outputs
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
            let handle = tokio::runtime::Handle::current();
            match &self.exactly {
                Some(table) => {
                    let outputs = self.outputs(table, shard, records);
                    handle.block_on(checkpointer.commit_outputs(&self.store, outputs))
                }
                None => handle.block_on(checkpointer.checkpoint()),
            }
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
