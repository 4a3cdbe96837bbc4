//! In-memory [`ShardSource`](crate::ShardSource) and [`LeaseStore`](crate::LeaseStore) for
//! tests and simulation (feature `test-util`).
//!
//! Both honour the same contracts as the AWS implementations — conditional writes, shard
//! lineage, closed shards that end with their children, shards that age out of retention —
//! and both can be made to misbehave through a shared [`Faults`] handle: errors, throttling,
//! writes that apply but report failure, writes that land long after their caller gave up,
//! latency, per-client partitions, and whole-process freezes ([`Faults::run_as`]). Every
//! handle has a client name (use the worker id) so faults can target one worker. Randomness is
//! seeded, and all waiting is tokio time, so a run under paused time is reproducible.
//!
//! The lease store also keeps an output table that processors commit to with their
//! checkpoints ([`Transact`](crate::outputs::Transact) with [`MemoryWrite`]s), so that tests
//! can count every record's output and see who committed it.

mod faults;
mod feed;
mod harness;
mod messenger;
mod outputs;
mod positions;
mod process;
mod sink;
mod store;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};

pub use faults::Faults;
pub use harness::{IdleProcessor, ProcessorHarness};
pub use messenger::{DeliveryHook, MemoryMessenger, MemoryNetwork};
pub use outputs::{
    AppliedCommit, Condition, MemoryWrite, OutputCounts, OutputItem, Refusal, RefusedCommit,
    WriteAction,
};
pub use positions::{MemoryPositionSink, PositionRow, SinkCommit};
pub use sink::MemorySink;
pub use store::{MemoryLeaseStore, StoreEvent};
pub use stream::MemoryStream;

static EVENT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A process-wide, strictly increasing number, to order events recorded by the in-memory
/// backends and by tests relative to each other (several can share one paused instant).
pub fn next_event_seq() -> u64 {
    EVENT_SEQ.fetch_add(1, Ordering::Relaxed)
}
