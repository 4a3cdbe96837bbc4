//! # kcl-core
//!
//! The backend-agnostic core of kcl, a Kinesis Client Library for async Rust: workers share
//! a stream's shards through leases in a lease table, each held shard feeds one
//! [`RecordProcessor`] in order, and processors checkpoint through writes fenced by the lease.
//!
//! This crate has no AWS dependency. `kcl-aws` implements [`ShardSource`] and [`LeaseStore`]
//! on Kinesis and DynamoDB; the [`memory`] module (feature `test-util`) implements both in
//! process, with fault injection, for tests and simulation.
//!
//! Records are read by polling, or with enhanced fan-out ([`Retrieval::FanOut`]); KPL
//! aggregates are split into their user records ([`aggregation`]); one worker can consume
//! several streams ([`multi_stream`]), with KCL Java's lease keys.
//!
//! ## Quick start
//!
//! ```
//! # #[cfg(feature = "test-util")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
//! use kcl_core::{BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker, WorkerConfig};
//!
//! struct Count(usize);
//!
//! impl RecordProcessor for Count {
//!     async fn process_records(
//!         &mut self,
//!         input: ProcessRecordsInput,
//!         checkpointer: &mut Checkpointer,
//!     ) -> Result<(), BoxError> {
//!         self.0 += input.records.len();
//!         checkpointer.checkpoint().await?;
//!         Ok(())
//!     }
//! }
//!
//! let stream = MemoryStream::new(4);
//! stream.put("key", "hello");
//! let store = MemoryLeaseStore::new();
//! let worker = Worker::new("worker-1", WorkerConfig::default(), stream, store, |_: &ShardId| Count(0))?;
//! let shutdown = worker.shutdown_handle();
//! let running = tokio::spawn(worker.run());
//! shutdown.shutdown();
//! running.await??;
//! # Ok(())
//! # }
//! ```
//!
//! ## Coming from KCL Java
//!
//! The same concepts under Rust names (each of ours also answers to the Java name in the
//! documentation's search):
//!
//! | KCL Java | kcl |
//! |---|---|
//! | `Scheduler` | `Worker` (`run_until_signal`, `run_until`, `ShutdownHandle`) |
//! | `ConfigsBuilder`, `LeaseManagementConfig`, `CoordinatorConfig`, `RetrievalConfig` | `Worker::builder` (`WorkerBuilder`) and `WorkerConfig` |
//! | `ShardRecordProcessor` (1.x: `IRecordProcessor`) | `RecordProcessor` |
//! | `ShardRecordProcessorFactory` | `ProcessorFactory` (any `Fn(&ShardId) -> P`) |
//! | `RecordProcessorCheckpointer` | `Checkpointer` |
//! | `PreparedCheckpointer` | `PreparedCheckpoint` |
//! | `InitializationInput`, `ProcessRecordsInput` | `InitializationInput`, `ProcessRecordsInput` |
//! | `leaseLost(LeaseLostInput)`, `shardEnded(ShardEndedInput)`, `shutdownRequested(ShutdownRequestedInput)` | `lease_lost()`, `shard_ended(checkpointer)`, `shutdown_requested(checkpointer)` |
//! | `KinesisClientRecord` | `Record` |
//! | `ExtendedSequenceNumber` | `ExtendedSequenceNumber` |
//! | `InitialPositionInStream`, `InitialPositionInStreamExtended` | `InitialPosition` |
//! | `Lease`, `LeaseRefresher` (`DynamoDBLeaseRefresher`) | `Lease`, `LeaseStore` (`kcl_aws::DynamoDbLeaseStore`) |
//! | `PollingConfig` / `KinesisDataFetcher` | `kcl_aws::KinesisShardSource` |
//! | `FanOutConfig` / `FanOutRecordsPublisher` | `Retrieval::FanOut` (`WorkerConfig::retrieval`) |
//! | `MultiStreamTracker`, `StreamConfig`, `StreamIdentifier` | `multi_stream::{StreamTracker, StreamConfig, StreamId}` (`Streams` for a list changed at run time) |
//! | `FormerStreamsLeasesDeletionStrategy` | `MultiStreamSource::removal_grace` |
//! | `WorkerStateChangeListener` | `Worker::status` (a `watch` of `Status`) |
//! | `Scheduler.startGracefulShutdown()` | `ShutdownHandle::shutdown()` |
//!
//! ## Guarantees
//! - At least once: a record is delivered again after a failover unless it was checkpointed.
//!   A `LATEST` start is pinned in the lease at its first open, so nothing written after it is
//!   skipped by a later reopen, whoever makes it; an `AT_TIMESTAMP` start is pinned likewise.
//! - In order within a shard, to one processor at a time; a child shard starts only after
//!   every parent was processed to its end (or aged out of the stream).
//! - Every lease and checkpoint write is conditional on the lease counter; a worker that lost
//!   a lease cannot checkpoint it, and delivers nothing once the lease could be expired: a
//!   processor hook still running then is dropped at its next `.await`.
//! - Renewals do not depend on the processor yielding; every backend call has a deadline, so
//!   shutdown meets its own.
//!
//! The README's Guarantees section states each precisely; the fleet simulation checks them.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod aggregation;
mod checkpoint;
mod config;
pub mod coordination;
mod error;
pub mod lease;
pub mod metrics;
#[doc(hidden)]
pub mod multi_stream;
pub mod mutation;
mod processor;
mod source;
mod task;
mod types;
mod worker;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod memory;

pub use checkpoint::{Checkpointer, PreparedCheckpoint};
pub use config::{Coordination, Liveness, MAX_DURATION, Retrieval, WorkerConfig};
pub use error::{
    BackendError, BoxError, CheckpointError, ConfigError, Error, ErrorKind, error_chain,
};
pub use lease::{CheckpointUpdate, Lease, LeaseStore, TableFeatures};
pub use processor::{InitializationInput, ProcessRecordsInput, ProcessorFactory, RecordProcessor};
pub use source::{RecordBatch, Shard, ShardIterator, ShardSource, Subscription, SubscriptionEvent};
pub use types::{
    Checkpoint, ConsumerId, ExtendedSequenceNumber, HashKeyRange, InitialPosition, Record,
    SequenceNumber, ShardId, StartingPosition, WorkerId,
};
pub use worker::{
    Phase, Problem, ProblemKind, ShutdownHandle, Signals, Status, Worker, WorkerBuilder,
};
