//! The simulated application: a processor that records every delivery and checkpoint attempt.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kcl_core::memory::next_event_seq;
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, ExtendedSequenceNumber, ProcessRecordsInput,
    RecordProcessor, SequenceNumber, ShardId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::handler::{AnyProcessor, SimHandler, parallel};
use super::hands_off::HandsOff;
use super::outputs::Committer;
use super::poison::Poison;

/// One record handed to a processor.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub seq: u64,
    pub at: Instant,
    pub worker: String,
    pub instance: u64,
    pub shard: ShardId,
    /// The user record's position (a KPL aggregate's user records share a sequence number).
    pub position: ExtendedSequenceNumber,
    /// Handled under `Parallel`: logged when its handler finished, in order per key only.
    pub keyed: bool,
}

/// A batch's work completed (its side effects happened), after every `.await` inside it.
#[derive(Debug, Clone)]
pub struct Effect {
    pub seq: u64,
    pub at: Instant,
    pub worker: String,
    pub shard: ShardId,
}

/// One checkpoint call and how it ended.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub start_seq: u64,
    /// When it returned.
    pub end_seq: u64,
    pub worker: String,
    pub instance: u64,
    pub shard: ShardId,
    pub ok: bool,
}

/// A processor instance's birth.
#[derive(Debug, Clone)]
pub struct Instance {
    pub created_seq: u64,
    /// When `initialize` was called, and in which tenure; `None` if it never was.
    pub opened: Option<Opened>,
}

/// A processor instance's `initialize`: where it reads, and under which tenure (its fencing
/// token, the counter its holder's take wrote).
#[derive(Debug, Clone)]
pub struct Opened {
    pub seq: u64,
    pub worker: String,
    pub shard: ShardId,
    pub fence: u64,
}

/// One run of the fleet's singleton task: who, from when, and when it last executed
/// anything (a process frozen meanwhile executes nothing; a task dropped at its next `.await`
/// executes nothing more).
#[derive(Debug, Clone)]
pub struct SingletonRun {
    pub worker: String,
    pub start: Instant,
    pub last: Instant,
    /// The fencing token it ran with.
    pub token: u64,
}

/// A message sent to the fleet's singleton: its text, and how `send` ended.
#[derive(Debug, Clone)]
pub struct Send {
    pub message: String,
    /// `None`: delivered (`Ok`); `Some(maybe_delivered)`: an error.
    pub failed: Option<bool>,
}

/// A message an instance's inbox took: where, when.
#[derive(Debug, Clone)]
pub struct Acceptance {
    pub worker: String,
    pub message: String,
    pub at: Instant,
}

/// A worker stopped gracefully and started again under the same id.
#[derive(Debug, Clone)]
pub struct Restart {
    pub worker: String,
    /// When its stop was asked for (its singleton candidacies first, then the worker).
    pub stopped: Instant,
    /// When its worker had stopped (its leases kept).
    pub down: Instant,
    /// When it started again; `None` if the run ended first.
    pub back: Option<Instant>,
}

/// One run of the fleet's periodic job: who, for which period, when.
#[derive(Debug, Clone)]
pub struct PeriodicRun {
    pub worker: String,
    pub index: u64,
    pub at: Instant,
}

