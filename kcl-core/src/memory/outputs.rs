//! The in-memory store's side of exactly-once outputs (see [`outputs`](crate::outputs)):
//! an output table shared by every handle of a [`MemoryLeaseStore`], written only by
//! [`Transact::commit`], in one step with the lease row under the table's lock.
//!
//! It exists so that tests and the simulation can see a duplicate and a loss: a write can
//! add to a counter (a record's output committed twice counts 2), and every applied commit
//! is kept with who made it (client, owner, fence), what it wrote and the journal event of
//! its checkpoint, so that a check can replay the outputs against the lease row at every
//! instant. A commit goes through the store's [`Faults`](super::Faults) like every other
//! write: errors, throttling, partitions, freezes, latency, answers lost after it applied,
//! and stragglers that land later if their condition still holds then. A
//! `TransactionConflict` (DynamoDB's cancellation when a transaction races another write
//! of one of its items) can be injected, and the limits made small so that stretches commit
//! in parts.
//!
//! As DynamoDB does with a `ClientRequestToken`, an applied commit's token is remembered for
//! 10 minutes: the same commit again succeeds without applying twice, and another commit
//! under that token is refused (`IdempotentParameterMismatch`, not retryable). A commit
//! that did not apply leaves no token. The row's condition is checked before the writes'
//! own: a commit whose earlier attempt applied fails on the row (its checkpoint moved), not
//! on a write that the attempt made (an "attribute absent" now present).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryLeaseStore;
use super::faults::Fate;
use crate::error::{BackendError, ErrorKind};
use crate::lease::{CheckpointUpdate, Lease};
use crate::mutation::{self, Mutation};
use crate::outputs::{Commit, CommitError, Limits, Measure, Transact};
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

pub(in crate::memory) mod write;

pub use write::{Condition, MemoryWrite, WriteAction};

/// The operation name of a commit, for faults and errors.
const OPERATION: &str = "transact";

/// How long an applied commit's token is remembered by default (DynamoDB's window).
const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(600);

/// An item of the output table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputItem {
    /// Its value, once put.
    pub value: Option<String>,
    /// The sum of what was added to it.
    pub count: i64,
}

/// A commit the store applied.
#[derive(Debug, Clone)]
pub struct AppliedCommit {
    /// The event number of its checkpoint in the [journal](MemoryLeaseStore::journal)
    /// (journaled as a `checkpoint` with the counter unchanged; no event if the row was
    /// absent, which only a commit without its fence applies to).
    pub seq: u64,
    /// When it applied.
    pub at: Instant,
    /// Whether its writer was told (`false`: an answer lost, or a straggler).
    pub reported: bool,
    /// The handle that sent it.
    pub client: String,
    /// The lease's shard.
    pub shard: ShardId,
    /// The holder it was made under.
    pub owner: WorkerId,
    /// The fence it was made under.
    pub fence: FencingToken,
    /// The checkpoint the row held before it.
    pub before: Checkpoint,
    /// The checkpoint it wrote.
    pub checkpoint: Checkpoint,
    /// Its idempotency token.
    pub token: String,
    /// Its writes, in order.
    pub writes: Vec<MemoryWrite>,
}

/// Why the store turned a commit down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The lease row no longer held the commit's owner, fence and checkpoint.
    LeaseRow,
    /// Write `index` failed its own condition.
    Write {
        /// Its index in the commit.
        index: usize,
    },
    /// An injected `TransactionConflict` (retryable).
    Conflict,
    /// The token was used by another commit within the window.
    TokenMismatch,
    /// Refused as invalid (see [`MemoryLeaseStore::refuse_as_invalid`]; also a commit over
    /// the limits or writing one item twice): write `index`, if the store named it.
    Invalid {
        /// Its index in the commit, if named.
        index: Option<usize>,
    },
}

/// A commit the store turned down, nothing of it applied.
#[derive(Debug, Clone)]
pub struct RefusedCommit {
    /// When.
    pub at: Instant,
    /// The handle that sent it.
    pub client: String,
    /// The lease's shard.
    pub shard: ShardId,
    /// The holder it was made under.
    pub owner: WorkerId,
    /// The fence it was made under.
    pub fence: FencingToken,
    /// Why.
    pub reason: Refusal,
    /// Whether its writer was told (`false`: a straggler).
    pub reported: bool,
}

