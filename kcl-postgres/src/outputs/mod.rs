//! Exactly-once outputs into Postgres: a processor's SQL statements ([`Sql`]) commit in one
//! transaction with the checkpoint of the records they are outputs of, fenced by the lease
//! (the protocol, and why its condition is the owner, the fence and the checkpoint before,
//! never the counter: `kcl_core::outputs`).
//!
//! Two ways, by where the leases live:
//! - **Leases in Postgres too** ([`PostgresLeaseStore`](crate::PostgresLeaseStore) is
//!   [`Transact`](kcl_core::outputs::Transact)): the transaction updates the lease row's
//!   checkpoint, conditioned on the tenure, and runs the statements. One database, one
//!   transaction, nothing else to set up.
//! - **Leases elsewhere** (DynamoDB): [`PostgresSink`] keeps each shard's position in a
//!   table of its own, `kcl_positions`, beside the outputs, and the worker fences it for each
//!   tenure before the processor starts
//!   ([`WorkerBuilder::positions`](kcl_core::WorkerBuilder::positions)); the lease row's
//!   checkpoint follows each commit (`kcl_core::outputs::Positions`).
//!
//! Both run a commit the same way (`run`): the tenure's condition first, locking its row,
//! then the statements in order, pipelined, then `COMMIT`; a statement refused by its own
//! condition fails its record, as does one whose values cannot be written; a statement
//! wrong for every record (class 42: a column not migrated yet, a syntax error), a missing
//! table or privilege, a lost connection or a serialization failure is the store's error
//! and fails no record.
//!
//! **How much one transaction holds** ([`COMMIT_LIMITS`]): Postgres has no limit on a
//! transaction's statements, but a transaction holds the row locks of everything it wrote,
//! the lease row's among them, until it ends, and the worker bounds each commit by its
//! `call_timeout` (15 s by default): a stretch too long to finish within it would be cut off,
//! rolled back and tried again for ever. So a commit holds at most 2,000 statements and
//! 16 MiB of statement text and values; a longer stretch commits in parts, each with the
//! checkpoint of its last record (the core splits it, a record's writes always together).
//! Pipelined, 2,000 small statements run in tens of milliseconds.
//!
//! **A client gone silent mid-commit** (a partition, a stopped process) would leave its
//! transaction open on the server, holding the lease row's lock (or the position row's):
//! the next holder's take (or open) would wait on it until TCP gave up, hours later. The
//! store's connections set `idle_in_transaction_session_timeout` ([`IDLE_IN_COMMIT`], unless
//! the URL's `options` set one): a commit never waits on its client between statements
//! longer than a round trip, so the server ends such a transaction within seconds (its
//! commit fails, retried if its holder is alive).

mod leases;
mod positions;
mod run;
mod sink;
#[cfg(test)]
mod tests;
mod write;

pub use self::sink::{PostgresSink, PostgresSinkBuilder};
pub use self::write::Sql;

use std::time::Duration;

use kcl_core::outputs::{Commit, Limits, Measure};
use kcl_core::{Checkpoint, CheckpointUpdate, FencingToken, ShardId, WorkerId};

/// What one commit into Postgres holds at most: 2,000 statements, 16 MiB of statement text
/// and values (as [`Transact::measure`](kcl_core::outputs::Transact::measure) counts them).
/// See the module docs for why a limit at all.
pub const COMMIT_LIMITS: Limits = Limits {
    writes: 2_000,
    bytes: 16 * 1024 * 1024,
};

/// How long the server lets a transaction of the store's wait on its client before it ends
/// it (`idle_in_transaction_session_timeout`; see the module docs).
pub(crate) const IDLE_IN_COMMIT: Duration = Duration::from_secs(5);

/// What a write weighs: its statement and values; no item, since one transaction may write
/// one row twice.
fn measure(write: &Sql) -> Measure {
    Measure {
        bytes: write.bytes(),
        item: None,
    }
}

/// What a commit's transaction uses of kcl-core's [`Commit`] (which only kcl-core builds: the
/// tests here make these directly).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) shard: &'a ShardId,
    pub(crate) owner: &'a WorkerId,
    pub(crate) fence: FencingToken,
    pub(crate) before: &'a Checkpoint,
    pub(crate) update: &'a CheckpointUpdate,
    pub(crate) writes: &'a [Sql],
}

impl<'a> Request<'a> {
    /// The parts of `commit`.
    pub(crate) fn of(commit: &'a Commit<'a, Sql>) -> Self {
        Self {
            shard: commit.shard,
            owner: commit.owner,
            fence: commit.fence,
            before: commit.before,
            update: commit.update,
            writes: &commit.writes,
        }
    }
}