#[derive(Debug, Default)]
pub struct Journal {
    pub singleton_runs: Vec<SingletonRun>,
    pub periodic_runs: Vec<PeriodicRun>,
    pub sends: Vec<Send>,
    pub acceptances: Vec<Acceptance>,
    /// Workers crashed, and when.
    pub crashes: Vec<(String, Instant)>,
    /// Workers stopped gracefully, and when.
    pub leaves: Vec<(String, Instant)>,
    /// Of those, workers stopped for a restart under the same id (`restart_grace`).
    pub restarts: Vec<Restart>,
    /// While some fault was on (a freeze, store faults, a partition): from, until.
    pub disturbed: Vec<(Instant, Instant)>,
    /// Of those, what befell one worker (a freeze, a partition): who, from, until.
    pub worker_disturbed: Vec<(String, Instant, Instant)>,
    /// Of those, the store's faults (everyone's calls): from, until.
    pub store_faulted: Vec<(Instant, Instant)>,
    pub deliveries: Vec<Delivery>,
    /// Handler runs under `Parallel`.
    pub runs: Vec<super::handler::HandlerRun>,
    pub effects: Vec<Effect>,
    pub attempts: Vec<Attempt>,
    /// Checkpoints past the last delivered record that were accepted (each a violation).
    pub accepted_beyond: Vec<String>,
    /// Checkpoints past the last delivered record tried.
    pub beyond_tried: usize,
    pub instances: BTreeMap<u64, Instance>,
    /// What the workers reported (`Status::problems`), and the fleet's room for leases.
    pub problems: super::problems::Sampled,
    /// Dead letters the sink accepted, with when.
    pub letters: Vec<(u64, kcl_core::failure::DeadLetter)>,
    /// Puts the sink refused.
    pub sink_refusals: usize,
    /// Tries of flaky records so far, fleet-wide.
    pub flaky_tries: BTreeMap<String, u32>,
    /// Deliveries a batch processor saw beyond what a bisect may cost (`bisect-bound`).
    pub over_delivered: Vec<String>,
    /// Records (`shard/position`) that failed a try because the seed's outage was on.
    pub outage_failed: std::collections::BTreeSet<String>,
    /// When the seed's outage began and ended (event sequence numbers).
    pub outage: Option<(u64, Option<u64>)>,
    /// Redrives asked: when, the parked key (hex), its partition key.
    pub redrives: Vec<(u64, String, String)>,
    /// Letters a replay removed from the sink, with when.
    pub removed: Vec<(u64, kcl_core::failure::DeadLetter)>,
    /// Handler runs replaying a letter (a redrive through the holder): not deliveries.
    pub replays: Vec<super::handler::HandlerRun>,
    /// Stretches of outputs one transaction could not hold, tried (`sim/outputs.rs`).
    pub large_stretches: usize,
    /// Every open of the sink that keeps positions, as the worker saw it return
    /// (`sim/positions.rs`).
    pub sink_opens: Vec<super::positions::SinkOpen>,
    /// What the operator's hand did in a seed with such a sink (`sim/positions.rs`).
    pub sink_meddling: Vec<super::positions::Meddling>,
    /// Processor instances that failed or lost their lease (`sim/positions.rs` drains until
    /// what they were handed is committed by another).
    pub ended: std::collections::BTreeSet<u64>,
}

/// The journal, and the fleet's host: work waiting on I/O wakes as a suspended host resumes.
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<Journal>>, Arc<Notify>);

impl Log {
    pub fn lock(&self) -> MutexGuard<'_, Journal> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves when the host resumes from a suspend (see `schedule`), as a reply that was
    /// on its way does.
    pub async fn resumed(&self) {
        self.1.notified().await;
    }

    /// The host resumes: everything waiting in [`resumed`](Self::resumed) is woken.
    pub fn resume(&self) {
        self.1.notify_waiters();
    }

    /// Waits `d`, or less if the host resumes from a suspend meanwhile (work waiting on a
    /// reply that arrives as the host thaws).
    pub async fn wait(&self, d: Duration) {
        tokio::select! {
            biased;
            () = self.resumed() => {}
            () = tokio::time::sleep(d) => {}
        }
    }

    /// Starts a singleton run; returns its index.
    pub fn run_started(&self, worker: &str, token: u64) -> usize {
        let mut j = self.lock();
        let now = Instant::now();
        j.singleton_runs.push(SingletonRun {
            worker: worker.to_owned(),
            start: now,
            last: now,
            token,
        });
        j.singleton_runs.len() - 1
    }

    /// Processor `instance` of `worker` opened `shard` under the tenure of fencing token
    /// `fence` (its `initialize`).
    pub fn opened(&self, instance: u64, worker: &str, shard: &ShardId, fence: u64) {
        if let Some(i) = self.lock().instances.get_mut(&instance) {
            i.opened = Some(Opened {
                seq: next_event_seq(),
                worker: worker.to_owned(),
                shard: shard.clone(),
                fence,
            });
        }
    }

