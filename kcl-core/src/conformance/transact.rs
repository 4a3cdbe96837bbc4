//! Checks of a store's exactly-once commits ([`Transact`]): a processor's writes and the
//! checkpoint in one transaction, conditioned on the owner, the fence and the checkpoint
//! before, never the counter (see [`outputs`](crate::outputs)).

use std::future::Future;

use super::support::{
    Answer, at, ensure, ensure_eq, parked, put, refused, row, same, shard, table, unchanged, worker,
};
use super::{Failure, not_applicable};
use crate::error::{BoxError, ErrorKind};
use crate::lease::{CheckpointUpdate, Lease, LeaseStore};
use crate::outputs::{Commit, CommitError, Transact};
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

/// What the commit checks need of a store beyond [`Transact`]: writes of its own kind to an
/// output table of the fixture's (made fresh with the store), and a way to read them back.
pub trait TransactFixture: Send + Sync {
    /// The store, a [`LeaseStore`] that commits outputs.
    type Store: LeaseStore + Transact;

    /// The store, with a fresh, empty lease table and output table.
    fn store(&self) -> &Self::Store;

    /// A write adding one to output item `item`'s count, creating the item if absent (not
    /// idempotent: applied twice, it counts 2).
    fn add(&self, item: &str) -> <Self::Store as Transact>::Write;

    /// A write creating output item `item` with a count of 0, refused by its own condition
    /// if the item exists.
    fn create(&self, item: &str) -> <Self::Store as Transact>::Write;

    /// Output item `item`'s count, or `None` if it does not exist.
    fn item(&self, item: &str) -> impl Future<Output = Result<Option<i64>, BoxError>> + Send;

    /// Whether the store keeps idempotency tokens (DynamoDB does for 10 minutes, moto does
    /// not): a retry of an applied commit then succeeds, and a token used by another commit
    /// is refused.
    fn keeps_tokens(&self) -> bool;
}

/// One commit call, kept whole so that it can be sent again (a retry) with its token.
#[derive(Debug)]
struct Call<W> {
    shard: ShardId,
    owner: WorkerId,
    fence: FencingToken,
    before: Checkpoint,
    update: CheckpointUpdate,
    writes: Vec<W>,
    token: String,
}

impl<W: Clone + Send + Sync + 'static> Call<W> {
    /// A commit by `row`'s tenure from its checkpoint to `to`.
    fn new(row: &Lease, to: Checkpoint, writes: Vec<W>) -> Self {
        let fence = row.fence.unwrap_or(FencingToken(0));
        let update = CheckpointUpdate::new(to);
        let token = crate::lease::transact::token(&row.key, fence, &row.checkpoint, &update);
        Self {
            shard: row.key.clone(),
            owner: row.owner.clone().unwrap_or_else(|| worker("w")),
            fence,
            before: row.checkpoint.clone(),
            update,
            writes,
            token,
        }
    }

    async fn send<S: Transact<Write = W>>(&self, store: &S) -> Result<(), CommitError> {
        store.prepare(&self.writes.iter().collect::<Vec<_>>()).await;
        let commit = Commit {
            shard: &self.shard,
            owner: &self.owner,
            fence: self.fence,
            before: &self.before,
            update: &self.update,
            writes: self.writes.clone(),
            token: self.token.clone(),
        };
        store.commit(commit).await
    }
}

/// Sends `call`, which must apply.
async fn applied<S: Transact>(store: &S, call: &Call<S::Write>, what: &str) -> Result<(), Failure> {
    call.send(store).await.map_err(|source| Failure::Commit {
        what: what.to_owned(),
        source,
    })
}

/// Fails unless `result` is the lease row's refusal.
fn lease_row(result: Result<(), CommitError>, what: &str) -> Result<(), Failure> {
    match result {
        Err(CommitError::LeaseRow) => Ok(()),
        other => Err(Failure::contract(format!(
            "{what}: expected CommitError::LeaseRow, got {other:?}"
        ))),
    }
}

/// Output item `name` as the fixture reads it.
async fn item(fixture: &impl TransactFixture, name: &str) -> Result<Option<i64>, Failure> {
    fixture.item(name).await.map_err(|source| Failure::Fixture {
        what: format!("read output item {name}"),
        source,
    })
}

/// Fails unless each item has its count (`None`: absent).
async fn items(
    fixture: &impl TransactFixture,
    expected: &[(&str, Option<i64>)],
) -> Result<(), Failure> {
    for (name, count) in expected {
        ensure_eq(
            item(fixture, name).await?,
            *count,
            &format!("output item {name}"),
        )?;
    }
    Ok(())
}

