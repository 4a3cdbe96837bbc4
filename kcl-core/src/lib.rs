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
//!         input: ProcessRecordsInput<'_>,
//!         checkpointer: &mut Checkpointer,
//!     ) -> Result<(), BoxError> {
//!         self.0 += input.records().len();
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
//! The lease table is KCL Java's, and the API has the same concepts under Rust names: the main
//! types answer to their Java names in this documentation's search (`Scheduler` finds
//! `Worker`). The whole name mapping, what differs and how a fleet moves over:
//! [docs/kcl-java.md](https://github.com/kcl-rs/kcl/blob/main/docs/kcl-java.md).
//!
//! ## Guarantees
//!
//! At least once, in order within a shard, fenced checkpoints, failover within a taker cycle
//! of the failover time, bounded calls and shutdown, singletons never run twice at once: each
//! stated precisely, with how the fleet simulation checks it, in
//! [docs/guarantees.md](https://github.com/kcl-rs/kcl/blob/main/docs/guarantees.md).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod ack;
pub mod admin;
pub mod aggregation;
pub mod autoscale;
mod checkpoint;
mod config;
mod error;
mod every;
pub mod failure;
pub mod lease;
pub mod metrics;
pub mod multi_stream;
pub mod outputs;
pub mod parallel;
pub mod singleton;
// Public only where the simulation turns deliberate bugs on: never part of the API.
#[cfg(feature = "mutation-testing")]
pub mod mutation;
#[cfg(not(feature = "mutation-testing"))]
#[allow(unreachable_pub, dead_code)]
pub(crate) mod mutation;
mod processor;
mod source;
mod task;
mod types;
mod worker;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod memory;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

pub use autoscale::FleetSignals;
pub use checkpoint::{Checkpointer, PreparedCheckpoint};
pub use config::{
    Autoscaling, BalanceBy, Balancing, Coordination, InitialPositionKind, Liveness, MAX_DURATION,
    ParseModeError, Retrieval, RetrievalMode, WorkerConfig,
};
pub use error::{
    BackendError, BoxError, CheckpointError, ConfigError, Error, ErrorKind, error_chain,
};
pub use every::EveryNOrT;
pub use lease::{CheckpointUpdate, Lease, LeaseLoad, LeaseStore, LeaseStoreExtras, TableFeatures};
pub use parallel::{OutputHandler, Parallel, RecordHandler};
pub use processor::{InitializationInput, ProcessRecordsInput, ProcessorFactory, RecordProcessor};
pub use source::{RecordBatch, Shard, ShardIterator, ShardSource, Subscription, SubscriptionEvent};
pub use types::{
    Checkpoint, ConsumerId, ExtendedSequenceNumber, FencingToken, HashKeyRange, InitialPosition,
    Record, SequenceNumber, ShardId, StartingPosition, WorkerId,
};
pub use worker::{
    Phase, Problem, ProblemKind, ShardStatus, ShutdownHandle, Signals, Status, Worker,
    WorkerBuilder,
};