/// Counts of what the output table went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputCounts {
    /// Commits applied.
    pub applied: usize,
    /// Commits refused (conflicts included).
    pub refused: usize,
    /// Injected `TransactionConflict`s.
    pub conflicts: usize,
    /// Commits answered from a remembered token, without applying again.
    pub replays: usize,
}

/// The output table and its settings, kept in the store's table (see the module docs).
#[derive(Debug)]
pub(in crate::memory) struct OutputTable {
    items: BTreeMap<String, OutputItem>,
    applied: Vec<AppliedCommit>,
    refused: Vec<RefusedCommit>,
    /// Applied commits' tokens: when, and a digest of the commit.
    tokens: BTreeMap<String, (Instant, u64)>,
    limits: Limits,
    window: Option<Duration>,
    /// Commits still to cancel with a conflict; every how many commits one is; commits seen.
    conflict_next: u32,
    conflict_every: Option<u32>,
    seen: u64,
    conflicts: usize,
    replays: usize,
    /// Keys whose writes are refused as invalid, and whether the refusal names the write.
    invalid: BTreeMap<String, bool>,
}

impl Default for OutputTable {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            applied: Vec::new(),
            refused: Vec::new(),
            tokens: BTreeMap::new(),
            limits: Limits {
                writes: 100,
                bytes: 4 * 1024 * 1024,
            },
            window: Some(IDEMPOTENCY_WINDOW),
            conflict_next: 0,
            conflict_every: None,
            seen: 0,
            conflicts: 0,
            replays: 0,
            invalid: BTreeMap::new(),
        }
    }
}

/// A commit with everything it needs owned (a straggler applies it after its caller left).
#[derive(Debug, Clone)]
struct Prepared {
    client: String,
    shard: ShardId,
    owner: WorkerId,
    fence: FencingToken,
    before: Checkpoint,
    update: CheckpointUpdate,
    writes: Vec<MemoryWrite>,
    token: String,
    /// What must match for a remembered token to answer it.
    digest: u64,
}

impl Prepared {
    fn new(commit: Commit<'_, MemoryWrite>, client: &str) -> Self {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        commit.shard.as_str().hash(&mut h);
        commit.owner.as_str().hash(&mut h);
        commit.fence.0.hash(&mut h);
        commit.before.to_string().hash(&mut h);
        commit.update.checkpoint.to_string().hash(&mut h);
        commit.writes.hash(&mut h);
        Self {
            client: client.to_owned(),
            shard: commit.shard.clone(),
            owner: commit.owner.clone(),
            fence: commit.fence,
            before: commit.before.clone(),
            update: commit.update.clone(),
            writes: commit.writes,
            token: commit.token,
            digest: h.finish(),
        }
    }
}

impl OutputTable {
    /// Refuses, as DynamoDB's validation does (a `ValidationException`), a commit over the
    /// limits, writing one item twice, or holding a write refused as invalid without naming
    /// it: nothing applied, and the same commit can never apply.
    fn validate(&mut self, p: &Prepared) -> Result<(), CommitError> {
        let bytes: usize = p.writes.iter().map(MemoryWrite::bytes).sum();
        let keys: BTreeSet<&String> = p.writes.iter().map(|w| &w.key).collect();
        let unnamed = (p.writes.iter()).find(|w| self.invalid.get(&w.key) == Some(&false));
        let why = if let Some(write) = unnamed {
            format!("{} is invalid", write.key)
        } else if p.writes.len() > self.limits.writes {
            format!("{} writes, at most {}", p.writes.len(), self.limits.writes)
        } else if bytes > self.limits.bytes {
            format!("{bytes} bytes, at most {}", self.limits.bytes)
        } else if keys.len() < p.writes.len() {
            "two operations on one item".to_owned()
        } else {
            return Ok(());
        };
        self.refuse(p, Refusal::Invalid { index: None }, true);
        Err(CommitError::Invalid {
            index: None,
            reason: format!("ValidationException on {}: {why}", p.shard),
        })
    }

