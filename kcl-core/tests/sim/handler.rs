//! The simulated application under `Parallel`: a record handler that takes a random time,
//! sometimes fails or panics, and records every run; and the processor type the fleet's
//! factories hand out, plain or parallel.

use std::time::Duration;

use kcl_core::memory::next_event_seq;
use kcl_core::parallel::ParallelProcessor;
use kcl_core::{
    BoxError, Checkpointer, ExtendedSequenceNumber, InitializationInput, Parallel,
    ProcessRecordsInput, ProcessorFactory, Record, RecordHandler, RecordProcessor, ShardId,
};
use tokio::time::sleep;

use super::hands_off::HandsOff;
use super::poison::{Kind, Poison, REPLAY_MARK};
use super::processor::{Delivery, INJECTED_PANIC, Log, SimProcessor};

/// One run of the handler on one record.
#[derive(Debug, Clone)]
pub struct HandlerRun {
    pub instance: u64,
    pub worker: String,
    pub shard: ShardId,
    pub key: String,
    pub position: ExtendedSequenceNumber,
    pub start_seq: u64,
    /// When it returned, and whether with `Ok`; `None`: cancelled (or still running).
    pub end: Option<(u64, bool)>,
}

/// The handler of one processor instance.
#[derive(Debug)]
pub struct SimHandler {
    pub worker: String,
    pub instance: u64,
    pub shard: ShardId,
    pub log: Log,
    pub seed: u64,
    pub failure_rate: f64,
    pub poison: Option<std::sync::Arc<Poison>>,
}

impl SimHandler {
    /// A draw in [0, 1) that is the same whenever this instance handles this record.
    fn draw(&self, position: &ExtendedSequenceNumber, salt: u64) -> f64 {
        let h = super::hash(&format!(
            "{}/{}/{position}/{salt}",
            self.seed, self.instance
        ));
        #[allow(clippy::cast_precision_loss)]
        let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
        unit
    }
}

impl RecordHandler for SimHandler {
    fn handle(&self, record: Record) -> impl Future<Output = Result<(), BoxError>> + Send {
        // A parse before the handler's `async` block: its panic is outside the future.
        if let Some(poison) = &self.poison
            && poison.panics_early
            && !poison.outage_on()
            && !poison.is_fixed(&record.partition_key)
            && poison.kind(&self.shard, &record.position()) == Kind::Poison
        {
            // A try like any other, that failed at once.
            let start_seq = next_event_seq();
            self.log.lock().runs.push(HandlerRun {
                instance: self.instance,
                worker: self.worker.clone(),
                shard: self.shard.clone(),
                key: record.partition_key.clone(),
                position: record.position(),
                start_seq,
                end: Some((next_event_seq(), false)),
            });
            panic!("{INJECTED_PANIC}");
        }
        self.run(record)
    }
}

impl SimHandler {
    async fn run(&self, record: Record) -> Result<(), BoxError> {
        let position = record.position();
        let (index, replay) = {
            let mut log = self.log.lock();
            // A letter read back by a redrive (a record dead-lettered before may also be
            // delivered again live, after an operator's reset).
            let replay = record.explicit_hash_key.as_deref() == Some(REPLAY_MARK);
            let run = HandlerRun {
                instance: self.instance,
                worker: self.worker.clone(),
                shard: self.shard.clone(),
                key: record.partition_key.clone(),
                position: position.clone(),
                start_seq: next_event_seq(),
                end: None,
            };
            let runs = if replay {
                &mut log.replays
            } else {
                &mut log.runs
            };
            runs.push(run);
            (runs.len() - 1, replay)
        };
        // From instant to slow, so that keys overtake each other and crashes cut runs short.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let millis = (self.draw(&position, 1).powi(3) * 400.0) as u64;
        if self.failure_rate > 0.0 && self.draw(&position, 4) < 0.003 {
            // Stuck (a call that hangs) while every other key flows: what it holds behind
            // it is bounded (`held-bound`).
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let stuck = 15_000 + (self.draw(&position, 5) * 25_000.0) as u64;
            sleep(Duration::from_millis(stuck)).await;
        } else if self.draw(&position, 6) < 0.3 {
            // Waiting on a reply, which may arrive as a suspended host resumes.
            self.log.wait(Duration::from_millis(millis)).await;
        } else {
            sleep(Duration::from_millis(millis)).await;
        }
        let failure = match &self.poison {
            Some(poison) => poison.attempt(&self.log, &self.shard, &record),
            None => (self.draw(&position, 2) < self.failure_rate)
                .then(|| BoxError::from("injected handler error")),
        };
        let fails = failure.is_some();
        {
            let mut log = self.log.lock();
            let end = Some((next_event_seq(), !fails));
            if replay {
                log.replays[index].end = end;
            } else {
                log.runs[index].end = end;
            }
            if !fails && !replay {
                log.deliveries.push(Delivery {
                    seq: next_event_seq(),
                    at: tokio::time::Instant::now(),
                    worker: self.worker.clone(),
                    instance: self.instance,
                    shard: self.shard.clone(),
                    position: position.clone(),
                    keyed: true,
                });
            }
        }
        match failure {
            Some(error) if self.poison.is_some() => Err(error),
            Some(error) => {
                if self.draw(&position, 3) < 0.5 {
                    panic!("{INJECTED_PANIC}");
                }
                Err(error)
            }
            None => Ok(()),
        }
    }
}