    /// The periodic job runs for period `index`.
    pub fn period_ran(&self, worker: &str, index: u64) {
        self.lock().periodic_runs.push(PeriodicRun {
            worker: worker.to_owned(),
            index,
            at: Instant::now(),
        });
    }

    /// The singleton run `index` executes something now.
    pub fn run_active(&self, index: usize) {
        self.lock().singleton_runs[index].last = Instant::now();
    }
}

#[derive(Debug, Clone, Copy)]
enum Style {
    EveryBatch,
    EveryNth(u32),
    TwoPhase,
    /// Only in `shutdown_requested` and `shard_ended`.
    OnlyWhenStopping,
    /// At a record of the batch drawn at random (inside a KPL aggregate too), after trying,
    /// one batch in three, a position past what was delivered, which must be refused.
    Explicit,
}

pub const INJECTED_PANIC: &str = "injected processor panic";

/// Builds processors for one worker.
#[derive(Debug, Clone)]
pub struct Factory {
    pub worker: String,
    pub log: Log,
    pub seed: u64,
    pub instances: Arc<AtomicU64>,
    pub failure_rate: f64,
    /// Records in flight per shard under `Parallel`; `None`: the plain processor.
    pub parallel: Option<usize>,
    /// The seed's failing records and policy, if it has them.
    pub poison: Option<Arc<Poison>>,
    /// The worker's handle of the store or of the sink that keeps positions, when its
    /// processors commit outputs with their checkpoints (`sim/outputs.rs`).
    pub outputs: Option<super::outputs::Target>,
}

impl Factory {
    pub fn create(&self, shard: &ShardId) -> AnyProcessor {
        let instance = self.instances.fetch_add(1, Ordering::Relaxed);
        self.log.lock().instances.insert(
            instance,
            Instance {
                created_seq: next_event_seq(),
                opened: None,
            },
        );
        if let Some(n) = self.parallel {
            let mut rng = StdRng::seed_from_u64(self.seed ^ instance ^ 0x4a4d_0ff5);
            // Processors of their own know nothing of parked keys: not under a policy.
            if rng.random_ratio(1, 3) && self.poison.is_none() {
                return AnyProcessor::HandsOff(Box::new(HandsOff {
                    worker: self.worker.clone(),
                    instance,
                    shard: shard.clone(),
                    log: self.log.clone(),
                    rng,
                    delivered: Vec::new(),
                }));
            }
            let handler = SimHandler {
                worker: self.worker.clone(),
                instance,
                shard: shard.clone(),
                log: self.log.clone(),
                seed: self.seed,
                // Per record rather than per batch.
                failure_rate: self.failure_rate / 10.0,
                poison: self.poison.clone(),
            };
            return parallel(handler, n, shard, self.poison.as_deref());
        }
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ instance.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let style = match rng.random_range(0..5) {
            0 => Style::EveryBatch,
            1 => Style::EveryNth(rng.random_range(2..5)),
            2 => Style::TwoPhase,
            3 => Style::Explicit,
            _ => Style::OnlyWhenStopping,
        };
        AnyProcessor::Plain(Box::new(SimProcessor {
            worker: self.worker.clone(),
            instance,
            shard: shard.clone(),
            log: self.log.clone(),
            rng,
            style,
            batches: 0,
            failure_rate: self.failure_rate,
            poison: self.poison.clone(),
            seen: BTreeMap::new(),
            committer: self
                .outputs
                .clone()
                .map(|store| Committer::new(store, self.log.clone())),
        }))
    }
}

#[derive(Debug)]
pub struct SimProcessor {
    worker: String,
    instance: u64,
    shard: ShardId,
    log: Log,
    rng: StdRng,
    style: Style,
    batches: u32,
    failure_rate: f64,
    poison: Option<Arc<Poison>>,
    /// Under a policy: per record, deliveries to this instance and whether one succeeded.
    seen: BTreeMap<ExtendedSequenceNumber, (u32, bool)>,
    /// Its outputs not committed yet, when it commits outputs with its checkpoints.
    committer: Option<Committer>,
}

