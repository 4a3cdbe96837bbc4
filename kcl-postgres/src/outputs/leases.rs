//! [`Transact`] for [`PostgresLeaseStore`]: leases and outputs in one database, so a
//! processor's statements and the checkpoint commit in one transaction.
//!
//! The transaction (see `run`): `UPDATE kcl_leases SET <the checkpoint's writes>` on the
//! tenure's owner, fence and checkpoint before, never the counter; no row matched is
//! [`CommitError::LeaseRow`], and nothing of the processor's ran. Then its statements, then
//! `COMMIT`.
//!
//! Postgres keeps no idempotency token: a commit whose answer was lost (the connection broke
//! during `COMMIT`) is retried by the core with the same checkpoint before. Its `UPDATE`
//! waits on the row lock while the first attempt's transaction is still open on the server,
//! then finds the checkpoint moved if that attempt committed ([`CommitError::LeaseRow`]: the
//! core reads the row, finds this tenure at the commit's checkpoint, and takes the commit as
//! applied), or applies if it did not.

use kcl_core::lease::usage::Operation;
use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Transact};
use tokio_postgres::types::ToSql;

use super::run::{Failed, Txn, settle};
use super::{Request, Sql};
use crate::PostgresLeaseStore;
use crate::call::Lent;
use crate::error::Subject;
use crate::schema::{CheckpointParams, signed};
use crate::sql;

/// The values of `sql::COMMIT` but the application and the key.
struct LeaseRow {
    owner: String,
    fence: i64,
    writes: CheckpointParams,
    before: String,
    before_sub: i64,
}

impl LeaseRow {
    fn new(commit: Request<'_>, subject: Subject<'_>) -> Result<Self, Failed> {
        let range = |e: crate::schema::OutOfRange| Failed::fatal(subject, &e.to_string());
        Ok(Self {
            owner: commit.owner.as_str().to_owned(),
            fence: signed("fence", commit.fence.0).map_err(range)?,
            // The holder's load is the renewer's to write: left as it is.
            writes: CheckpointParams::new(commit.update, None).map_err(range)?,
            before: commit.before.as_str().to_owned(),
            before_sub: signed("sub-sequence number", commit.before.sub_sequence())
                .map_err(range)?,
        })
    }
}

impl Transact for PostgresLeaseStore {
    type Write = Sql;

    /// [`super::COMMIT_LIMITS`]: a SQL transaction has no limit of its own, but a part must end
    /// well within the worker's `call_timeout`.
    fn limits(&self) -> Limits {
        super::COMMIT_LIMITS
    }

    /// The statement's length and its values' rough size; no item (a transaction may write
    /// one row twice).
    fn measure(&self, write: &Sql) -> Measure {
        super::measure(write)
    }

    async fn commit(&self, commit: Commit<'_, Sql>) -> Result<(), CommitError> {
        self.transact(Request::of(&commit)).await
    }
}

impl PostgresLeaseStore {
    /// [`Transact::commit`] of `commit`.
    pub(crate) async fn transact(&self, commit: Request<'_>) -> Result<(), CommitError> {
        let subject = self.subject(Some(commit.shard));
        let row = LeaseRow::new(commit, subject).map_err(|f| f.error)?;
        let mut conn = self.lend(super::run::OPERATION, Some(commit.shard)).await?;
        let outcome = self.attempt(&mut conn, commit, &row).await;
        self.count(Operation::CommitOutputs, 0);
        settle(conn, outcome)
    }

    /// One attempt: the lease row's update first, then the statements, then `COMMIT`.
    async fn attempt(
        &self,
        conn: &mut Lent,
        commit: Request<'_>,
        row: &LeaseRow,
    ) -> Result<(), Failed> {
        let txn = Txn::begin(conn, self.subject(Some(commit.shard))).await?;
        let (app, key) = (&*self.application, commit.shard.as_str());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&app, &key, &row.owner, &row.fence];
        params.extend(row.writes.values());
        params.push(&row.before);
        params.push(&row.before_sub);
        if txn.execute(sql::COMMIT, &params).await? == 0 {
            // Rolled back as the transaction drops; nothing of the processor's ran.
            return Err(Failed::definite(CommitError::LeaseRow));
        }
        txn.run(commit.writes).await?;
        txn.commit().await
    }
}