/// A parallel processor for one instance: `Parallel` with its own handler, so that the
/// handler knows the instance it runs for.
pub fn parallel(
    handler: SimHandler,
    max_in_flight: usize,
    shard: &ShardId,
    poison: Option<&Poison>,
) -> AnyProcessor {
    let key_panics = handler.poison.clone().filter(|p| p.key_panics);
    let who = Who {
        instance: handler.instance,
        worker: handler.worker.clone(),
        log: handler.log.clone(),
    };
    let mut factory = Parallel::new(handler).max_in_flight(max_in_flight);
    if let Some(poison) = poison {
        factory = factory
            .on_failure(poison.policy.clone())
            .park_keys(poison.park);
    }
    if let Some(poison) = key_panics {
        // A `key_by` that cannot read a malformed record's key.
        let shard = shard.clone();
        factory = factory.key_by(move |record: &Record| {
            if poison.kind(&shard, &record.position()) == Kind::Permanent {
                panic!("{INJECTED_PANIC}");
            }
            record.partition_key.clone()
        });
    }
    AnyProcessor::Parallel(Box::new(factory.create(shard)), who)
}

/// What the fleet's factories hand out.
#[derive(Debug)]
pub enum AnyProcessor {
    Plain(Box<SimProcessor>),
    Parallel(Box<ParallelProcessor<SimHandler>>, Who),
    HandsOff(Box<HandsOff>),
}

/// Which instance of which worker a processor is, and where it journals.
#[derive(Debug)]
pub struct Who {
    pub instance: u64,
    pub worker: String,
    pub log: Log,
}

impl AnyProcessor {
    /// It failed or lost its lease: nothing it was handed is committed at the stop.
    fn ended(&self) {
        let (instance, log) = match self {
            Self::Plain(p) => {
                let (instance, _, log) = p.who();
                (instance, log)
            }
            Self::Parallel(_, who) => (who.instance, &who.log),
            Self::HandsOff(p) => (p.instance, &p.log),
        };
        log.lock().ended.insert(instance);
    }
}

impl RecordProcessor for AnyProcessor {
    async fn initialize(&mut self, input: &InitializationInput) -> Result<(), BoxError> {
        // Under which tenure it opened the shard (`acked-skipped`).
        let (instance, worker, log) = match self {
            Self::Plain(p) => p.who(),
            Self::Parallel(_, who) => (who.instance, who.worker.as_str(), &who.log),
            Self::HandsOff(p) => (p.instance, p.worker.as_str(), &p.log),
        };
        log.opened(instance, worker, &input.shard_id, input.fencing_token.0);
        match self {
            Self::Plain(p) => p.initialize(input).await,
            Self::Parallel(p, _) => p.initialize(input).await,
            Self::HandsOff(p) => p.initialize(input).await,
        }
    }

    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let result = match self {
            Self::Plain(p) => p.process_records(input, checkpointer).await,
            Self::Parallel(p, _) => p.process_records(input, checkpointer).await,
            Self::HandsOff(p) => p.process_records(input, checkpointer).await,
        };
        if result.is_err() {
            self.ended();
        }
        result
    }

    async fn lease_lost(&mut self) {
        self.ended();
        match self {
            Self::Plain(p) => p.lease_lost().await,
            Self::Parallel(p, _) => p.lease_lost().await,
            Self::HandsOff(p) => p.lease_lost().await,
        }
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), BoxError> {
        match self {
            Self::Plain(p) => p.shard_ended(checkpointer).await,
            Self::Parallel(p, _) => p.shard_ended(checkpointer).await,
            Self::HandsOff(p) => p.shard_ended(checkpointer).await,
        }
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        match self {
            Self::Plain(p) => p.shutdown_requested(checkpointer).await,
            Self::Parallel(p, _) => p.shutdown_requested(checkpointer).await,
            Self::HandsOff(p) => p.shutdown_requested(checkpointer).await,
        }
    }
}
