//! The committer of [`Parallel::with_outputs`](super::Parallel::with_outputs): one task per
//! processor that writes every checkpoint of its shard, each in one fenced transaction with
//! the writes of the records it covers, and only then finishes their `Ack`s (see
//! [`outputs`](super::outputs) for the rules).
//!
//! Every record a processor settles comes here: computed (with its writes, maybe none) or
//! given up by the failure policy. A commit takes every such record before the oldest
//! delivered record still running, waiting for its key or resting before a retry
//! ([`Watermark::first_uncovered`]), and checkpoints the record just before that one (the
//! last record delivered, when none waits). It goes through the tenure's transactional path
//! in parts within the store's limits ([`split`]), each part checkpointing its last record,
//! and each part's records are finished once it applied, so the watermark reaches the
//! commit's checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::ack::{Ack, Watermark};
use crate::checkpoint::{Checkpointer, passed_by};
use crate::error::{BoxError, CheckpointError};
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError, Transacted};
use crate::outputs::{Part, Transact, split};
use crate::types::{Checkpoint, ExtendedSequenceNumber};

/// A record settled by the processor: its writes wait to commit (none for a record given
/// up), and its `Ack` is finished once a commit covers it.
pub(super) struct Computed<W> {
    pub(super) position: ExtendedSequenceNumber,
    pub(super) writes: Vec<W>,
    pub(super) ack: Ack,
    /// Dead-lettered or skipped: finished as given up, not as a success.
    pub(super) given_up: bool,
}

impl<W> Computed<W> {
    fn finish(self) {
        if self.given_up {
            self.ack.given_up();
        } else {
            self.ack.done();
        }
    }
}

/// When commits are due: once `every` records were settled since the last one, or
/// `interval` after the oldest one waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cadence {
    pub(super) every: u64,
    pub(super) interval: Duration,
}

/// Rounds of one commit: a round that finds the row's checkpoint moved (adopted by the
/// tenure) goes again from it.
const ROUNDS: usize = 3;

type Reply = oneshot::Sender<Result<(), BoxError>>;

