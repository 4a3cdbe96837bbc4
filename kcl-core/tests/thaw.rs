//! Work that becomes ready at the instant a frozen process thaws, before the runtime has
//! fired the timer of the lease's validity: a `Parallel` handler and a processor hook must not
//! go on once the validity is past, whichever the runtime polls first.
//!
//! The freeze is modelled as a process sees it: the clock jumps (`tokio::time::advance`)
//! while a task's wake-up is already queued. The woken task is polled before the timer
//! driver turns, exactly as on `SIGCONT`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, Parallel, ProcessRecordsInput, Record, RecordProcessor, ShardId,
    Worker, WorkerConfig,
};
use tokio::sync::Notify;
use tokio::time::sleep;

const FAILOVER: Duration = Duration::from_secs(6);

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .failover_time(FAILOVER)
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(100))
}

/// Work that waits for `release`, counting starts and completions.
#[derive(Clone, Default)]
struct Gate {
    release: Arc<Notify>,
    started: Arc<AtomicUsize>,
    completed: Arc<AtomicUsize>,
}

impl Gate {
    async fn pass(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.release.notified().await;
        self.completed.fetch_add(1, Ordering::SeqCst);
    }

    /// Freezes the process for two failover times, with the work's wake-up queued at thaw.
    async fn thaw(&self) {
        assert_eq!(
            self.started.load(Ordering::SeqCst),
            1,
            "the work is waiting"
        );
        self.release.notify_waiters();
        tokio::time::advance(FAILOVER * 2).await;
        sleep(Duration::from_millis(1)).await;
    }
}

async fn frozen_work_stops_at_the_validity<F: kcl_core::ProcessorFactory>(gate: &Gate, factory: F) {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    stream.put("k", "0");
    let worker = Worker::new(
        "a",
        config(),
        stream.client("a"),
        store.client("a"),
        factory,
    );
    let worker = worker.unwrap();
    let shutdown = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    sleep(Duration::from_secs(2)).await;
    gate.thaw().await;
    assert_eq!(
        gate.completed.load(Ordering::SeqCst),
        0,
        "the work went on after its lease's validity"
    );
    // The lease is taken again (nobody else wants it) and the record delivered again.
    sleep(Duration::from_secs(10)).await;
    assert!(gate.started.load(Ordering::SeqCst) >= 2, "delivered again");
    gate.release.notify_waiters();
    sleep(Duration::from_secs(1)).await;
    assert_eq!(gate.completed.load(Ordering::SeqCst), 1);
    shutdown.shutdown();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_parallel_handler_woken_at_thaw_does_not_run_past_the_validity() {
    let gate = Gate::default();
    let g = gate.clone();
    let factory = Parallel::new(move |_: Record| {
        let g = g.clone();
        async move {
            g.pass().await;
            Ok::<(), BoxError>(())
        }
    });
    frozen_work_stops_at_the_validity(&gate, factory).await;
}

struct Hook(Gate);

impl RecordProcessor for Hook {
    async fn process_records(
        &mut self,
        _: ProcessRecordsInput<'_>,
        _: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        self.0.pass().await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_woken_at_thaw_does_not_run_past_the_validity() {
    let gate = Gate::default();
    let g = gate.clone();
    frozen_work_stops_at_the_validity(&gate, move |_: &ShardId| Hook(g.clone())).await;
}
