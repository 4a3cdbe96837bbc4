//! [`Positions`] and [`Transact`] for [`PostgresSink`]: the rules of
//! `kcl_core::outputs::Positions` in SQL (see the sink's docs and `schema.sql`).
//!
//! What decides a commit is one pure function of the locked row ([`decide`]), the same rules
//! as kcl-core's `MemoryPositionSink`, so that the simulation's model and this sink agree:
//! the row must name the committing tenure (equality, not an order of fences), and its
//! position must be at or before the commit's checkpoint before; a row already at the
//! commit's checkpoint is that commit, applied by an attempt whose answer was lost.

use std::cmp::Ordering;
use std::sync::atomic::Ordering as Atomic;

use kcl_core::outputs::{Commit, CommitError, Limits, Measure, Positions, Transact};
use kcl_core::{BackendError, Checkpoint, ErrorKind, FencingToken, ShardId, WorkerId};
use tokio_postgres::Row;

use super::run::{Failed, OPERATION, Txn, settle};
use super::{PostgresSink, Request, Sql};
use crate::call::{Lent, Params};
use crate::error::{Cause, backend_error, describe};
use crate::schema::signed;
use crate::sql;

/// The operation named in an open's errors.
const OPEN: &str = "open_positions";

/// A shard's row as a commit found it, locked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owner: String,
    fence: i64,
    position: Option<Checkpoint>,
}

/// What a commit does with the row it locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// The row names another tenure, or there is none: refused, counted.
    FencedOff,
    /// The row is at the commit's checkpoint: applied earlier, nothing to do.
    Applied,
    /// The row is past the commit's checkpoint before: refused.
    Ahead,
    /// Run the statements and move the position.
    Apply,
}

/// The rules (see the module docs).
fn decide(
    row: Option<&Held>,
    owner: &str,
    fence: i64,
    before: &Checkpoint,
    checkpoint: &Checkpoint,
) -> Decision {
    let Some(row) = row.filter(|r| r.owner == owner && r.fence == fence) else {
        return Decision::FencedOff;
    };
    let Some(position) = &row.position else {
        return Decision::Apply;
    };
    if position == checkpoint {
        return Decision::Applied;
    }
    match position.progress_cmp(before) {
        Some(Ordering::Less | Ordering::Equal) => Decision::Apply,
        _ => Decision::Ahead,
    }
}

/// The position of a row read with its `checkpoint` and `checkpoint_sub` columns.
fn position(row: &Row) -> Result<Option<Checkpoint>, String> {
    let value: Option<String> = row.try_get("checkpoint").map_err(|e| e.to_string())?;
    let sub: i64 = row.try_get("checkpoint_sub").map_err(|e| e.to_string())?;
    let Some(value) = value else {
        return Ok(None);
    };
    let sub = u64::try_from(sub).map_err(|_| format!("checkpoint_sub {sub} is negative"))?;
    Checkpoint::parse(&value, sub)
        .map(Some)
        .ok_or_else(|| format!("checkpoint {value:?} is no checkpoint"))
}

/// The locked row, as [`decide`] reads it.
fn held(row: &Row) -> Result<Held, String> {
    Ok(Held {
        owner: row.try_get("owner").map_err(|e| e.to_string())?,
        fence: row.try_get("fence").map_err(|e| e.to_string())?,
        position: position(row)?,
    })
}

impl PostgresSink {
    /// The tenure's fence as stored.
    fn fence(
        &self,
        shard: &ShardId,
        fence: FencingToken,
        operation: &'static str,
    ) -> Result<i64, BackendError> {
        signed("fence", fence.0).map_err(|e| {
            let subject = self.store.subject(Some(shard));
            BackendError::new(ErrorKind::Fatal, operation, format!("{subject}: {e}"))
        })
    }

    /// The open's statement on `conn`: the row's position, or the error and whether the
    /// connection is to be closed.
    async fn hand_over(
        &self,
        conn: &mut Lent,
        shard: &ShardId,
        params: Params<'_>,
    ) -> Result<Option<Checkpoint>, (BackendError, bool)> {
        let result = match conn.prepare_cached(sql::OPEN_POSITION).await {
            Ok(statement) => conn.query_one(&statement, params).await,
            Err(e) => Err(e),
        };
        let subject = self.store.subject(Some(shard));
        let row = result.map_err(|e| {
            let (cause, detail) = (Cause::of(&e), describe(&e));
            backend_error(OPEN, subject, cause, &detail, e)
        })?;
        position(&row).map_err(|reason| {
            let what = format!("{subject}: the position cannot be read: {reason}");
            (BackendError::new(ErrorKind::Fatal, OPEN, what), false)
        })
    }