    /// Applies `p` with `row` (see the module docs); returns its answer and whether it wrote
    /// the row.
    fn decide(
        &mut self,
        p: &Prepared,
        row: Option<&mut Lease>,
        seq: u64,
        reported: bool,
    ) -> (Result<(), CommitError>, bool) {
        let now = Instant::now();
        if let Some(answer) = self.remembered(p, now, reported) {
            return (answer, false);
        }
        self.seen += 1;
        let every = self
            .conflict_every
            .is_some_and(|n| self.seen.is_multiple_of(u64::from(n.max(1))));
        if self.conflict_next > 0 || every {
            self.conflict_next = self.conflict_next.saturating_sub(1);
            self.conflicts += 1;
            self.refuse(p, Refusal::Conflict, reported);
            return (Err(CommitError::Store(conflict(&p.shard))), false);
        }
        let holds = row.as_deref().is_some_and(|r| {
            r.owner.as_ref() == Some(&p.owner)
                && r.fence == Some(p.fence)
                && r.checkpoint == p.before
        });
        if !holds && !mutation::on(Mutation::CommitUnfenced) {
            self.refuse(p, Refusal::LeaseRow, reported);
            return (Err(CommitError::LeaseRow), false);
        }
        let named = (p.writes.iter()).position(|w| self.invalid.get(&w.key) == Some(&true));
        if let Some(index) = named {
            self.refuse(p, Refusal::Invalid { index: Some(index) }, reported);
            let reason = format!("ValidationError: {} is invalid", p.writes[index].key);
            let index = Some(index);
            return (Err(CommitError::Invalid { index, reason }), false);
        }
        if let Some((index, reason)) = write::first_refused(&self.items, &p.writes) {
            self.refuse(p, Refusal::Write { index }, reported);
            return (Err(CommitError::Refused { index, reason }), false);
        }
        for write in &p.writes {
            write::apply(&mut self.items, write);
        }
        let wrote = row.map(|r| p.update.apply_to(r)).is_some();
        if self.window.is_some() {
            self.tokens.insert(p.token.clone(), (now, p.digest));
        }
        self.applied.push(AppliedCommit {
            seq,
            at: now,
            reported,
            client: p.client.clone(),
            shard: p.shard.clone(),
            owner: p.owner.clone(),
            fence: p.fence,
            before: p.before.clone(),
            checkpoint: p.update.checkpoint.clone(),
            token: p.token.clone(),
            writes: p.writes.clone(),
        });
        (Ok(()), wrote)
    }

    /// The answer to a commit whose token an applied commit used within the window.
    fn remembered(
        &mut self,
        p: &Prepared,
        now: Instant,
        reported: bool,
    ) -> Option<Result<(), CommitError>> {
        let window = self.window?;
        let (at, digest) = *self.tokens.get(&p.token)?;
        if now.saturating_duration_since(at) >= window {
            self.tokens.remove(&p.token);
            return None;
        }
        if digest == p.digest {
            self.replays += 1;
            return Some(Ok(()));
        }
        self.refuse(p, Refusal::TokenMismatch, reported);
        Some(Err(CommitError::Store(BackendError::new(
            ErrorKind::Fatal,
            OPERATION,
            format!(
                "IdempotentParameterMismatch on {}: token {} was used by another commit",
                p.shard, p.token
            ),
        ))))
    }

    fn refuse(&mut self, p: &Prepared, reason: Refusal, reported: bool) {
        self.refused.push(RefusedCommit {
            at: Instant::now(),
            client: p.client.clone(),
            shard: p.shard.clone(),
            owner: p.owner.clone(),
            fence: p.fence,
            reason,
            reported,
        });
    }
}

/// An injected `TransactionConflict`: nothing applied, retryable.
fn conflict(shard: &ShardId) -> BackendError {
    BackendError::new(
        ErrorKind::Retryable,
        OPERATION,
        format!(
            "injected: TransactionCanceledException [TransactionConflict] on {shard}: \
             another write to one of its items was in progress"
        ),
    )
}

/// The error of a commit that applied, or may still, whose answer did not come back.
fn unanswered(fate: Fate) -> CommitError {
    let error = fate.report::<()>(OPERATION, Ok(())).err();
    CommitError::Store(error.unwrap_or_else(|| {
        BackendError::new(ErrorKind::Retryable, OPERATION, "injected: no answer")
    }))
}

impl Transact for MemoryLeaseStore {
    type Write = MemoryWrite;

    fn limits(&self) -> Limits {
        self.with_outputs(|o| o.limits)
    }

    fn measure(&self, write: &MemoryWrite) -> Measure {
        Measure {
            bytes: write.bytes(),
            item: Some(write.key.clone()),
        }
    }

