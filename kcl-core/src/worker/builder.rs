//! Building a [`Worker`]: the two backends first, then what has a default, the processors
//! last.
//!
//! The processor factory comes last, in [`WorkerBuilder::build`], for two reasons: a closure
//! passed there has its argument type inferred (`|shard| MyProcessor::new(shard)`), and the
//! [`ShutdownHandle`] exists before it, so a processor can be given the handle to stop its
//! own worker.

use std::sync::Arc;

use super::report::Report;
use super::table::Table;
use super::{ShutdownHandle, Worker};
use crate::config::WorkerConfig;
use crate::error::ConfigError;
use crate::failure::{DeadLetters, Exhausted};
use crate::lease::LeaseStore;
use crate::lease::load::Meters;
use crate::outputs::{Positions, Sink};
use crate::processor::{ProcessorFactory, RecordProcessor};
use crate::source::ShardSource;
use crate::types::{ShardId, WorkerId};

/// Builds a [`Worker`]; from [`Worker::builder`].
///
/// ```
/// # #[cfg(feature = "test-util")]
/// # fn demo() -> Result<(), kcl_core::ConfigError> {
/// use std::time::Duration;
/// use kcl_core::memory::{IdleProcessor, MemoryLeaseStore, MemoryStream};
/// use kcl_core::{Worker, WorkerConfig};
///
/// let builder = Worker::builder(MemoryStream::new(2), MemoryLeaseStore::new())
///     .id("orders-worker-1")
///     .config(WorkerConfig::default().failover_time(Duration::from_secs(5)));
/// let stop = builder.shutdown_handle(); // before any processor exists
/// let worker = builder.build(|_shard| IdleProcessor)?;
/// # let _ = (stop, worker);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
#[doc(alias = "ConfigsBuilder")]
pub struct WorkerBuilder<S, L> {
    source: S,
    store: L,
    id: Option<WorkerId>,
    config: WorkerConfig,
    handle: ShutdownHandle,
    dead_letters: Option<DeadLetters>,
    positions: Option<Sink>,
}

impl<S: ShardSource, L: LeaseStore> Worker<S, L, ()> {
    /// Starts building a worker that reads `source` and keeps its leases in `store`.
    pub fn builder(source: S, store: L) -> WorkerBuilder<S, L> {
        WorkerBuilder {
            source,
            store,
            id: None,
            config: WorkerConfig::default(),
            handle: ShutdownHandle::default(),
            dead_letters: None,
            positions: None,
        }
    }
}

impl<S: ShardSource, L: LeaseStore> WorkerBuilder<S, L> {
    /// The worker's id, its `leaseOwner` in the lease table: unique in the fleet, at any
    /// instant. Default: [`WorkerId::for_this_process`].
    pub fn id(mut self, id: impl Into<WorkerId>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The configuration (default: [`WorkerConfig::default`]); validated by `build`.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Where records go once their failure policy gives them up
    /// ([`Exhausted::DeadLetter`](crate::failure::Exhausted::DeadLetter), on
    /// [`WorkerConfig::failure`] or [`Parallel::on_failure`](crate::Parallel::on_failure)).
    /// A policy that dead-letters without a sink is refused by `build`.
    pub fn dead_letters(mut self, letters: DeadLetters) -> Self {
        self.dead_letters = Some(letters);
        self
    }

    /// The sink that keeps each shard's position with the outputs committed into it
    /// ([`Positions`], for a [`Transact`](crate::outputs::Transact) whose
    /// [`keeps_position`](crate::outputs::Transact::keeps_position) is true): before a
    /// processor starts on a shard, the sink is fenced for the new tenure and the shard
    /// resumes from the later of the lease's checkpoint and the sink's position (see
    /// [`outputs`](crate::outputs)).
    pub fn positions(mut self, sink: impl Positions) -> Self {
        self.positions = Some(Sink(Arc::new(sink)));
        self
    }

    /// The handle that stops the worker, before it is built: for processors, which the
    /// factory creates, or a task that watches something else.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// The worker, with `factory` making one processor per shard it takes (a closure over
    /// the shard id). Fails if the configuration or the id is invalid, naming the key.
    pub fn build<F, P>(self, factory: F) -> Result<Worker<S, L, F>, ConfigError>
    where
        F: Fn(&ShardId) -> P + Send + Sync + 'static,
        P: RecordProcessor,
    {
        self.build_with(factory)
    }

    /// As [`build`](Self::build), for a factory that implements [`ProcessorFactory`] itself.
    pub fn build_with<F: ProcessorFactory>(
        self,
        factory: F,
    ) -> Result<Worker<S, L, F>, ConfigError> {
        self.config.validate()?;
        let id = self.id.unwrap_or_else(WorkerId::for_this_process);
        if id.as_str().trim().is_empty() {
            return Err(ConfigError {
                key: "worker_id",
                reason: "must not be empty".into(),
            });
        }
        factory.check()?;
        if factory.needs_positions() && self.positions.is_none() {
            return Err(ConfigError {
                key: "Parallel::with_outputs",
                reason: "commits into a sink that keeps its own position, but the worker was \
                         not given it (WorkerBuilder::positions)"
                    .into(),
            });
        }
        if self.dead_letters.is_none() {
            let needs = [
                (
                    "failure.exhausted",
                    self.config.failure.exhausted == Exhausted::DeadLetter,
                ),
                ("Parallel::on_failure", factory.needs_dead_letters()),
            ];
            for (key, needed) in needs {
                if needed {
                    return Err(ConfigError {
                        key,
                        reason:
                            "dead-letters, but the worker has no sink (WorkerBuilder::dead_letters)"
                                .into(),
                    });
                }
            }
        }
        Ok(Worker {
            dead_letters: self.dead_letters,
            positions: self.positions,
            table: Table {
                me: id,
                meters: Meters::new(self.config.balancing.capacity_milli()),
                config: Arc::new(self.config),
                store: Arc::new(self.store),
            },
            source: Arc::new(self.source),
            factory: Arc::new(factory),
            handle: self.handle,
            report: Report::default(),
        })
    }
}
