//! One attempt of a commit, on one connection: `BEGIN`, the tenure's condition first, the
//! processor's statements in order, `COMMIT`; and what each failure means. The one code path
//! of both ways to commit (the lease row in Postgres, or a sink's own position row).
//!
//! - **The condition comes first**, before any statement of the processor's: it locks the
//!   row (the lease row's `UPDATE`, the position row's `SELECT … FOR UPDATE`), so a zombie
//!   stops there without running a statement, and two commits of one shard take turns.
//! - **The statements are pipelined**: every statement is sent before the first answer is
//!   read, so a commit of a thousand costs a round trip or two, not a thousand. They still
//!   run one after another, in order: the first that fails is the write at fault (those
//!   after it only say the transaction was aborted).
//! - **What a failure means** is decided once, by [`Fault`]: a write's own condition is
//!   [`CommitError::Refused`] naming it, a value that cannot be written is
//!   [`CommitError::Invalid`] naming it, anything else is the store's error with the kind
//!   of any call (a missing table or privilege is an outage, never a record given up).
//!   A value whose type the statement does not take, a count of values that does not
//!   match, or a statement naming kcl's own tables is found before anything is sent: the
//!   same for every record (a bug), a fatal store error that stalls the shard rather than
//!   give every record up. Reasons carry the server's message and
//!   SQLSTATE, never a value bound (see [`describe_write`]).
//! - **A constraint checked at `COMMIT`** (declared `DEFERRABLE INITIALLY DEFERRED`) names
//!   no statement: the commit is [`CommitError::Invalid`] without an index, and the core
//!   commits its records one at a time to find the one at fault.

use std::collections::{HashMap, HashSet};

use bytes::BytesMut;
use deadpool_postgres::Transaction;
use futures_util::future::join_all;
use kcl_core::BackendError;
use kcl_core::outputs::CommitError;
use tokio_postgres::types::WrongType;
use tokio_postgres::{Row, Statement};

use super::Sql;
use crate::call::{Lent, Params};
use crate::error::{Cause, Fault, Subject, backend_error, describe, describe_write};

/// The operation named in errors.
pub(crate) const OPERATION: &str = "commit_outputs";

/// Prepared statements a connection keeps before its cache is emptied: statements built
/// with their values in the text would otherwise grow it for ever.
const CACHED_STATEMENTS: usize = 256;

/// A failed attempt: the commit's error, and whether its connection is to be closed.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: CommitError,
    pub(crate) close: bool,
}

impl Failed {
    /// A definite answer on a sound connection (the transaction is rolled back as it drops).
    pub(crate) fn definite(error: CommitError) -> Self {
        Self {
            error,
            close: false,
        }
    }

    /// The store's error, a fatal one.
    pub(crate) fn fatal(subject: Subject<'_>, what: &str) -> Self {
        let message = format!("{subject}: {what}");
        let error = BackendError::new(kcl_core::ErrorKind::Fatal, OPERATION, message);
        Self::definite(CommitError::Store(error))
    }
}

/// Gives the connection back to the pool unless the attempt left it unsound, and returns
/// the attempt's outcome.
pub(crate) fn settle(conn: Lent, outcome: Result<(), Failed>) -> Result<(), CommitError> {
    match outcome {
        Ok(()) => {
            conn.give_back();
            Ok(())
        }
        Err(failed) => {
            if !failed.close {
                conn.give_back();
            }
            Err(failed.error)
        }
    }
}

/// The transaction of one attempt of a commit.
pub(crate) struct Txn<'a> {
    tx: Transaction<'a>,
    subject: Subject<'a>,
}

impl<'a> Txn<'a> {
    /// `BEGIN` on `conn`.
    pub(crate) async fn begin(conn: &'a mut Lent, subject: Subject<'a>) -> Result<Self, Failed> {
        match conn.transaction().await {
            Ok(tx) => Ok(Self { tx, subject }),
            Err(e) => Err(own_failed(subject, e)),
        }
    }

    /// One of kcl's own statements (the condition, the position's update): a failure is
    /// the store's.
    pub(crate) async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, Failed> {
        let result = match self.tx.prepare_cached(sql).await {
            Ok(statement) => self.tx.query(&statement, params).await,
            Err(e) => Err(e),
        };
        result.map_err(|e| own_failed(self.subject, e))
    }

    /// As [`query`](Self::query), for a statement that returns no rows: how many it wrote.
    pub(crate) async fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, Failed> {
        let result = match self.tx.prepare_cached(sql).await {
            Ok(statement) => self.tx.execute(&statement, params).await,
            Err(e) => Err(e),
        };
        result.map_err(|e| own_failed(self.subject, e))
    }

    /// The processor's statements, in order (see the module docs).
    pub(crate) async fn run(&self, writes: &[Sql]) -> Result<(), Failed> {
        if let Some(index) = writes.iter().position(Sql::names_kcl_tables) {
            return Err(bug(
                index,
                "it names kcl's own table (kcl_leases, kcl_positions): the checkpoint is \
                 kcl's to write",
            ));
        }
        let statements = self.prepare(writes).await?;
        check_values(writes, &statements)?;
        let values: Vec<_> = writes.iter().map(Sql::params).collect();
        let sent = statements
            .iter()
            .zip(&values)
            .map(|(statement, values)| self.tx.execute(statement, values));
        for (index, result) in join_all(sent).await.into_iter().enumerate() {
            if let Err(e) = result {
                return Err(self.write_failed(index, &e));
            }
        }
        Ok(())
    }