    async fn commit(&self, commit: Commit<'_, MemoryWrite>) -> Result<(), CommitError> {
        let started = Instant::now();
        let prepared = Prepared::new(commit, self.client_name());
        self.with_outputs(|o| o.validate(&prepared))?;
        let fate = self
            .faults()
            .enter(self.client_name(), OPERATION, true)
            .await?;
        if let Fate::Straggle(delay) = fate {
            // Not a task of the writer's process: it lands even if the writer is frozen.
            let store = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = store.apply_commit(&prepared, started, false);
            });
            return Err(unanswered(fate));
        }
        let result = self.apply_commit(&prepared, started, fate == Fate::Apply);
        // Applied: a caller that gives up while the answer travels back does not undo it.
        let back = self.faults().latency();
        if !back.is_zero() {
            tokio::time::sleep(back).await;
        }
        match (fate, result) {
            (Fate::ApplyThenFail, Ok(())) => Err(unanswered(fate)),
            (_, result) => result,
        }
    }
}

impl MemoryLeaseStore {
    fn apply_commit(
        &self,
        p: &Prepared,
        started: Instant,
        reported: bool,
    ) -> Result<(), CommitError> {
        self.transact_row(&p.shard, started, reported, |row, outputs, seq| {
            outputs.decide(p, row, seq, reported)
        })?
    }

    /// What one commit may hold (default: 100 writes, 4 MiB): small limits make stretches
    /// commit in parts.
    pub fn set_output_limits(&self, limits: Limits) {
        self.with_outputs(|o| o.limits = limits);
    }

    /// How long an applied commit's token is remembered (default 10 minutes, as DynamoDB);
    /// `None`: not at all, so that a retry of an applied commit fails on the row.
    pub fn set_idempotency_window(&self, window: Option<Duration>) {
        self.with_outputs(|o| {
            o.window = window;
            o.tokens.clear();
        });
    }

    /// Commits holding a write to `key` are refused as invalid from now on, as DynamoDB
    /// refuses an item over 400 KB or a malformed number: nothing of them applies, and they
    /// fail with [`CommitError::Invalid`] naming the write's index if `named` (a cancellation
    /// reason `ValidationError`, after the lease row's condition), else not (a request's
    /// `ValidationException`, before anything).
    pub fn refuse_as_invalid(&self, key: impl Into<String>, named: bool) {
        self.with_outputs(|o| o.invalid.insert(key.into(), named));
    }

    /// The next `n` commits are cancelled with a `TransactionConflict` (a retryable error,
    /// nothing applied).
    pub fn inject_conflicts(&self, n: u32) {
        self.with_outputs(|o| o.conflict_next += n);
    }

    /// Every `n`-th commit from now on is cancelled with a `TransactionConflict`; `None`
    /// stops it.
    pub fn conflict_every(&self, n: Option<u32>) {
        self.with_outputs(|o| {
            o.conflict_every = n;
            o.seen = 0;
        });
    }

    /// The output table's items now.
    pub fn outputs(&self) -> BTreeMap<String, OutputItem> {
        self.with_outputs(|o| o.items.clone())
    }

    /// One item of the output table.
    pub fn output(&self, key: &str) -> Option<OutputItem> {
        self.with_outputs(|o| o.items.get(key).cloned())
    }

    /// Puts an item as it is, outside any commit (to prepare a test).
    pub fn insert_output(&self, key: &str, item: OutputItem) {
        self.with_outputs(|o| o.items.insert(key.to_owned(), item));
    }

    /// Every applied commit, in order.
    pub fn applied_commits(&self) -> Vec<AppliedCommit> {
        self.with_outputs(|o| o.applied.clone())
    }

    /// Every commit turned down, in order.
    pub fn refused_commits(&self) -> Vec<RefusedCommit> {
        self.with_outputs(|o| o.refused.clone())
    }