/// A row of shard `n` at a sequence checkpoint, taken by worker `w`: a tenure to commit in.
async fn tenure(store: &impl LeaseStore, n: u32) -> Result<Lease, Failure> {
    table(store).await?;
    let free = put(store, &Lease::new(shard(n), at(100, 0))).await?;
    store.take(&free, &worker("w")).await.or_fail("take")
}

/// A commit writes its outputs and the checkpoint together, resets the owner switches and
/// leaves the counter, so that the holder's next renewal, conditioned on the counter it
/// holds, still succeeds.
pub async fn commit_writes_outputs_and_checkpoint_and_leaves_the_counter(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let call = Call::new(&held, at(200, 0), vec![fixture.add("x"), fixture.add("y")]);
    applied(store, &call, "commit").await?;
    items(fixture, &[("x", Some(1)), ("y", Some(1))]).await?;
    let mut expected = held.clone();
    expected.checkpoint = at(200, 0);
    expected.owner_switches_since_checkpoint = 0;
    same(
        &row(store, &held.key).await?,
        &expected,
        "the row after commit",
    )?;
    let renewed = store
        .renew(&held)
        .await
        .or_fail("the holder's renewal after a commit")?;
    expected.counter += 1;
    same(&renewed, &expected, "the row the renewal answers")
}

/// A commit is not conditioned on the counter: renewals between the holder's read and its
/// commit do not refuse it, and the commit leaves the counter they wrote.
pub async fn commit_ignores_the_counter(fixture: &impl TransactFixture) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let once = store.renew(&held).await.or_fail("renew")?;
    let twice = store.renew(&once).await.or_fail("renew again")?;
    let call = Call::new(&held, at(200, 0), vec![fixture.add("x")]);
    applied(store, &call, "commit after two renewals").await?;
    let mut expected = twice.clone();
    expected.checkpoint = at(200, 0);
    expected.owner_switches_since_checkpoint = 0;
    same(
        &row(store, &held.key).await?,
        &expected,
        "the row after commit",
    )?;
    items(fixture, &[("x", Some(1))]).await
}

/// A commit applies only while the row holds its owner, its fence and its checkpoint
/// before; otherwise it is refused as [`CommitError::LeaseRow`] and nothing of it applies:
/// another owner, another fence (a later tenure of the same worker too), another
/// checkpoint, a row that is gone.
pub async fn commit_is_refused_unless_owner_fence_and_checkpoint_hold(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let to = at(200, 0);
    let writes = || vec![fixture.add("x")];
    let mut calls = Vec::new();
    let mut other = Call::new(&held, to.clone(), writes());
    other.owner = worker("z");
    calls.push(("another owner", other));
    for (what, fence) in [("a later fence", 1), ("an earlier fence", -1)] {
        let mut call = Call::new(&held, to.clone(), writes());
        call.fence = FencingToken(call.fence.0.saturating_add_signed(fence));
        calls.push((what, call));
    }
    let mut moved = Call::new(&held, to.clone(), writes());
    moved.before = at(101, 0);
    calls.push(("another checkpoint before", moved));
    for (what, call) in &calls {
        let what = format!("commit with {what}");
        lease_row(call.send(store).await, &what)?;
        unchanged(store, &held, &what).await?;
    }
    // The worker lost the lease and took it back: its old tenure's commit is a zombie's.
    let lost = store.take(&held, &worker("v")).await.or_fail("take by v")?;
    let back = store
        .take(&lost, &worker("w"))
        .await
        .or_fail("take back by w")?;
    let zombie = Call::new(&held, to.clone(), writes());
    lease_row(zombie.send(store).await, "commit of an earlier tenure")?;
    unchanged(store, &back, "commit of an earlier tenure").await?;
    let mut gone = Lease::new(shard(9), at(100, 0));
    gone.owner = held.owner.clone();
    gone.fence = held.fence;
    lease_row(
        Call::new(&gone, to, writes()).send(store).await,
        "commit on a missing row",
    )?;
    items(fixture, &[("x", None)]).await
}

/// A write refused by its own condition refuses the whole commit, named by its index in the
/// commit's writes ([`CommitError::Refused`]): nothing applies, the checkpoint stays.
pub async fn commit_names_the_refused_write_by_its_index(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let first = Call::new(&held, at(200, 0), vec![fixture.create("b")]);
    applied(store, &first, "commit creating b").await?;
    let now = row(store, &held.key).await?;
    let writes = vec![fixture.add("a"), fixture.create("b"), fixture.add("c")];
    let second = Call::new(&now, at(300, 0), writes);
    match second.send(store).await {
        Err(CommitError::Refused { index: 1, .. }) => {}
        other => {
            return Err(Failure::contract(format!(
                "a commit creating b again: expected CommitError::Refused {{ index: 1 }}, \
                 got {other:?}"
            )));
        }
    }
    unchanged(store, &now, "the refused commit").await?;
    items(fixture, &[("a", None), ("b", Some(0)), ("c", None)]).await
}

