//! The simulated application that holds its batches as `ack`'s docs did not foresee: each
//! batch is taken to acknowledge later and finished by other tasks, late and out of delivery
//! order (a task per record, or one task in an order of its own), or now and then handled in
//! the hook as an ordinary processor does; and the hook asks `checkpoint_at` for positions
//! drawn from everything delivered, acknowledgements outstanding or not.
//!
//! Its records are journaled as deliveries in the hook (where fencing applies) and as
//! handler runs from delivery to finish, so that the `watermark` and `held-bound` invariants
//! judge them as they judge `Parallel`'s. Each run has a key of its own: nothing orders them.

use std::time::Duration;

use kcl_core::memory::next_event_seq;
use kcl_core::{
    BoxError, CheckpointError, Checkpointer, ExtendedSequenceNumber, ProcessRecordsInput,
    RecordProcessor, ShardId,
};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::{Instant, sleep};

use super::handler::HandlerRun;
use super::processor::{Attempt, Delivery, Log};

/// How a batch is held.
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// Each record finished by a task of its own, after its own delay.
    TaskPerRecord,
    /// One task finishes the batch's records in an order of its own.
    Shuffled,
    /// Handled in the hook, as an ordinary processor does: finished when the batch drops.
    InHook,
}

#[derive(Debug)]
pub struct HandsOff {
    pub worker: String,
    pub instance: u64,
    pub shard: ShardId,
    pub log: Log,
    pub rng: StdRng,
    /// Every position delivered to this instance, in order.
    pub delivered: Vec<ExtendedSequenceNumber>,
}

impl HandsOff {
    /// Journals the batch as delivered, and a run per record; returns the runs' indices.
    fn journal(&self, positions: &[ExtendedSequenceNumber]) -> Vec<usize> {
        let mut log = self.log.lock();
        positions
            .iter()
            .map(|position| {
                log.deliveries.push(Delivery {
                    seq: next_event_seq(),
                    at: Instant::now(),
                    worker: self.worker.clone(),
                    instance: self.instance,
                    shard: self.shard.clone(),
                    position: position.clone(),
                    keyed: false,
                });
                log.runs.push(HandlerRun {
                    instance: self.instance,
                    worker: self.worker.clone(),
                    shard: self.shard.clone(),
                    key: format!("hands-off {position}"),
                    position: position.clone(),
                    start_seq: next_event_seq(),
                    end: None,
                });
                log.runs.len() - 1
            })
            .collect()
    }

    /// A checkpoint at a delivered position drawn at random, acknowledgements outstanding or
    /// not: refused (`Unfinished`) past the watermark.
    async fn checkpoint_somewhere(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        if self.delivered.is_empty() || !self.rng.random_ratio(1, 2) {
            return Ok(());
        }
        let at = self.delivered[self.rng.random_range(0..self.delivered.len())].clone();
        let start_seq = next_event_seq();
        let result = cp.checkpoint_at(at).await;
        self.log.lock().attempts.push(Attempt {
            start_seq,
            end_seq: next_event_seq(),
            worker: self.worker.clone(),
            instance: self.instance,
            shard: self.shard.clone(),
            ok: result.is_ok(),
        });
        match result {
            Ok(())
            | Err(CheckpointError::Unfinished { .. } | CheckpointError::Backwards { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Marks run `index` finished with `Ok`: before its `Ack` is done or its batch dropped.
fn finished(log: &Log, index: usize) {
    log.lock().runs[index].end = Some((next_event_seq(), true));
}

impl RecordProcessor for HandsOff {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        cp: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let positions: Vec<_> = input
            .records()
            .iter()
            .map(kcl_core::Record::position)
            .collect();
        // Asked before this batch's own positions are known to the draw: earlier batches,
        // whose tasks may not have finished.
        self.checkpoint_somewhere(cp).await?;
        let runs = self.journal(&positions);
        self.delivered.extend(positions);
        let hold = match self.rng.random_range(0..5) {
            0 | 1 => Hold::TaskPerRecord,
            2 | 3 => Hold::Shuffled,
            _ => Hold::InHook,
        };
        // Late, and out of order: up to 0.8 s, drawn per record.
        let mut delays: Vec<Duration> = runs
            .iter()
            .map(|_| Duration::from_millis(self.rng.random_range(0..800)))
            .collect();
        let log = self.log.clone();
        match hold {
            Hold::InHook => {
                sleep(delays.iter().copied().max().unwrap_or_default() / 8).await;
                for index in runs {
                    finished(&log, index);
                }
                // Processed: the batch drops at the end of the hook.
            }
            Hold::TaskPerRecord => {
                let pairs = input.acknowledge_later().into_iter();
                for ((_, ack), (index, delay)) in pairs.zip(runs.into_iter().zip(delays)) {
                    let log = log.clone();
                    tokio::spawn(async move {
                        sleep(delay).await;
                        finished(&log, index);
                        ack.done();
                    });
                }
            }
            Hold::Shuffled => {
                let mut work: Vec<_> = input.acknowledge_later().into_iter().zip(runs).collect();
                // An order of its own: sorted by the drawn delays.
                let mut order: Vec<usize> = (0..work.len()).collect();
                order.sort_by_key(|i| delays[*i]);
                delays.sort();
                let mut slots: Vec<_> = work.drain(..).map(Some).collect();
                let work: Vec<_> = order.into_iter().filter_map(|i| slots[i].take()).collect();
                tokio::spawn(async move {
                    let mut waited = Duration::ZERO;
                    for (((_, ack), index), delay) in work.into_iter().zip(delays) {
                        sleep(delay.saturating_sub(waited)).await;
                        waited = delay;
                        finished(&log, index);
                        ack.done();
                    }
                });
            }
        }
        // And once the batch is on its way, a position of it or before.
        self.checkpoint_somewhere(cp).await
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), BoxError> {
        // The worker waited for what was in flight: this writes the watermark.
        cp.checkpoint().await?;
        Ok(())
    }
}
