//! An in-memory sink that keeps each shard's position with its outputs (see
//! [`Positions`]): the model of a database the lease store is not (Postgres while the leases
//! live in DynamoDB), for tests and the simulation.
//!
//! Its rules are those kcl-postgres's sink keeps in SQL, so that the simulation checks them:
//! - [`open`](Positions::open) names the opening tenure on the shard's row (whatever fence
//!   the row named before: a lease row made again starts its counters over) and returns
//!   the row's position;
//! - a commit applies only while the row names the committing tenure (owner and fence), and
//!   its position is at or before the commit's checkpoint before (a lease moved forward
//!   without the sink, by an operator or a plain checkpoint, leaves the sink behind, which is
//!   harmless: the records between were never handed to this tenure). A row already at the
//!   commit's own checkpoint is the same commit applied by an earlier attempt whose answer
//!   was lost: answered with success, applied once (a SQL database has no idempotency token
//!   to ask; kcl-postgres reads the row the same way);
//! - its calls go through the shared [`Faults`]: errors, partitions, freezes, answers lost
//!   after the commit applied, and stragglers that land later if the row still allows them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::faults::{Fate, Faults};
use super::outputs::{MemoryWrite, OutputItem, write};
use crate::error::{BackendError, ErrorKind};
use crate::mutation::{self, Mutation};
use crate::outputs::{Commit, CommitError, Limits, Measure, Positions, Transact};
use crate::types::{Checkpoint, FencingToken, ShardId, WorkerId};

/// The operation names of the sink's calls, for faults and errors.
const OPEN: &str = "open_positions";
const COMMIT: &str = "sink_commit";

/// A shard's row in the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionRow {
    /// The tenure that opened last: its holder.
    pub owner: WorkerId,
    /// The tenure that opened last: its fence.
    pub fence: FencingToken,
    /// The checkpoint of the last commit, `None` before the first.
    pub position: Option<Checkpoint>,
}

/// A commit the sink applied.
#[derive(Debug, Clone)]
pub struct SinkCommit {
    /// When.
    pub at: Instant,
    /// Its place among the events of the in-memory backends ([`next_event_seq`](super::next_event_seq)),
    /// to order it against the lease store's journal (several share one paused instant).
    pub seq: u64,
    /// The handle that sent it.
    pub client: String,
    /// The shard.
    pub shard: ShardId,
    /// The tenure it was made under.
    pub owner: WorkerId,
    /// The tenure it was made under.
    pub fence: FencingToken,
    /// The sink's position before it.
    pub before: Option<Checkpoint>,
    /// The position it wrote.
    pub checkpoint: Checkpoint,
    /// Its writes, in order.
    pub writes: Vec<MemoryWrite>,
}

#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<ShardId, PositionRow>,
    items: BTreeMap<String, OutputItem>,
    applied: Vec<SinkCommit>,
    /// Commits refused because the row named another tenure.
    fenced_off: usize,
    opens: usize,
}

/// The sink; cheap to clone, every clone and [`client`](Self::client) handle sharing it.
#[derive(Debug, Clone)]
pub struct MemoryPositionSink {
    state: Arc<Mutex<State>>,
    faults: Faults,
    client: Arc<str>,
}

impl MemoryPositionSink {
    /// An empty sink whose calls go through `faults` (share the store's to fault both).
    pub fn new(faults: Faults) -> Self {
        Self {
            state: Arc::default(),
            faults,
            client: Arc::from("default"),
        }
    }

