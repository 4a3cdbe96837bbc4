//! Exactly-once outputs in the simulation: in a share of the seeds (batch processors, no
//! failure policy), each processor commits its records' outputs with its checkpoints
//! (`Checkpointer::commit_outputs`, in every checkpoint style the plain processor has) to the
//! in-memory store's output table, under every fault the run goes through. Which outputs a
//! record has is a function of the record alone ([`writes_of`]), so that the checks
//! (`checks/outputs.rs`) know what each checkpoint owes without asking who processed it.
//!
//! A record's own output adds 1 to its item (`out|<lease key>|<position>`): a duplicate
//! commit counts 2. One record in eight also puts its position into one of four items of
//! its shard (`bucket|…`), so that two records of a stretch write one item and the stretch
//! commits in parts even within the limits; half the seeds make the limits small (2 to 8
//! writes, 400 to 2,000 bytes), so that most stretches commit in parts. A third of them
//! cancel every n-th commit with a `TransactionConflict`, and a third keep no idempotency
//! tokens (a retry of an applied commit then fails on the row and is found applied).
//!
//! Half of these seeds commit into a sink that keeps each shard's position itself (the
//! in-memory model of a Postgres database while the leases live in the lease table:
//! `sim/positions.rs`) instead of the lease table's own transactions: the same processors,
//! the same writes, the same checkpoint styles; the limits, conflicts and tokens above are
//! the lease table's and do not apply there.
//!
//! The processor keeps its pending writes with their records; a processor under `Parallel`
//! can hand the same writes to its own committer, and the checks hold for it unchanged.

use kcl_core::memory::{MemoryLeaseStore, MemoryPositionSink, MemoryWrite};
use kcl_core::outputs::{Limits, Outputs, Transact};
use kcl_core::{CheckpointError, Checkpointer, ExtendedSequenceNumber, ShardId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::processor::Log;

/// The item a record's own output adds 1 to.
pub fn record_key(shard: &ShardId, position: &ExtendedSequenceNumber) -> String {
    format!("out|{shard}|{position}")
}

/// The writes a processor commits for the record at `position` of `shard` (none for a
/// quarter of the records).
pub fn writes_of(shard: &ShardId, position: &ExtendedSequenceNumber) -> Vec<MemoryWrite> {
    let h = super::hash(&format!("output {shard} {position}"));
    let own = MemoryWrite::add(record_key(shard, position), 1);
    match h % 8 {
        0 | 1 => Vec::new(),
        2 => {
            let bucket = format!("bucket|{shard}|{}", (h >> 8) % 4);
            vec![own, MemoryWrite::put(bucket, position.to_string())]
        }
        _ => vec![own],
    }
}

/// A seed's settings for transactional outputs.
#[derive(Debug, Clone, Copy)]
pub struct Transactional {
    /// Limits smaller than DynamoDB's, or `None` for its own.
    pub limits: Option<Limits>,
    /// Every how many commits one is cancelled with a conflict.
    pub conflict_every: Option<u32>,
    /// Whether the store remembers applied commits' tokens.
    pub tokens: bool,
    /// Whether the outputs go to a sink that keeps each shard's position
    /// (`sim/positions.rs`) instead of the lease table.
    pub sink: bool,
}

impl Transactional {
    /// The settings of `seed`, if its processors commit outputs: half of the seeds that may
    /// (batch processors without a failure policy). Drawn apart from the scenario's draws.
    pub fn draw(seed: u64, eligible: bool) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0e0c_0de5);
        if !rng.random_bool(0.5) || !eligible {
            return None;
        }
        let limits = rng.random_bool(0.5).then(|| Limits {
            writes: rng.random_range(2..=8),
            bytes: rng.random_range(400..=2_000),
        });
        let conflict_every = rng.random_ratio(1, 3).then(|| rng.random_range(4..=20));
        let tokens = !rng.random_ratio(1, 3);
        // Drawn apart, so that the draws above stay as they were.
        let sink = StdRng::seed_from_u64(seed ^ 0x5111_c0de).random_bool(0.5);
        Some(Self {
            limits,
            conflict_every,
            tokens,
            sink,
        })
    }

    /// Sets the store up for the run (the lease table's settings: none for a sink).
    pub fn apply(&self, store: &MemoryLeaseStore) {
        if self.sink {
            return;
        }
        if let Some(limits) = self.limits {
            store.set_output_limits(limits);
        }
        store.conflict_every(self.conflict_every);
        if !self.tokens {
            store.set_idempotency_window(None);
        }
    }
}

/// Where a worker's processors commit their outputs: the lease table, or the sink that keeps
/// positions; its worker's handle either way, so that a partition of the worker cuts its
/// commits too.
#[derive(Debug, Clone)]
pub enum Target {
    Store(MemoryLeaseStore),
    Sink(RoundTrip),
}

