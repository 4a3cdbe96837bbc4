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
//!
//! A record whose writes cannot commit (a write refused by its own condition, or refused by
//! the store as invalid) fails as a [`Permanent`] failure, for the failure policy: given up
//! (dead-lettered or skipped), it comes back without writes and commits as any record given
//! up; under a policy that blocks, or in an outage, its `Ack` fails and the shard restarts
//! from the watermark. A part refused as invalid without the store saying which write is
//! committed again one record at a time ([`Part::by_record`]), so that the records before
//! the one at fault commit and only that one goes to the policy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::ack::{Ack, Watermark};
use crate::checkpoint::{Checkpointer, passed_by};
use crate::error::{BoxError, CheckpointError};
use crate::failure::{Handling, Next, Permanent, Tries};
use crate::lease::CheckpointUpdate;
use crate::lease::tenure::{Tenure, TenureError, Transacted};
use crate::outputs::{Part, Transact, split};
use crate::types::{Checkpoint, ExtendedSequenceNumber, Record};

/// A record settled by the processor: its writes wait to commit (none for a record given
/// up), and its `Ack` is finished once a commit covers it.
pub(super) struct Computed<W> {
    pub(super) position: ExtendedSequenceNumber,
    pub(super) writes: Vec<W>,
    pub(super) ack: Ack,
    /// Dead-lettered or skipped: finished as given up, not as a success.
    pub(super) given_up: bool,
    /// The record, for the failure policy to give it up if its writes cannot commit (`None`
    /// for a record given up already).
    pub(super) record: Option<Record>,
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
        handling: Option<Handling>,
    ) -> (mpsc::UnboundedSender<Computed<T::Write>>, Self) {
        // From before the first record is handed out, for good: see `outputs`.
        checkpointer.watermark().hold_back(true);
        let (settled, computed) = mpsc::unbounded_channel();
        let (drains, drain_rx) = mpsc::unbounded_channel();
        let (returned, given_up) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let committing = Committing {
            store,
            tenure: checkpointer.tenure().clone(),
            sink: checkpointer.sink.clone(),
            watermark: checkpointer.watermark().clone(),
            cadence,
            computed: BTreeMap::new(),
            fresh: 0,
            due: None,
            draining: false,
            ended: None,
            stop: stop.clone(),
            writes: checkpointer.writes().clone(),
            handling,
            returned,
            giving_up: JoinSet::new(),
        };
        let run = async move {
            use futures_util::FutureExt as _;
            let run = committing.run(computed, drain_rx, given_up);
            let run = std::panic::AssertUnwindSafe(run);
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
    /// A record's writes could not commit and its `Ack` failed (no policy gives records up,
    /// or an outage): the shard restarts.
    Refused,
}

/// How a round of a commit ended, short of an error.
enum Round {
    Done,
    /// The row's checkpoint was elsewhere (now adopted): go again.
    Again,
}

/// How one part's commit ended, short of an error.
enum Committed<W> {
    Applied,
    /// The row's checkpoint was elsewhere (now adopted): the round goes again.
    Again,
    /// Refused as invalid, the store not saying which write: the part back, and why.
    Unnamed(Part<W>, String),
}

/// The committer's task state.
struct Committing<T: Transact> {
    store: Arc<T>,
    tenure: Arc<Tenure>,
    /// The worker's sink that keeps positions, opened again if it refuses a commit.
    sink: Option<crate::outputs::Sink>,
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
    /// The failure policy, if it gives records up (none: a record that fails restarts the
    /// shard).
    handling: Option<Handling>,
    /// Where records whose writes could not commit come back once given up.
    returned: mpsc::UnboundedSender<Computed<T::Write>>,
    /// Those records being given up (aborted when the committer stops).
    giving_up: JoinSet<()>,
}

impl<T: Transact> Committing<T> {
    async fn run(
        mut self,
        mut computed: mpsc::UnboundedReceiver<Computed<T::Write>>,
        mut drains: mpsc::UnboundedReceiver<Reply>,
        mut given_up: mpsc::UnboundedReceiver<Computed<T::Write>>,
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
                Some(c) = given_up.recv() => {
                    self.take(c);
                    if self.draining || self.fresh >= self.cadence.every {
                        let _ = self.commit().await;
                    }
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
        // A record whose writes could not commit, handed to the failure policy (said in
        // `refuse`): no failed write, and the rest commits once it comes back.
        let handed = self.ended.is_none() && result.as_ref().is_err_and(cannot_commit);
        // (A commit that applied says so where it applied: a round with nothing to commit,
        // or cut short by a stop, applied nothing.)
        match &result {
            Ok(()) => {}
            Err(_) if handed => return Ok(()),
            Err(error) => self.writes.failed(error),
        }
        match &result {
            Ok(()) | Err(CheckpointError::LeaseLost { .. }) => {}
            Err(error) if cannot_commit(error) => {}
            Err(error) => tracing::warn!(%error, "committing outputs failed; trying again"),
        }
        result.map_err(Into::into)
    }

    async fn rounds(&mut self) -> Result<(), CheckpointError> {
        // The first record whose outputs could not commit: it left the settled records, so
        // the next round commits those before it at once (before the shard restarts, if it
        // does: a record given up before it is not given up twice).
        let mut refused = None;
        for _ in 0..ROUNDS {
            if self.stop.is_cancelled() {
                break;
            }
            match self.round().await {
                Ok(Round::Done) => break,
                Ok(Round::Again) => {}
                Err(error) if cannot_commit(&error) => {
                    refused.get_or_insert(error);
                }
                Err(error) => return Err(refused.unwrap_or(error)),
            }
        }
        refused.map_or(Ok(()), Err)
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
            let round = match self.commit_part(part, &through).await? {
                Committed::Applied => Round::Done,
                Committed::Again => Round::Again,
                Committed::Unnamed(part, reason) if part.several_records() => {
                    self.isolate(part, &through, reason).await?
                }
                Committed::Unnamed(part, reason) => {
                    return Err(self.invalid(first_record(&part), reason));
                }
            };
            if let Round::Again = round {
                return Ok(Round::Again);
            }
        }
        Ok(Round::Done)
    }

    /// `part`, refused as invalid without the store saying which write, committed again one
    /// record at a time: the records before the one at fault commit, and the one whose writes
    /// fail alone goes to the failure policy.
    async fn isolate(
        &mut self,
        part: Part<T::Write>,
        through: &ExtendedSequenceNumber,
        reason: String,
    ) -> Result<Round, CheckpointError> {
        tracing::info!(
            %reason,
            writes = part.writes.len(),
            "the store refused a part of the outputs as invalid without naming the write: \
             committing its records one at a time"
        );
        for alone in part.by_record() {
            if self.stop.is_cancelled() {
                break;
            }
            match self.commit_part(alone, through).await? {
                Committed::Applied => {}
                Committed::Again => return Ok(Round::Again),
                Committed::Unnamed(alone, reason) => {
                    return Err(self.invalid(first_record(&alone), reason));
                }
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
            let error = CheckpointError::OutputsTooLarge {
                shard: self.tenure.shard().clone(),
                record: large.record.clone(),
                writes: large.writes,
                bytes: large.bytes,
            };
            self.refuse(&large.record, error)
        })
    }

    /// Commits one part, checkpointing its last record (or `through`, for the last part).
    async fn commit_part(
        &mut self,
        part: Part<T::Write>,
        through: &ExtendedSequenceNumber,
    ) -> Result<Committed<T::Write>, CheckpointError> {
        let checkpoint = part.through.clone().unwrap_or_else(|| through.clone());
        let mut update = CheckpointUpdate::new(Checkpoint::Sequence(checkpoint));
        update.park = passed_by(self.watermark.parking(), &update.checkpoint);
        let own = part.through;
        let (records, writes): (Vec<ExtendedSequenceNumber>, Vec<T::Write>) =
            part.writes.into_iter().unzip();
        let shard = || self.tenure.shard().clone();
        let named = |index: usize| records.get(index).or(records.last()).cloned();
        let (tenure, around) = (&self.tenure, (records.first(), self.sink.as_ref()));
        match tenure
            .transact(&*self.store, &update, &writes, around)
            .await
        {
            Ok(Transacted::Applied) => {
                metrics::counter!(crate::metrics::CHECKPOINTS).increment(1);
                self.watermark.parked(&update.park);
                self.finish_through(&update.checkpoint);
                self.writes.applied();
                Ok(Committed::Applied)
            }
            Ok(Transacted::Refused { index, reason }) => {
                let record = named(index).unwrap_or_else(|| through.clone());
                let error = CheckpointError::OutputRefused {
                    shard: shard(),
                    record: record.clone(),
                    reason,
                };
                Err(self.refuse(&record, error))
            }
            Ok(Transacted::Invalid {
                index: Some(index),
                reason,
            }) if index < records.len() => Err(self.invalid(named(index), reason)),
            Ok(Transacted::Invalid { reason, .. }) => {
                let writes = records.into_iter().zip(writes).collect();
                Ok(Committed::Unnamed(
                    Part {
                        writes,
                        through: own,
                    },
                    reason,
                ))
            }
            Err(TenureError::Lost) => {
                self.ended = Some(Ended::Lost);
                Err(CheckpointError::LeaseLost { shard: shard() })
            }
            // Nothing applied; the row's checkpoint adopted.
            Err(TenureError::Behind(_)) => Ok(Committed::Again),
            // The outcome may be unknown: the next commit settles it (its condition fails if
            // this one applied, and the tenure reads the row).
            Err(TenureError::Store(source)) => Err(CheckpointError::Store {
                shard: shard(),
                source,
            }),
        }
    }

    /// The writes of `record` were refused as invalid.
    fn invalid(
        &mut self,
        record: Option<ExtendedSequenceNumber>,
        reason: String,
    ) -> CheckpointError {
        let Some(record) = record else {
            // Only a part with writes is refused as invalid (see `Tenure::transact`).
            return CheckpointError::Store {
                shard: self.tenure.shard().clone(),
                source: crate::BackendError::new(crate::ErrorKind::Fatal, "transact", reason),
            };
        };
        let error = CheckpointError::OutputInvalid {
            shard: self.tenure.shard().clone(),
            record: record.clone(),
            reason,
        };
        self.refuse(&record, error)
    }

    /// The outputs of `record` cannot commit (`error`; nothing of its part applied): it fails
    /// as a permanent failure, for the failure policy (see the module docs).
    fn refuse(
        &mut self,
        record: &ExtendedSequenceNumber,
        error: CheckpointError,
    ) -> CheckpointError {
        while self.giving_up.try_join_next().is_some() {}
        let index = (self.computed.iter())
            .find(|(_, c)| c.position == *record)
            .map(|(i, _)| *i);
        let Some(mut computed) = index.and_then(|i| self.computed.remove(&i)) else {
            self.ended = Some(Ended::Refused);
            return error;
        };
        let failure: BoxError = Permanent::new(error.to_string()).into();
        let mut tries = Tries::default();
        let outage = self.handling.as_ref().is_some_and(Handling::output_refused);
        let given_up = match (&self.handling, computed.record.take()) {
            (Some(_), Some(_)) if outage => None,
            (Some(handling), Some(record)) => {
                match tries.failed(&handling.policy, &record, &failure) {
                    Next::GiveUp(reason) if handling.may_give_up() => {
                        Some((handling.clone(), handling.letter(record, &tries, reason)))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let Some((handling, letter)) = given_up else {
            tracing::error!(%error, "an output cannot commit: its record failed (the shard restarts)");
            self.ended = Some(Ended::Refused);
            computed.ack.fail(failure);
            return error;
        };
        tracing::warn!(%error, "an output cannot commit: its record goes to the failure policy");
        let back = self.returned.clone();
        let give_up = async move {
            let Computed { position, ack, .. } = computed;
            // Bounded by the lease's validity, as the dispatcher's give-ups are: past it, the
            // `Ack` is dropped (a failure) and the next holder delivers the record again.
            match ack.while_valid(handling.give_up(letter)).await {
                Some(Ok(())) => {
                    let _ = back.send(Computed {
                        position,
                        writes: Vec::new(),
                        ack,
                        given_up: true,
                        record: None,
                    });
                }
                Some(Err(error)) => ack.fail(error),
                None => drop(ack),
            }
        };
        crate::task::spawn_in(&mut self.giving_up, give_up.in_current_span());
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
                // A record whose outputs committed ends a run of refusals (one given up and
                // committed without them does not).
                if let (false, Some(handling)) = (computed.given_up, &self.handling) {
                    handling.output_committed();
                }
                computed.finish();
            }
        }
    }
}

/// Whether `error` is a record's outputs that cannot commit, a failure of that record (said
/// in `refuse`) rather than of the commit.
fn cannot_commit(error: &CheckpointError) -> bool {
    matches!(
        error,
        CheckpointError::OutputRefused { .. }
            | CheckpointError::OutputInvalid { .. }
            | CheckpointError::OutputsTooLarge { .. }
    )
}

/// The record of `part`'s first write.
fn first_record<W>(part: &Part<W>) -> Option<ExtendedSequenceNumber> {
    part.writes.first().map(|(record, _)| record.clone())
}