    /// Counts of commits applied, refused, conflicted and replayed.
    pub fn output_counts(&self) -> OutputCounts {
        self.with_outputs(|o| OutputCounts {
            applied: o.applied.len(),
            refused: o.refused.len(),
            conflicts: o.conflicts,
            replays: o.replays,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::lease::LeaseStore;
    use crate::types::SequenceNumber;

    fn at(n: u128) -> Checkpoint {
        Checkpoint::Sequence(crate::types::ExtendedSequenceNumber::new(
            SequenceNumber::from(n),
        ))
    }

    /// A store holding one row, `s`, owned by `w` under fence 3 at checkpoint 1.
    async fn held() -> MemoryLeaseStore {
        let store = MemoryLeaseStore::new();
        store
            .ensure_table(crate::lease::TableFeatures::NONE)
            .await
            .unwrap();
        let mut lease = Lease::new(ShardId::new("s"), at(1));
        lease.owner = Some(WorkerId::new("w"));
        lease.counter = 7;
        lease.fence = Some(FencingToken(3));
        store.insert(lease);
        store
    }

    async fn commit(
        store: &MemoryLeaseStore,
        owner: &str,
        (before, to): (u128, u128),
        writes: Vec<MemoryWrite>,
    ) -> Result<(), CommitError> {
        let (shard, owner) = (ShardId::new("s"), WorkerId::new(owner));
        let update = CheckpointUpdate::new(at(to));
        let commit = Commit {
            shard: &shard,
            owner: &owner,
            fence: FencingToken(3),
            before: &at(before),
            update: &update,
            writes,
            token: format!("token-{before}-{to}"),
        };
        store.commit(commit).await
    }

    fn row(store: &MemoryLeaseStore) -> Lease {
        store.leases().into_iter().next().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_applies_its_writes_and_checkpoint_together_the_counter_left_alone() {
        let store = held().await;
        let writes = vec![
            MemoryWrite::add("a", 1),
            MemoryWrite::put("b", "x").when(Condition::Absent),
            MemoryWrite::check("c", Condition::Absent),
        ];
        commit(&store, "w", (1, 2), writes).await.unwrap();
        assert_eq!(store.output("a").unwrap().count, 1);
        assert_eq!(store.output("b").unwrap().value.as_deref(), Some("x"));
        assert!(store.output("c").is_none());
        assert_eq!((row(&store).checkpoint, row(&store).counter), (at(2), 7));
        let event = store.journal().pop().unwrap();
        assert_eq!(event.operation, "checkpoint");
        assert_eq!(event.seq, store.applied_commits()[0].seq);
        // A write whose condition fails: nothing of the commit applies.
        let writes = vec![
            MemoryWrite::add("a", 1),
            MemoryWrite::delete("b").when(Condition::ValueIs("y".to_owned())),
        ];
        let refused = commit(&store, "w", (2, 3), writes).await.unwrap_err();
        assert!(
            matches!(refused, CommitError::Refused { index: 1, .. }),
            "{refused:?}"
        );
        assert_eq!(store.output("a").unwrap().count, 1);
        assert_eq!(row(&store).checkpoint, at(2));
        let writes = vec![
            MemoryWrite::delete("b").when(Condition::ValueIs("x".to_owned())),
            MemoryWrite::check("a", Condition::CountIs(1)),
        ];
        commit(&store, "w", (2, 3), writes).await.unwrap();
        assert!(store.output("b").is_none());
    }

    /// A commit leaves the counter alone, so a plain checkpoint written from the row as it
    /// was before the commit (a write prepared before it, a commit that landed late) matches
    /// owner and counter: the checkpoint in its condition refuses it, or it would move the
    /// row back behind the commit's outputs.
    #[tokio::test(start_paused = true)]
    async fn a_plain_checkpoint_from_before_a_commit_is_refused() {
        let store = held().await;
        let before = row(&store);
        commit(&store, "w", (1, 5), vec![MemoryWrite::add("a", 1)])
            .await
            .unwrap();
        let refused = store
            .checkpoint(&before, &CheckpointUpdate::new(at(2)))
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Conflict, "{refused}");
        assert_eq!(row(&store).checkpoint, at(5));
        let now = row(&store);
        let moved = store
            .checkpoint(&now, &CheckpointUpdate::new(at(6)))
            .await
            .unwrap();
        assert_eq!((moved.checkpoint, moved.counter), (at(6), 8));
    }

    #[tokio::test(start_paused = true)]
    async fn the_row_must_hold_the_owner_fence_and_checkpoint_before() {
        let store = held().await;
        for (owner, span) in [("v", (1, 2)), ("w", (0, 2))] {
            let refused = commit(&store, owner, span, vec![MemoryWrite::add("a", 1)]).await;
            assert!(matches!(refused, Err(CommitError::LeaseRow)), "{refused:?}");
        }
        let mut moved = row(&store);
        moved.fence = Some(FencingToken(4));
        store.insert(moved);
        let refused = commit(&store, "w", (1, 2), vec![MemoryWrite::add("a", 1)]).await;
        assert!(matches!(refused, Err(CommitError::LeaseRow)), "{refused:?}");
        assert!(store.outputs().is_empty());
        assert_eq!(store.refused_commits().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_answers_its_own_commit_once_applied_and_refuses_another() {
        let store = held().await;
        let writes = vec![MemoryWrite::add("a", 1)];
        commit(&store, "w", (1, 2), writes.clone()).await.unwrap();
        commit(&store, "w", (1, 2), writes).await.unwrap();
        assert_eq!(store.output("a").unwrap().count, 1, "applied once");
        assert_eq!(store.output_counts().replays, 1);
        let other = commit(&store, "w", (1, 2), vec![MemoryWrite::add("b", 1)]).await;
        let Err(CommitError::Store(e)) = other else {
            panic!("{other:?}")
        };
        assert_eq!(e.kind(), ErrorKind::Fatal);
        // Past the window, or without tokens, the row refuses it.
        tokio::time::advance(IDEMPOTENCY_WINDOW).await;
        let late = commit(&store, "w", (1, 2), vec![MemoryWrite::add("a", 1)]).await;
        assert!(matches!(late, Err(CommitError::LeaseRow)), "{late:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_refused_as_invalid_applies_nothing_named_or_not() {
        let store = held().await;
        store.refuse_as_invalid("bad", true);
        store.refuse_as_invalid("worse", false);
        let writes = |bad: &str| vec![MemoryWrite::add("a", 1), MemoryWrite::add(bad, 1)];
        let named = commit(&store, "w", (1, 2), writes("bad")).await;
        assert!(
            matches!(named, Err(CommitError::Invalid { index: Some(1), .. })),
            "{named:?}"
        );
        let unnamed = commit(&store, "w", (1, 2), writes("worse")).await;
        assert!(
            matches!(unnamed, Err(CommitError::Invalid { index: None, .. })),
            "{unnamed:?}"
        );
        // The lease row's condition is read first; a request's validation before anything.
        assert!(matches!(
            commit(&store, "v", (1, 2), writes("bad")).await,
            Err(CommitError::LeaseRow)
        ));
        assert!(matches!(
            commit(&store, "v", (1, 2), writes("worse")).await,
            Err(CommitError::Invalid { index: None, .. })
        ));
        assert!(store.outputs().is_empty());
        assert_eq!(row(&store).checkpoint, at(1));
        let reasons: Vec<Refusal> = store
            .refused_commits()
            .into_iter()
            .map(|r| r.reason)
            .collect();
        assert_eq!(
            reasons,
            [
                Refusal::Invalid { index: Some(1) },
                Refusal::Invalid { index: None },
                Refusal::LeaseRow,
                Refusal::Invalid { index: None },
            ]
        );
        commit(&store, "w", (1, 2), vec![MemoryWrite::add("a", 1)])
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_limits_and_lost_answers() {
        let store = held().await;
        store.inject_conflicts(1);
        let conflict = commit(&store, "w", (1, 2), vec![MemoryWrite::add("a", 1)]).await;
        let Err(CommitError::Store(e)) = conflict else {
            panic!("{conflict:?}")
        };
        assert_eq!(e.kind(), ErrorKind::Retryable);
        assert!(store.outputs().is_empty());
        store.set_output_limits(Limits {
            writes: 1,
            bytes: 1_000,
        });
        let two = vec![MemoryWrite::add("a", 1), MemoryWrite::add("b", 1)];
        let large = commit(&store, "w", (1, 2), two).await;
        assert!(
            matches!(large, Err(CommitError::Invalid { index: None, .. })),
            "{large:?}"
        );
        store.faults().set_ambiguous_rate(1.0);
        let lost = commit(&store, "w", (1, 2), vec![MemoryWrite::add("a", 1)]).await;
        assert!(matches!(lost, Err(CommitError::Store(ref e)) if e.kind() == ErrorKind::Retryable));
        let applied = store.applied_commits();
        assert_eq!((applied.len(), applied[0].reported), (1, false));
        assert_eq!(row(&store).checkpoint, at(2));
    }
}