    /// One attempt of a commit: the row locked and checked, the statements, the position.
    async fn attempt(
        &self,
        conn: &mut Lent,
        commit: Request<'_>,
        fence: i64,
    ) -> Result<(), Failed> {
        let subject = self.store.subject(Some(commit.shard));
        let txn = Txn::begin(conn, subject).await?;
        let (app, key) = (self.application(), commit.shard.as_str());
        let rows = txn.query(sql::LOCK_POSITION, &[&app, &key]).await?;
        let row = match rows.first().map(held).transpose() {
            Ok(row) => row,
            Err(reason) => {
                return Err(Failed::fatal(
                    subject,
                    &format!("the row cannot be read: {reason}"),
                ));
            }
        };
        let checkpoint = &commit.update.checkpoint;
        let owner = commit.owner.as_str();
        match decide(row.as_ref(), owner, fence, commit.before, checkpoint) {
            Decision::FencedOff => {
                self.counts.fenced_off.fetch_add(1, Atomic::Relaxed);
                tracing::debug!(shard = %commit.shard, %owner, fence, "a commit of a tenure the sink no longer names was refused");
                return Err(Failed::definite(CommitError::LeaseRow));
            }
            Decision::Applied => return Ok(()),
            Decision::Ahead => return Err(Failed::definite(CommitError::LeaseRow)),
            Decision::Apply => {}
        }
        txn.run(commit.writes).await?;
        let sub = signed("sub-sequence number", checkpoint.sub_sequence())
            .map_err(|e| Failed::fatal(subject, &e.to_string()))?;
        let params: Params<'_> = &[&app, &key, &checkpoint.as_str(), &sub];
        txn.execute(sql::ADVANCE_POSITION, params).await?;
        txn.commit().await
    }
}

impl Positions for PostgresSink {
    /// One `INSERT … ON CONFLICT DO UPDATE … RETURNING` (see [`PostgresSink`]).
    async fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> Result<Option<Checkpoint>, BackendError> {
        let fence = self.fence(shard, fence, OPEN)?;
        let mut conn = self.store.lend(OPEN, Some(shard)).await?;
        let (app, key) = (self.application(), shard.as_str());
        let params: Params<'_> = &[&app, &key, &owner.as_str(), &fence];
        match self.hand_over(&mut conn, shard, params).await {
            Ok(position) => {
                conn.give_back();
                Ok(position)
            }
            Err((error, close)) => {
                if !close {
                    conn.give_back();
                }
                Err(error)
            }
        }
    }
}

impl Transact for PostgresSink {
    type Write = Sql;

    /// [`LIMITS`](super::COMMIT_LIMITS), as the lease store's.
    fn limits(&self) -> Limits {
        super::COMMIT_LIMITS
    }

    /// As the lease store's: the statement and its values, no item.
    fn measure(&self, write: &Sql) -> Measure {
        super::measure(write)
    }

    /// True: the sink keeps each shard's position, and the lease row's checkpoint follows.
    fn keeps_position(&self) -> bool {
        true
    }

    async fn commit(&self, commit: Commit<'_, Sql>) -> Result<(), CommitError> {
        self.transact(Request::of(&commit)).await
    }
}

impl PostgresSink {
    /// [`Transact::commit`] of `commit`.
    pub(crate) async fn transact(&self, commit: Request<'_>) -> Result<(), CommitError> {
        let fence = self.fence(commit.shard, commit.fence, OPERATION)?;
        let mut conn = self.store.lend(OPERATION, Some(commit.shard)).await?;
        let outcome = self.attempt(&mut conn, commit, fence).await;
        settle(conn, outcome)
    }
}

#[cfg(test)]
mod tests {
    use kcl_core::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

    use super::{Decision, Held, decide};

    fn at(n: u128) -> Checkpoint {
        Checkpoint::Sequence(ExtendedSequenceNumber::new(SequenceNumber::from(n)))
    }

    fn row(owner: &str, fence: i64, position: Option<Checkpoint>) -> Held {
        Held {
            owner: owner.to_owned(),
            fence,
            position,
        }
    }

    #[test]
    fn a_commit_applies_only_in_the_tenure_the_row_names() {
        let (before, to) = (at(100), at(200));
        let ours = row("w", 7, Some(at(100)));
        assert_eq!(decide(Some(&ours), "w", 7, &before, &to), Decision::Apply);
        assert_eq!(
            decide(Some(&ours), "v", 7, &before, &to),
            Decision::FencedOff
        );
        assert_eq!(
            decide(Some(&ours), "w", 6, &before, &to),
            Decision::FencedOff
        );
        assert_eq!(
            decide(Some(&ours), "w", 8, &before, &to),
            Decision::FencedOff
        );
        assert_eq!(decide(None, "w", 7, &before, &to), Decision::FencedOff);
    }

    #[test]
    fn the_position_decides_between_applied_ahead_and_behind() {
        let (before, to) = (at(100), at(200));
        let decided = |p| decide(Some(&row("w", 7, p)), "w", 7, &before, &to);
        assert_eq!(decided(None), Decision::Apply, "no commit yet");
        assert_eq!(
            decided(Some(at(50))),
            Decision::Apply,
            "the lease moved alone"
        );
        assert_eq!(decided(Some(at(200))), Decision::Applied, "a lost answer");
        assert_eq!(decided(Some(at(150))), Decision::Ahead);
        assert_eq!(decided(Some(Checkpoint::ShardEnd)), Decision::Ahead);
        let from_start = decide(
            Some(&row("w", 7, None)),
            "w",
            7,
            &Checkpoint::TrimHorizon,
            &to,
        );
        assert_eq!(from_start, Decision::Apply);
    }
}