/// A commit writes its update as a checkpoint does (pending checkpoint, `acked`, parked
/// entries) and resets the owner-switch count; owner, fence and counter stay.
pub async fn commit_resets_owner_switches_and_writes_its_update(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    table(store).await?;
    let mut lease = Lease::new(shard(1), at(100, 0));
    lease.owner_switches_since_checkpoint = 2;
    lease.pending_checkpoint = Some(at(120, 0));
    let free = put(store, &lease).await?;
    let held = store.take(&free, &worker("w")).await.or_fail("take")?;
    let mut call = Call::new(&held, at(300, 0), vec![fixture.add("x")]);
    call.update.pending = Some(at(350, 0));
    call.update.acked = Some("2".to_owned());
    call.update.park = vec![parked(5, 299)];
    applied(store, &call, "commit with a full update").await?;
    let mut expected = held.clone();
    expected.checkpoint = at(300, 0);
    expected.pending_checkpoint = Some(at(350, 0));
    expected.acked = Some("2".to_owned());
    expected.parked_keys = vec![parked(5, 299)];
    expected.owner_switches_since_checkpoint = 0;
    same(
        &row(store, &held.key).await?,
        &expected,
        "the row after commit",
    )
}

/// A plain [`checkpoint`](LeaseStore::checkpoint) from the row as it was before a commit
/// holds its owner and counter (the commit left the counter), not its checkpoint: refused,
/// or it would move the row back behind the commit's outputs. One from the row as it is
/// now applies.
pub async fn a_plain_checkpoint_from_before_a_commit_is_refused(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    applied(
        store,
        &Call::new(&held, at(200, 0), vec![fixture.add("x")]),
        "commit",
    )
    .await?;
    let now = row(store, &held.key).await?;
    let stale = CheckpointUpdate::new(at(150, 0));
    let what = "a checkpoint from the row before the commit";
    refused(store.checkpoint(&held, &stale).await, what)?;
    unchanged(store, &now, what).await?;
    let written = store
        .checkpoint(&now, &CheckpointUpdate::new(at(250, 0)))
        .await
        .or_fail("a checkpoint from the row after the commit")?;
    ensure_eq(
        (written.checkpoint, written.counter),
        (at(250, 0), now.counter + 1),
        "checkpoint and counter after it",
    )
}

/// A commit sent again with its token (its answer was lost) never applies twice: a store
/// that keeps tokens answers success, one that does not refuses it on the lease row (its
/// checkpoint before has moved).
pub async fn a_retried_commit_applies_its_writes_once(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let call = Call::new(&held, at(200, 0), vec![fixture.add("x")]);
    applied(store, &call, "commit").await?;
    let after = row(store, &held.key).await?;
    let retried = call.send(store).await;
    if fixture.keeps_tokens() {
        ensure(retried.is_ok(), || {
            format!(
                "a retry of an applied commit with its token: expected success, got {retried:?}"
            )
        })?;
    } else {
        lease_row(retried, "a retry of an applied commit (no tokens kept)")?;
    }
    unchanged(store, &after, "the retry").await?;
    items(fixture, &[("x", Some(1))]).await
}

/// Where the store keeps tokens, another commit under a token already used is refused with
/// a store error that no retry can fix ([`ErrorKind::Fatal`]), and nothing of it applies.
pub async fn a_token_reused_by_another_commit_is_refused(
    fixture: &impl TransactFixture,
) -> Result<(), Failure> {
    if !fixture.keeps_tokens() {
        let why = "the store keeps no idempotency tokens";
        not_applicable("a_token_reused_by_another_commit_is_refused", why);
        return Ok(());
    }
    let store = fixture.store();
    let held = tenure(store, 1).await?;
    let first = Call::new(&held, at(200, 0), vec![fixture.add("x")]);
    applied(store, &first, "commit").await?;
    let now = row(store, &held.key).await?;
    let mut second = Call::new(&now, at(300, 0), vec![fixture.add("y")]);
    second.token.clone_from(&first.token);
    match second.send(store).await {
        Err(CommitError::Store(e)) if e.kind() == ErrorKind::Fatal => {}
        other => {
            return Err(Failure::contract(format!(
                "another commit under a used token: expected a Fatal store error, got {other:?}"
            )));
        }
    }
    unchanged(store, &now, "the commit under a used token").await?;
    items(fixture, &[("x", Some(1)), ("y", None)]).await
}
