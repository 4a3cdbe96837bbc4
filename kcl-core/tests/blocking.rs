//! A processor that blocks its thread must not stop its own lease renewals.
//!
//! This is the one core test on real time: blocking a thread cannot be modelled with tokio's
//! paused clock (a blocked thread stops the clock too), so it runs on a multi-thread runtime
//! with a short failover time and takes about four seconds.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ProcessRecordsInput, RecordProcessor, ShardId, Worker, WorkerConfig,
};
use tokio::time::{Instant, sleep};

/// One batch: who processed it, when it started and ended.
type Batches = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

struct Blocking {
    worker: String,
    batches: Batches,
    block: Duration,
}

impl RecordProcessor for Blocking {
    async fn process_records(
        &mut self,
        _input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let start = Instant::now();
        // CPU work or synchronous I/O that never yields to the runtime.
        std::thread::sleep(self.block);
        self.batches
            .lock()
            .unwrap()
            .push((self.worker.clone(), start, Instant::now()));
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_processor_blocking_its_thread_keeps_its_lease_and_shares_it_with_nobody() {
    let stream = MemoryStream::new(1);
    let store = MemoryLeaseStore::new();
    let batches = Batches::default();
    let config = WorkerConfig::default()
        .failover_time(Duration::from_secs(1))
        .taker_interval(Duration::from_millis(100))
        .idle_time_between_reads(Duration::from_millis(50));
    let worker = |id: &str, block: Duration| {
        let (me, batches) = (id.to_owned(), batches.clone());
        Worker::new(
            id,
            config.clone(),
            stream.client(id),
            store.client(id),
            move |_: &ShardId| Blocking {
                worker: me.clone(),
                batches: batches.clone(),
                block,
            },
        )
        .unwrap()
    };
    let a = worker("a", Duration::from_millis(2500));
    let (a_stop, mut a_status) = (a.shutdown_handle(), a.status());
    let a = tokio::spawn(a.run());
    a_status.wait_for(|s| s.held.len() == 1).await.unwrap();
    let c = worker("c", Duration::ZERO);
    let c_stop = c.shutdown_handle();
    let c = tokio::spawn(c.run());
    stream.put("k", "one");
    sleep(Duration::from_millis(3500)).await;

    let batches = batches.lock().unwrap().clone();
    let first = batches.iter().find(|b| b.0 == "a").cloned();
    let (_, a_start, a_end) = first.unwrap_or_else(|| panic!("a never finished: {batches:?}"));
    let overlapping: Vec<_> = batches
        .iter()
        .filter(|(who, start, end)| who == "c" && *end > a_start && *start < a_end)
        .map(|(_, start, _)| start.saturating_duration_since(a_start))
        .collect();
    assert!(
        overlapping.is_empty(),
        "c processed the shard {overlapping:?} after a entered its {:?} batch",
        a_end - a_start
    );
    let c_batches = batches.iter().filter(|b| b.0 == "c").count();
    assert_eq!(c_batches, 0, "the record went to c as well: {batches:?}");
    c_stop.shutdown();
    a_stop.shutdown();
    c.await.unwrap().unwrap();
    a.await.unwrap().unwrap();
}
