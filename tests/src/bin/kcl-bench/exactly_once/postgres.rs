//! The Postgres variants of the exactly-once bench (issue 52): the same processor, its outputs
//! rows of a Postgres table, committed with the checkpoint by `Checkpointer::commit_outputs`
//! - into `PostgresLeaseStore`, the leases in Postgres: one transaction updates the lease
//!   row (conditioned on the tenure) and runs the batch's `INSERT`s;
//! - into `PostgresSink`, the leases in DynamoDB (moto): one transaction locks the shard's
//!   `kcl_positions` row, runs the `INSERT`s and moves the position; then the lease row's
//!   checkpoint follows as a DynamoDB `UpdateItem`, inside the same `commit_outputs` call.
//!
//! One plain `INSERT` per record, no `ON CONFLICT`: a record committed twice would be refused
//! by the primary key and fail the run, and the table's count at the end must be the records
//! written. Each run has a fresh table, a fresh application (so fresh lease and position
//! rows) and a fresh pool (the crate's defaults: 8 connections), as the DynamoDB modes have a
//! fresh table and client.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use kcl_aws::KinesisShardSource;
use kcl_core::lease::usage::{Operation, Tally};
use kcl_core::outputs::Outputs;
use kcl_core::{Checkpointer, Record, Worker};
use kcl_integration_tests::Context;
use kcl_postgres::{PostgresLeaseStore, PostgresSink, Sql};

use super::{Mode, Writer, consume};

/// Where a Postgres variant's commits go.
#[derive(Debug, Clone)]
enum Target {
    /// The lease store: the lease row in the transaction.
    Leases(PostgresLeaseStore),
    /// The sink: the shard's position row in the transaction.
    Sink(PostgresSink),
}

/// A run's output table, and the store or sink its commits go into.
#[derive(Debug, Clone)]
pub(super) struct Pg {
    target: Target,
    /// `INSERT INTO <table> (id, payload) VALUES ($1, $2)`, shared by every write.
    insert: Arc<str>,
}

impl Pg {
    /// One `INSERT` per record: `id` its shard and sequence number, `payload` its data, as
    /// the DynamoDB modes' items.
    pub(super) fn writes(&self, shard: &str, records: &[Record]) -> Vec<Sql> {
        records
            .iter()
            .map(|record| {
                Sql::new(Arc::clone(&self.insert))
                    .bind(format!("{shard}/{}", record.sequence_number))
                    .bind(String::from_utf8_lossy(&record.data).into_owned())
            })
            .collect()
    }

    /// `writes` (one per record, in order) and the batch's checkpoint in one transaction.
    pub(super) async fn commit(
        &self,
        records: &[Record],
        writes: Vec<Sql>,
        checkpointer: &mut Checkpointer,
    ) -> anyhow::Result<()> {
        let mut outputs = Outputs::new();
        for (record, write) in records.iter().zip(writes) {
            outputs.push(record, write);
        }
        match &self.target {
            Target::Leases(store) => checkpointer.commit_outputs(store, outputs).await?,
            Target::Sink(sink) => checkpointer.commit_outputs(sink, outputs).await?,
        }
        Ok(())
    }
}

/// A run's output table on the server: made fresh, counted, then dropped.
struct Table {
    client: tokio_postgres::Client,
    name: String,
}

impl Table {
    /// A table named after `base` (the run's application).
    async fn create(url: &str, base: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .context("connecting to KCL_POSTGRES_URL")?;
        tokio::spawn(connection);
        let name: String = base
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let name = format!("out_{name}");
        let create = format!("CREATE TABLE {name} (id text PRIMARY KEY, payload text NOT NULL)");
        client
            .batch_execute(&create)
            .await
            .context("CREATE TABLE")?;
        Ok(Self { client, name })
    }

    /// The rows the run committed; the table is dropped.
    async fn count_and_drop(self) -> anyhow::Result<usize> {
        let row = (self.client)
            .query_one(&format!("SELECT count(*) FROM {}", self.name), &[])
            .await
            .context("counting the output rows")?;
        let rows: i64 = row.try_get(0)?;
        let drop = format!("DROP TABLE {}", self.name);
        self.client
            .batch_execute(&drop)
            .await
            .context("DROP TABLE")?;
        Ok(usize::try_from(rows)?)
    }
}

/// One run of a Postgres variant, its stream written already: the lease store's counts by
/// operation when the last record was committed, and the rows in the output table.
pub(super) async fn consume_into(
    mode: Mode,
    ctx: &Context,
    url: &str,
    mut writer: Writer,
    records: usize,
) -> anyhow::Result<(BTreeMap<Operation, Tally>, usize)> {
    let table = Table::create(url, &ctx.table).await?;
    let insert = format!("INSERT INTO {} (id, payload) VALUES ($1, $2)", table.name);
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let usage = match mode {
        Mode::PostgresLeases => {
            let store = PostgresLeaseStore::connect(url, &ctx.table).await?;
            let target = Target::Leases(store.clone());
            writer.pg = Some(Pg {
                target,
                insert: insert.into(),
            });
            consume(
                Worker::builder(source, store.clone()),
                &store,
                writer,
                records,
            )
            .await?
        }
        Mode::PostgresSink => {
            let sink = PostgresSink::connect(url, &ctx.table).await?;
            let target = Target::Sink(sink.clone());
            writer.pg = Some(Pg {
                target,
                insert: insert.into(),
            });
            let store = ctx.store();
            let builder = Worker::builder(source, store.clone()).positions(sink);
            consume(builder, &store, writer, records).await?
        }
        other => anyhow::bail!("{} does not write into Postgres", other.name()),
    };
    Ok((usage, table.count_and_drop().await?))
}

/// The server's version, for the header.
pub(super) async fn version(url: &str) -> anyhow::Result<String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to KCL_POSTGRES_URL")?;
    tokio::spawn(connection);
    let row = client.query_one("SHOW server_version", &[]).await?;
    Ok(row.try_get(0)?)
}