    /// `COMMIT`. A constraint checked now names no write.
    pub(crate) async fn commit(self) -> Result<(), Failed> {
        let subject = self.subject;
        let Err(e) = self.tx.commit().await else {
            return Ok(());
        };
        match Fault::of(&e) {
            Fault::Refused | Fault::Invalid => {
                let reason = format!("at COMMIT: {}", describe_write(&e));
                let error = CommitError::Invalid {
                    index: None,
                    reason,
                };
                Err(Failed::definite(error))
            }
            Fault::Store(cause) => Err(store_failed(subject, cause, &describe_write(&e))),
        }
    }

    /// Each write's statement, prepared once per text from the connection's cache (the
    /// texts not cached yet prepared together, pipelined). A statement the server cannot
    /// prepare fails the first write that has it.
    async fn prepare(&self, writes: &[Sql]) -> Result<Vec<Statement>, Failed> {
        if self.tx.statement_cache.size() > CACHED_STATEMENTS {
            self.tx.statement_cache.clear();
        }
        // Each text once, with the first write that has it.
        let mut seen = HashSet::new();
        let texts: Vec<(&str, usize)> = (writes.iter().enumerate())
            .filter(|(_, w)| seen.insert(w.statement()))
            .map(|(index, w)| (w.statement(), index))
            .collect();
        let prepared = join_all(texts.iter().map(|(t, _)| self.tx.prepare_cached(t))).await;
        let mut by_text = HashMap::with_capacity(texts.len());
        for ((text, first), result) in texts.into_iter().zip(prepared) {
            match result {
                Ok(statement) => {
                    by_text.insert(text, statement);
                }
                // The first text that failed, in the order sent: the others only found the
                // transaction aborted.
                Err(e) => return Err(self.write_failed(first, &e)),
            }
        }
        Ok(writes
            .iter()
            .filter_map(|w| by_text.get(w.statement()).cloned())
            .collect())
    }

    /// Write `index`'s statement failed with `error`.
    fn write_failed(&self, index: usize, error: &tokio_postgres::Error) -> Failed {
        let reason = describe_write(error);
        match Fault::of(error) {
            Fault::Refused => Failed::definite(CommitError::Refused { index, reason }),
            Fault::Invalid => Failed::definite(CommitError::Invalid {
                index: Some(index),
                reason,
            }),
            Fault::Store(cause) => store_failed(
                self.subject,
                cause,
                &format!("output write {index}: {reason}"),
            ),
        }
    }
}

/// A statement of kcl's own failed: the store's error, with the error as its source.
fn own_failed(subject: Subject<'_>, e: tokio_postgres::Error) -> Failed {
    let (cause, detail) = (Cause::of(&e), describe(&e));
    let (error, close) = backend_error(OPERATION, subject, cause, &detail, e);
    Failed {
        error: CommitError::Store(error),
        close,
    }
}

/// A statement of the processor's failed, not by its own fault: the store's error, without
/// the error as its source (its detail may show the values).
fn store_failed(subject: Subject<'_>, cause: Cause, what: &str) -> Failed {
    let (kind, close, _) = cause.decide();
    let error = BackendError::new(kind, OPERATION, format!("{subject}: {what}"));
    Failed {
        error: CommitError::Store(error),
        close,
    }
}

/// Refuses as invalid, before anything is sent, the first write whose values do not fit its
/// statement: another count than its parameters, or a value of a type the parameter does
/// not take (tokio-postgres would find either only while sending, as an error that is no
/// server's answer).
fn check_values(writes: &[Sql], statements: &[Statement]) -> Result<(), Failed> {
    let mut scratch = BytesMut::new();
    for (index, (write, statement)) in writes.iter().zip(statements).enumerate() {
        let types = statement.params();
        if types.len() != write.param_count() {
            let count = format!(
                "the statement takes {} values, {} were bound",
                types.len(),
                write.param_count()
            );
            return Err(bug(index, &count));
        }
        for (n, (value, ty)) in write.params().into_iter().zip(types).enumerate() {
            scratch.clear();
            if let Err(e) = value.to_sql_checked(ty, &mut scratch) {
                // A Rust type the column does not take is the code's; a value that cannot
                // be encoded is the record's.
                if let Some(wrong) = e.downcast_ref::<WrongType>() {
                    return Err(bug(index, &format!("value ${}: {wrong}", n + 1)));
                }
                let reason = format!("value ${}: it cannot be sent as {ty}", n + 1);
                let index = Some(index);
                return Err(Failed::definite(CommitError::Invalid { index, reason }));
            }
        }
    }
    Ok(())
}

/// Write `index` is wrong for every record (`why`): the code's bug, the store's fatal error
/// (the shard stalls for a fix; no record is given up for it).
fn bug(index: usize, why: &str) -> Failed {
    let what = format!("output write {index} cannot run as written: {why}");
    Failed::definite(CommitError::Store(BackendError::new(
        kcl_core::ErrorKind::Fatal,
        OPERATION,
        what,
    )))
}