/// A worker's handle on the sink, whose commits take a database's round trip: 0 to 100 ms
/// (drawn from the commit, the same in every run of the seed) before the sink applies them,
/// so that a worker frozen or cut off meanwhile has a commit in flight when it comes back.
#[derive(Debug, Clone)]
pub struct RoundTrip(pub MemoryPositionSink);

impl Transact for RoundTrip {
    type Write = MemoryWrite;

    fn limits(&self) -> Limits {
        self.0.limits()
    }

    fn measure(&self, write: &MemoryWrite) -> kcl_core::outputs::Measure {
        self.0.measure(write)
    }

    fn keeps_position(&self) -> bool {
        self.0.keeps_position()
    }

    async fn commit(
        &self,
        commit: kcl_core::outputs::Commit<'_, MemoryWrite>,
    ) -> Result<(), kcl_core::outputs::CommitError> {
        let h = super::hash(&format!("{} {:?}", commit.shard, commit.update.checkpoint));
        tokio::time::sleep(std::time::Duration::from_millis(h % 101)).await;
        self.0.commit(commit).await
    }
}

impl Target {
    async fn commit(
        &self,
        checkpointer: &mut Checkpointer,
        outputs: Outputs<MemoryWrite>,
        at: Option<ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        match (self, at) {
            (Self::Store(s), Some(at)) => checkpointer.commit_outputs_at(s, outputs, at).await,
            (Self::Store(s), None) => checkpointer.commit_outputs(s, outputs).await,
            (Self::Sink(s), Some(at)) => checkpointer.commit_outputs_at(s, outputs, at).await,
            (Self::Sink(s), None) => checkpointer.commit_outputs(s, outputs).await,
        }
    }

    fn limits(&self) -> Limits {
        match self {
            Self::Store(s) => s.limits(),
            Self::Sink(s) => s.limits(),
        }
    }

    fn measure(&self, write: &MemoryWrite) -> kcl_core::outputs::Measure {
        match self {
            Self::Store(s) => s.measure(write),
            Self::Sink(s) => s.measure(write),
        }
    }
}

/// One processor instance's writes not committed yet, and where it commits them.
#[derive(Debug)]
pub struct Committer {
    store: Target,
    pending: Vec<(ExtendedSequenceNumber, MemoryWrite)>,
    log: Log,
}

impl Committer {
    pub fn new(store: Target, log: Log) -> Self {
        Self {
            store,
            pending: Vec::new(),
            log,
        }
    }

    /// The outputs of a delivered record, to commit with a checkpoint that covers it.
    pub fn produced(&mut self, shard: &ShardId, position: &ExtendedSequenceNumber) {
        for write in writes_of(shard, position) {
            self.pending.push((position.clone(), write));
        }
    }

    /// Commits the pending writes up to `at` (everything finished, if `None`) with a
    /// checkpoint there; the writes after `at` stay pending. `two_phase`: a prepared
    /// checkpoint first. On an error the writes handed over are gone with the processor,
    /// which fails: the next one starts from the row's checkpoint.
    pub async fn commit(
        &mut self,
        checkpointer: &mut Checkpointer,
        two_phase: bool,
        at: Option<ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        if two_phase {
            match checkpointer.prepare_checkpoint(at.clone()).await {
                Ok(_) | Err(CheckpointError::NothingDelivered { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let pending = std::mem::take(&mut self.pending);
        let (now, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(p, _)| at.as_ref().is_none_or(|at| p <= at));
        self.pending = later;
        if self.exceeds(&now) {
            self.log.lock().large_stretches += 1;
        }
        let mut outputs = Outputs::new();
        for (position, write) in now {
            outputs.push_at(position, write);
        }
        self.store.commit(checkpointer, outputs, at).await
    }

    /// A position past the last delivered record, with no writes: must be refused.
    pub async fn beyond(
        &mut self,
        checkpointer: &mut Checkpointer,
        position: ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        self.store
            .commit(checkpointer, Outputs::new(), Some(position))
            .await
    }

    /// Whether `writes` need more than one transaction.
    fn exceeds(&self, writes: &[(ExtendedSequenceNumber, MemoryWrite)]) -> bool {
        let limits = self.store.limits();
        let measures: Vec<_> = writes.iter().map(|(_, w)| self.store.measure(w)).collect();
        let bytes: usize = measures.iter().map(|m| m.bytes).sum();
        let items: std::collections::BTreeSet<_> =
            measures.iter().filter_map(|m| m.item.as_ref()).collect();
        writes.len() > limits.writes || bytes > limits.bytes || items.len() < writes.len()
    }
}