impl SimProcessor {
    /// Its instance, its worker and its journal.
    pub fn who(&self) -> (u64, &str, &Log) {
        (self.instance, &self.worker, &self.log)
    }

    /// `Style::Explicit`: first, now and then, a position past the last delivered record
    /// (the next user record of its aggregate, or the next sequence number), which must be
    /// refused; then a delivered position drawn at random.
    async fn explicit(
        &mut self,
        checkpointer: &mut Checkpointer,
        positions: &[ExtendedSequenceNumber],
    ) -> Result<(), CheckpointError> {
        let Some(last) = positions.last() else {
            return Ok(());
        };
        if self.rng.random_ratio(1, 3) {
            let beyond = if self.rng.random_bool(0.5) {
                ExtendedSequenceNumber {
                    sequence: last.sequence.clone(),
                    sub_sequence: last.sub_sequence + 1,
                }
            } else {
                let next = last.sequence.as_str().parse::<u128>().unwrap_or(0) + 1;
                ExtendedSequenceNumber::new(SequenceNumber::from(next))
            };
            self.log.lock().beyond_tried += 1;
            let accepted = match &mut self.committer {
                Some(committer) => committer.beyond(checkpointer, beyond.clone()).await,
                None => checkpointer.checkpoint_at(beyond.clone()).await,
            };
            if accepted.is_ok() {
                self.log.lock().accepted_beyond.push(format!(
                    "checkpoints: {} on {} accepted {beyond} past the last delivered {last}",
                    self.worker, self.shard
                ));
            }
        }
        let at = positions[self.rng.random_range(0..positions.len())].clone();
        self.checkpoint(checkpointer, false, Some(at)).await
    }

    async fn checkpoint(
        &mut self,
        checkpointer: &mut Checkpointer,
        two_phase: bool,
        at: Option<ExtendedSequenceNumber>,
    ) -> Result<(), CheckpointError> {
        let start_seq = next_event_seq();
        let result = if let Some(committer) = &mut self.committer {
            committer.commit(checkpointer, two_phase, at).await
        } else if let Some(position) = at {
            checkpointer.checkpoint_at(position).await
        } else if two_phase {
            match checkpointer.prepare_checkpoint(None).await {
                Ok(prepared) => checkpointer.commit(prepared).await,
                Err(CheckpointError::NothingDelivered { .. }) => checkpointer.checkpoint().await,
                Err(e) => Err(e),
            }
        } else {
            checkpointer.checkpoint().await
        };
        self.log.lock().attempts.push(Attempt {
            start_seq,
            end_seq: next_event_seq(),
            worker: self.worker.clone(),
            instance: self.instance,
            shard: self.shard.clone(),
            ok: result.is_ok(),
        });
        result
    }
}

/// Levels of a bisect of the largest batch: 40 stream records (`max_records`) of up to 6 user
/// records each (KPL aggregates), ⌈log2 240⌉.
const BISECT_LEVELS: u32 = 8;