/// A processor's handle on its committer. Dropping it stops the committer between two
/// commits, never in the middle of one: a commit dropped mid-call could apply without the
/// tenure learning its checkpoint.
#[derive(Debug)]
pub(super) struct Committer {
    drains: mpsc::UnboundedSender<Reply>,
    stop: CancellationToken,
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Committer {
    /// Starts committing for the processor `checkpointer` belongs to; returns where its
    /// settled records go.
    pub(super) fn spawn<T: Transact>(
        store: Arc<T>,
        checkpointer: &Checkpointer,
        cadence: Cadence,
    ) -> (mpsc::UnboundedSender<Computed<T::Write>>, Self) {
        // From before the first record is handed out, for good: see `outputs`.
        checkpointer.watermark().hold_back(true);
        let (settled, computed) = mpsc::unbounded_channel();
        let (drains, drain_rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let committing = Committing {
            store,
            tenure: checkpointer.tenure().clone(),
            watermark: checkpointer.watermark().clone(),
            cadence,
            computed: BTreeMap::new(),
            fresh: 0,
            due: None,
            draining: false,
            ended: None,
            stop: stop.clone(),
            writes: checkpointer.writes().clone(),
        };
        let run = async move {
            use futures_util::FutureExt as _;
            let run = std::panic::AssertUnwindSafe(committing.run(computed, drain_rx));
            if let Err(panic) = run.catch_unwind().await {
                // Said here, for nobody joins the task: the processor's next drain or
                // checkpoint finds the committer gone and the shard restarts.
                tracing::error!(
                    panic = crate::task::panic_message(&*panic),
                    "the outputs' committer panicked: nothing more commits (the shard restarts)"
                );
            }
        };
        // Detached, not aborted with the processor: see `Committer`.
        drop(crate::task::spawn(run.in_current_span()));
        (settled, Self { drains, stop })
    }

    /// From now on commits as soon as a record is settled (a graceful stop or a handoff);
    /// resolves once what is settled now committed.
    pub(super) async fn drain(&self) -> Result<(), BoxError> {
        let (reply, answer) = oneshot::channel();
        if self.drains.send(reply).is_err() {
            return Err("the outputs' committer stopped".into());
        }
        answer
            .await
            .unwrap_or_else(|_| Err("the outputs' committer stopped".into()))
    }
}

/// Why nothing more commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The lease moved: the next holder delivers what was not committed again.
    Lost,
    /// A write's own condition refused it: its record failed, and the shard restarts.
    Refused,
}

/// How a round of a commit ended, short of an error.
enum Round {
    Done,
    /// The row's checkpoint was elsewhere (now adopted): go again.
    Again,
}

/// The committer's task state.
struct Committing<T: Transact> {
    store: Arc<T>,
    tenure: Arc<Tenure>,
    watermark: Arc<Watermark>,
    cadence: Cadence,
    /// Settled records not committed yet, by delivery order (their `Ack`'s index).
    computed: BTreeMap<u64, Computed<T::Write>>,
    /// Records settled since the last commit.
    fresh: u64,
    /// When the next commit is due on time.
    due: Option<Instant>,
    /// Commit as soon as anything is settled.
    draining: bool,
    ended: Option<Ended>,
    /// The processor is gone: no new commit, nor part of one, starts.
    stop: CancellationToken,
    /// Where commits that failed or applied are told, for the shard's progress (a shard
    /// whose commits keep failing is `failing`).
    writes: crate::checkpoint::WriteLog,
}

impl<T: Transact> Committing<T> {
    async fn run(
        mut self,
        mut computed: mpsc::UnboundedReceiver<Computed<T::Write>>,
        mut drains: mpsc::UnboundedReceiver<Reply>,
    ) {
        let stop = self.stop.clone();
        loop {
            let due = self.due;
            // A branch's body is never raced by the others: a commit, once started, ends.
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                Some(reply) = drains.recv() => {
                    self.draining = true;
                    while let Ok(c) = computed.try_recv() {
                        self.take(c);
                    }
                    let _ = reply.send(self.commit().await);
                }
                received = computed.recv() => {
                    let Some(c) = received else { return };
                    self.take(c);
                    while let Ok(c) = computed.try_recv() {
                        self.take(c);
                    }
                    if self.draining || self.fresh >= self.cadence.every {
                        let _ = self.commit().await;
                    }
                }
                () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    let _ = self.commit().await;
                }
            }
        }
    }

    fn take(&mut self, computed: Computed<T::Write>) {
        self.fresh += 1;
        let interval = self.cadence.interval;
        self.due.get_or_insert_with(|| Instant::now() + interval);
        self.computed.insert(computed.ack.index(), computed);
    }

    /// Commits what may commit now (see the module docs); errors are logged here too.
    async fn commit(&mut self) -> Result<(), BoxError> {
        self.fresh = 0;
        if let Some(ended) = self.ended {
            return Err(match ended {
                Ended::Lost => CheckpointError::LeaseLost {
                    shard: self.tenure.shard().clone(),
                }
                .into(),
                Ended::Refused => {
                    "an output was refused: nothing more commits (the shard restarts)".into()
                }
            });
        }
        let result = self.rounds().await;
        // What could not commit yet (a key still running before it) is looked at again.
        let again = !self.computed.is_empty() && self.ended.is_none();
        self.due = again.then(|| Instant::now() + self.cadence.interval);
        match &result {
            Ok(()) => self.writes.applied(),
            Err(error) => self.writes.failed(error),
        }
        match &result {
            Ok(()) | Err(CheckpointError::LeaseLost { .. }) => {}
            Err(error @ CheckpointError::OutputRefused { .. }) => {
                tracing::error!(%error, "an output was refused: its record failed");
            }
            Err(error) => tracing::warn!(%error, "committing outputs failed; trying again"),
        }
        result.map_err(Into::into)
    }

    async fn rounds(&mut self) -> Result<(), CheckpointError> {
        for _ in 0..ROUNDS {
            if self.stop.is_cancelled() {
                break;
            }
            if let Round::Done = self.round().await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// One commit of everything committable, in parts.
    async fn round(&mut self) -> Result<Round, CheckpointError> {
        // Records the row's checkpoint passed were committed by an attempt whose answer was
        // lost (only a commit passes a settled record): finished, never written twice.
        let current = self.tenure.snapshot().await.checkpoint;
        self.finish_through(&current);
        let Some((records, through)) = self.committable() else {
            return Ok(Round::Done);
        };
        for part in self.parts(&records)? {
            if self.stop.is_cancelled() {
                break;
            }
            let checkpoint = part.through.clone().unwrap_or_else(|| through.clone());
            if let Round::Again = self.commit_part(part, checkpoint).await? {
                return Ok(Round::Again);
            }
        }
        Ok(Round::Done)
    }

    /// The settled records that may commit now, and the checkpoint that covers them: the
    /// record before the oldest one not settled, or the last one settled when none waits
    /// (every delivered record comes here, so that is the last one delivered).
    fn committable(&self) -> Option<(Vec<u64>, ExtendedSequenceNumber)> {
        let uncovered = self
            .watermark
            .first_uncovered(|index| self.computed.contains_key(&index));
        let (end, before) = match uncovered {
            Some((index, before)) => (index, before),
            None => (u64::MAX, None),
        };
        let records: Vec<u64> = self.computed.range(..end).map(|(i, _)| *i).collect();
        let last = self.computed.get(records.last()?)?.position.clone();
        Some((records, before.unwrap_or(last)))
    }

    /// The writes of `records`, in parts within the store's limits (one part without writes
    /// when none has any: the checkpoint alone).
    fn parts(&mut self, records: &[u64]) -> Result<Vec<Part<T::Write>>, CheckpointError> {
        let writes: Vec<(ExtendedSequenceNumber, T::Write)> = records
            .iter()
            .filter_map(|i| self.computed.get(i))
            .flat_map(|c| c.writes.iter().map(|w| (c.position.clone(), w.clone())))
            .collect();
        let store = &self.store;
        split(writes, |w| store.measure(w), store.limits()).map_err(|large| {
            // Checked when the record was computed: only a store whose limits changed.
            let reason = format!(
                "its {} writes ({} bytes) exceed one transaction",
                large.writes, large.bytes
            );
            self.refuse(Some(&large.record), reason)
        })
    }

    /// Commits one part, checkpointing `checkpoint`.
    async fn commit_part(
        &mut self,
        part: Part<T::Write>,
        checkpoint: ExtendedSequenceNumber,
    ) -> Result<Round, CheckpointError> {
        let mut update = CheckpointUpdate::new(Checkpoint::Sequence(checkpoint));
        update.park = passed_by(self.watermark.parking(), &update.checkpoint);
        let (records, writes): (Vec<ExtendedSequenceNumber>, Vec<T::Write>) =
            part.writes.into_iter().unzip();
        let shard = || self.tenure.shard().clone();
        match self
            .tenure
            .transact(&*self.store, &update, writes, records.first())
            .await
        {
            Ok(Transacted::Applied) => {
                metrics::counter!(crate::metrics::CHECKPOINTS).increment(1);
                self.watermark.parked(&update.park);
                self.finish_through(&update.checkpoint);
                Ok(Round::Done)
            }
            Ok(Transacted::Refused { index, reason }) => {
                let record = records.get(index).or(records.last()).cloned();
                Err(self.refuse(record.as_ref(), reason))
            }
            Err(TenureError::Lost) => {
                self.ended = Some(Ended::Lost);
                Err(CheckpointError::LeaseLost { shard: shard() })
            }
            // Nothing applied; the row's checkpoint adopted.
            Err(TenureError::Behind(_)) => Ok(Round::Again),
            // The outcome may be unknown: the next commit settles it (its condition fails if
            // this one applied, and the tenure reads the row).
            Err(TenureError::Store(source)) => Err(CheckpointError::Store {
                shard: shard(),
                source,
            }),
        }
    }

    /// The outputs of `record` were refused (nothing of its part applied): its `Ack` fails
    /// (the shard restarts from the watermark) and nothing more commits.
    fn refuse(
        &mut self,
        record: Option<&ExtendedSequenceNumber>,
        reason: String,
    ) -> CheckpointError {
        self.ended = Some(Ended::Refused);
        let record = record
            .cloned()
            .unwrap_or_else(|| ExtendedSequenceNumber::new(0u128.into()));
        let error = CheckpointError::OutputRefused {
            shard: self.tenure.shard().clone(),
            record: record.clone(),
            reason,
        };
        let index = (self.computed.iter())
            .find(|(_, c)| c.position == record)
            .map(|(i, _)| *i);
        if let Some(computed) = index.and_then(|i| self.computed.remove(&i)) {
            computed.ack.fail(error.to_string());
        }
        error
    }

    /// Finishes the settled records `checkpoint` passes: their writes committed.
    fn finish_through(&mut self, checkpoint: &Checkpoint) {
        let Checkpoint::Sequence(at) = checkpoint else {
            return;
        };
        let passed: Vec<u64> = (self.computed.iter())
            .take_while(|(_, c)| c.position <= *at)
            .map(|(i, _)| *i)
            .collect();
        for index in passed {
            if let Some(computed) = self.computed.remove(&index) {
                computed.finish();
            }
        }
    }
}