    /// A handle on the same sink whose calls are made as `client`.
    #[must_use]
    pub fn client(&self, client: &str) -> Self {
        Self {
            client: Arc::from(client),
            ..self.clone()
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rows now.
    pub fn rows(&self) -> BTreeMap<ShardId, PositionRow> {
        self.state().rows.clone()
    }

    /// The output items now.
    pub fn outputs(&self) -> BTreeMap<String, OutputItem> {
        self.state().items.clone()
    }

    /// Every applied commit, in order.
    pub fn applied_commits(&self) -> Vec<SinkCommit> {
        self.state().applied.clone()
    }

    /// Commits refused because the row named another tenure (a zombie's, or one whose
    /// open was overtaken).
    pub fn fenced_off(&self) -> usize {
        self.state().fenced_off
    }

    /// Opens so far.
    pub fn opens(&self) -> usize {
        self.state().opens
    }

    /// Sets a row as it is, outside any call (to prepare a test).
    pub fn insert_row(&self, shard: ShardId, row: PositionRow) {
        self.state().rows.insert(shard, row);
    }

    /// Applies `commit` if the row allows it (see the module docs).
    fn apply(&self, commit: &Owned, reported: bool) -> Result<(), CommitError> {
        let mut state = self.state();
        let state = &mut *state;
        let row = state.rows.get(&commit.shard);
        let ours = row.is_some_and(|r| r.owner == commit.owner && r.fence == commit.fence);
        if !ours && !mutation::on(Mutation::SinkUnfenced) {
            state.fenced_off += 1;
            return Err(CommitError::LeaseRow);
        }
        let position = row.and_then(|r| r.position.clone());
        if position.as_ref() == Some(&commit.checkpoint) {
            return Ok(());
        }
        let behind = position.as_ref().is_none_or(|p| {
            p.progress_cmp(&commit.before)
                .is_some_and(std::cmp::Ordering::is_le)
        });
        if !behind {
            return Err(CommitError::LeaseRow);
        }
        if let Some((index, reason)) = write::first_refused(&state.items, &commit.writes) {
            return Err(CommitError::Refused { index, reason });
        }
        for w in &commit.writes {
            write::apply(&mut state.items, w);
        }
        let row = state
            .rows
            .entry(commit.shard.clone())
            .or_insert(PositionRow {
                owner: commit.owner.clone(),
                fence: commit.fence,
                position: None,
            });
        row.position = Some(commit.checkpoint.clone());
        state.applied.push(SinkCommit {
            at: Instant::now(),
            seq: super::next_event_seq(),
            client: if reported {
                self.client.to_string()
            } else {
                format!("{} (unanswered)", self.client)
            },
            shard: commit.shard.clone(),
            owner: commit.owner.clone(),
            fence: commit.fence,
            before: position,
            checkpoint: commit.checkpoint.clone(),
            writes: commit.writes.clone(),
        });
        Ok(())
    }
}

/// A commit with everything it needs owned (a straggler applies it after its caller left).
#[derive(Debug, Clone)]
struct Owned {
    shard: ShardId,
    owner: WorkerId,
    fence: FencingToken,
    before: Checkpoint,
    checkpoint: Checkpoint,
    writes: Vec<MemoryWrite>,
}

impl Positions for MemoryPositionSink {
    async fn open(
        &self,
        shard: &ShardId,
        owner: &WorkerId,
        fence: FencingToken,
    ) -> Result<Option<Checkpoint>, BackendError> {
        // An open that lost its answer still fenced the row: retried, it fences it again.
        let fate = self.faults.enter(&self.client, OPEN, true).await?;
        let mut state = self.state();
        state.opens += 1;
        let row = state.rows.entry(shard.clone()).or_insert(PositionRow {
            owner: owner.clone(),
            fence,
            position: None,
        });
        row.owner = owner.clone();
        row.fence = fence;
        let position = row.position.clone();
        drop(state);
        match fate {
            Fate::Apply => Ok(position),
            _ => Err(BackendError::new(
                ErrorKind::Retryable,
                OPEN,
                "injected: the answer was lost",
            )),
        }
    }
}

impl Transact for MemoryPositionSink {
    type Write = MemoryWrite;

    fn limits(&self) -> Limits {
        // A SQL transaction has no item limits.
        Limits {
            writes: usize::MAX,
            bytes: usize::MAX,
        }
    }

    fn measure(&self, write: &MemoryWrite) -> Measure {
        Measure {
            bytes: write.bytes(),
            item: None,
        }
    }

    fn keeps_position(&self) -> bool {
        true
    }

    async fn commit(&self, commit: Commit<'_, MemoryWrite>) -> Result<(), CommitError> {
        let owned = Owned {
            shard: commit.shard.clone(),
            owner: commit.owner.clone(),
            fence: commit.fence,
            before: commit.before.clone(),
            checkpoint: commit.update.checkpoint.clone(),
            writes: commit.writes,
        };
        let lost = || {
            CommitError::Store(BackendError::new(
                ErrorKind::Retryable,
                COMMIT,
                "injected: the answer was lost",
            ))
        };
        match self.faults.enter(&self.client, COMMIT, true).await? {
            Fate::Apply => self.apply(&owned, true),
            Fate::ApplyThenFail => self.apply(&owned, false).and(Err(lost())),
            Fate::Straggle(delay) => {
                // Not a task of the writer's process: it lands even if the writer is frozen.
                let sink = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = sink.apply(&owned, false);
                });
                Err(lost())
            }
        }
    }
}