impl SimProcessor {
    /// A batch under the seed's failure policy: it fails at its first failing record
    /// (naming it, or not); records count as processed (logged as delivered) only in a hook
    /// that succeeded, or before the named one.
    async fn under_policy(
        &mut self,
        poison: &Poison,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let records = input.records().to_vec();
        for r in &records {
            // A bisect delivers a record at most once per level, and a failing one its tries
            // more (with named failures, a record is delivered again after each failure
            // before it: only the first rule holds).
            // A fine record that failed in the seed's outage had its tries as a failing one.
            let outage = || {
                let id = format!("{}/{}", self.shard, r.position());
                self.log.lock().outage_failed.contains(&id)
            };
            let bound = match poison.kind(&self.shard, &r.position()) {
                _ if poison.names => u32::MAX,
                super::poison::Kind::Fine if !outage() => 1 + BISECT_LEVELS,
                _ => 1 + BISECT_LEVELS + super::poison::ATTEMPTS,
            };
            let (count, ok) = self.seen.entry(r.position()).or_default();
            *count += 1;
            if *ok || *count > bound {
                self.log.lock().over_delivered.push(format!(
                    "bisect-bound: instance {} of {} on {} got {} a {} time{}",
                    self.instance,
                    self.worker,
                    self.shard,
                    r.position(),
                    count,
                    if *ok { " after it succeeded" } else { "" }
                ));
            }
        }
        self.log
            .wait(Duration::from_millis(self.rng.random_range(0..60)))
            .await;
        if let Some((i, error)) = poison.first_failing(&self.log, &self.shard, &records) {
            if poison.names {
                self.processed(&records[..i]);
                self.succeeded(&records[..i]);
            } else if i > 0 && self.rng.random_ratio(1, 2) {
                // Processes and checkpoints the records before the failing one in the
                // failing hook: a bisect must deliver none of them again (the one standing
                // at the checkpoint included). If the checkpoint fails, it names the record
                // instead, so that they are not delivered again either.
                self.processed(&records[..i]);
                self.succeeded(&records[..i]);
                let at = Some(records[i - 1].position());
                if self.checkpoint(checkpointer, false, at).await.is_err() {
                    return Err(kcl_core::failure::BatchFailed::at(&records[i], error).into());
                }
                return Err(error);
            }
            return Err(poison.batch_error(&records, i, error));
        }
        self.processed(&records);
        self.succeeded(&records);
        // A checkpoint that fails is tried again after the next batch: the batch succeeded
        // (returning its error would have it delivered again, which is at-least-once but
        // breaks `order`).
        let _ = self.checkpoint(checkpointer, false, None).await;
        Ok(())
    }

    /// `records` succeeded in this instance: delivering them again breaks `bisect-bound`.
    fn succeeded(&mut self, records: &[kcl_core::Record]) {
        for r in records {
            if let Some(seen) = self.seen.get_mut(&r.position()) {
                seen.1 = true;
            }
        }
    }

    /// `records` were processed (their effects happened): logged as delivered.
    fn processed(&self, records: &[kcl_core::Record]) {
        let mut log = self.log.lock();
        for r in records {
            log.deliveries.push(Delivery {
                seq: next_event_seq(),
                at: Instant::now(),
                worker: self.worker.clone(),
                instance: self.instance,
                shard: self.shard.clone(),
                position: r.position(),
                keyed: false,
            });
        }
    }
}

impl RecordProcessor for SimProcessor {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        if let Some(poison) = self.poison.clone() {
            return self.under_policy(&poison, input, checkpointer).await;
        }
        let positions: Vec<_> = input
            .records()
            .iter()
            .map(kcl_core::Record::position)
            .collect();
        self.processed(input.records());
        if let Some(committer) = &mut self.committer {
            for position in &positions {
                committer.produced(&self.shard, position);
            }
        }
        // Work that takes time: a frozen process can stop in the middle of it.
        let work = Duration::from_millis(self.rng.random_range(0..60));
        self.log.wait(work).await;
        self.batches += 1;
        if self.failure_rate > 0.0 && self.rng.random_bool(self.failure_rate) {
            if self.rng.random_bool(0.5) {
                self.log.lock().ended.insert(self.instance);
                panic!("{INJECTED_PANIC}");
            }
            return Err("injected processor error".into());
        }
        match self.style {
            Style::EveryBatch => self.checkpoint(checkpointer, false, None).await?,
            Style::EveryNth(n) if self.batches.is_multiple_of(n) => {
                self.checkpoint(checkpointer, false, None).await?;
            }
            Style::EveryNth(_) | Style::OnlyWhenStopping => {}
            Style::TwoPhase => self.checkpoint(checkpointer, true, None).await?,
            Style::Explicit => self.explicit(checkpointer, &positions).await?,
        }
        self.log.lock().effects.push(Effect {
            seq: next_event_seq(),
            at: Instant::now(),
            worker: self.worker.clone(),
            shard: self.shard.clone(),
        });
        Ok(())
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        self.checkpoint(checkpointer, false, None).await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.checkpoint(checkpointer, false, None).await?;
        Ok(())
    }
}
