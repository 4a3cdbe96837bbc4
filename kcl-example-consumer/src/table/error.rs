//! Why the table of window counts cannot be used, or a commit into it failed: each error
//! names the table, and the shard when there is one, and says what to do.

use std::time::Duration;

use kcl_core::{CheckpointError, ShardId};

/// Why the exactly-once table cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// `external` setup and no such table, at start.
    #[error(
        "exactly-once table {table} does not exist, and --table-setup external creates \
         nothing: create it ({create}), or start with --table-setup managed"
    )]
    Missing {
        /// The table.
        table: String,
        /// What to create: [`DYNAMODB_SHAPE`], or the Postgres statements' whereabouts.
        create: &'static str,
    },
    /// The table went away while running (deleted).
    #[error(
        "exactly-once table {table} does not exist (deleted while running?), found {when} \
         shard {shard}: the shard keeps its checkpoint at its last commit, so no window is \
         lost, and makes no progress until the table is back; create it again ({create}) or \
         restart with --table-setup managed. Its earlier windows are gone with it"
    )]
    Gone {
        /// The table.
        table: String,
        /// What to create, as in [`TableError::Missing`].
        create: &'static str,
        /// The shard whose commit or opening found it missing.
        shard: ShardId,
        /// `committing windows of`, `opening`, `reading the position of`.
        when: &'static str,
    },
    /// A key attribute of the table has another name or role than this consumer writes.
    #[error(
        "exactly-once table {table}: its {role} key is {found}, expected `{expected}` (S); \
         use another table, or recreate this one with partition key `shard` S and sort key \
         `window_start` S"
    )]
    WrongKey {
        /// The table.
        table: String,
        /// `partition` or `sort`.
        role: &'static str,
        /// The attribute expected.
        expected: &'static str,
        /// What the table has instead (`none`, or the attribute's name).
        found: String,
    },
    /// A key attribute has the right name and another type.
    #[error(
        "exactly-once table {table}: key attribute `{attribute}` is of type {found}, expected \
         {expected}; use another table, or recreate this one with partition key `shard` S and \
         sort key `window_start` S"
    )]
    KeyType {
        /// The table.
        table: String,
        /// The attribute.
        attribute: &'static str,
        /// The type this consumer writes (`S`).
        expected: &'static str,
        /// The table's type for it (`N`, `B`, or `none` if undeclared).
        found: String,
    },
    /// The table is another application's.
    #[error(
        "exactly-once table {table} belongs to application {theirs}{at}, not to {ours}: two \
         applications writing one table add up each other's windows (every stream has a \
         shardId-000000000000); give {ours} a table of its own",
        at = named_by(.shard.as_ref())
    )]
    OtherApplication {
        /// The table.
        table: String,
        /// This worker's application (its lease table).
        ours: String,
        /// The application the table's item names.
        theirs: String,
        /// The shard whose position item names it, if it was found there rather than in the
        /// application item.
        shard: Option<ShardId>,
    },
    /// A table in Postgres lacks columns this consumer writes or reads.
    #[error(
        "exactly-once table {table} has no column {missing} (it has: {found}): add {it}, or \
         use another table; the statements that make it are in \
         kcl-example-consumer/README.md",
        it = if .missing.contains(',') { "them" } else { "it" }
    )]
    Columns {
        /// The table.
        table: String,
        /// The columns missing, quoted and joined by commas.
        missing: String,
        /// The columns it has.
        found: String,
    },
    /// A table in Postgres has no unique key on the columns its upserts name.
    #[error(
        "exactly-once table {table} has no primary key or unique index on ({key}): its rows \
         are written with INSERT … ON CONFLICT ({key}), which needs one; add it \
         (ALTER TABLE {table} ADD PRIMARY KEY ({key})), or use another table"
    )]
    NoKey {
        /// The table.
        table: String,
        /// The key's columns, joined by commas.
        key: &'static str,
    },
    /// A call to the table's store failed.
    #[error("{operation} of exactly-once table {table} failed")]
    Call {
        /// The table.
        table: String,
        /// The call (`DescribeTable`, `CreateTable`, `GetItem`…).
        operation: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Created, but not ACTIVE in time.
    #[error("exactly-once table {table} is not ACTIVE after {waited:?}")]
    NotActive {
        /// The table.
        table: String,
        /// How long it was waited for.
        waited: Duration,
    },
}

/// What a DynamoDB table of window counts is made of, for [`TableError::Missing`].
pub const DYNAMODB_SHAPE: &str = "partition key `shard` S, sort key `window_start` S";

/// Which item named the other application.
fn named_by(shard: Option<&ShardId>) -> String {
    match shard {
        Some(shard) => format!(" (the position item of shard {shard})"),
        None => " (its `#application` item)".to_owned(),
    }
}

/// Why a commit of windows did not apply.
#[derive(Debug, thiserror::Error)]
pub enum CommitFailed {
    /// The checkpointer's error ([`CheckpointError::LeaseLost`] among them).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The table is at fault (gone, another application's), as read after the checkpointer's
    /// error.
    #[error("{table}")]
    Table {
        /// What is wrong with the table.
        table: TableError,
        /// The checkpointer's error.
        #[source]
        source: CheckpointError,
    },
}
