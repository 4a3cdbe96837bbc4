//! KPL-aggregated records through a worker: split into user records, checkpointed at a
//! sub-sequence number, resumed after it — neither skipping the rest of an aggregate nor
//! delivering again what was checkpointed.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kcl_core::memory::{MemoryLeaseStore, MemoryStream};
use kcl_core::{
    BoxError, Checkpointer, ExtendedSequenceNumber, ProcessRecordsInput, RecordProcessor, Worker,
    WorkerConfig,
};

/// The aggregated record of a fixture case (made by the reference aggregation library).
fn aggregate(case: &str) -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kpl-aggregated.json"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = json
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == case)
        .unwrap();
    STANDARD.decode(case["data_b64"].as_str().unwrap()).unwrap()
}

type Deliveries = Arc<Mutex<Vec<Vec<ExtendedSequenceNumber>>>>;

/// Records what each processor instance was given; the first instance checkpoints at its
/// `checkpoint_at`-th record and then fails, so that the shard restarts from the checkpoint.
struct FailOnce {
    checkpoint_at: usize,
    deliveries: Deliveries,
    mine: usize,
}

impl RecordProcessor for FailOnce {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let first = self.mine == 0;
        self.deliveries.lock().unwrap()[self.mine]
            .extend(input.records().iter().map(|r| r.position()));
        if first {
            checkpointer
                .checkpoint_at(input.records()[self.checkpoint_at].position())
                .await?;
            return Err("failing after a checkpoint inside the aggregate".into());
        }
        Ok(())
    }
}

async fn resume_after(checkpoint_at: usize) {
    let stream = MemoryStream::new(1);
    let first = stream.put("orders", aggregate("ten-same-key#0"));
    let plain = stream.put("p", "a plain record after the aggregate");
    let deliveries: Deliveries = Arc::new(Mutex::new(Vec::new()));
    let d = deliveries.clone();
    let worker = Worker::builder(stream, MemoryLeaseStore::new())
        .id("w")
        .config(WorkerConfig::default().min_backoff(Duration::from_millis(10)))
        .build(move |_| {
            let mut all = d.lock().unwrap();
            all.push(Vec::new());
            FailOnce {
                checkpoint_at,
                deliveries: d.clone(),
                mine: all.len() - 1,
            }
        })
        .unwrap();
    let stop = worker.shutdown_handle();
    let task = tokio::spawn(worker.run());
    let start = tokio::time::Instant::now();
    while deliveries.lock().unwrap().len() < 2
        || deliveries.lock().unwrap()[1].last() != Some(&plain.position())
    {
        assert!(start.elapsed() < Duration::from_secs(30), "{deliveries:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.shutdown();
    task.await.unwrap().unwrap();

    let deliveries = deliveries.lock().unwrap();
    let user = |sub| ExtendedSequenceNumber {
        sequence: first.sequence_number.clone(),
        sub_sequence: sub,
    };
    // The first instance got the ten user records of the aggregate, then the plain one.
    let all: Vec<_> = (0..10).map(user).chain([plain.position()]).collect();
    assert_eq!(deliveries[0], all);
    // The next one resumed right after the checkpoint, inside the aggregate.
    let rest: Vec<_> = ((checkpoint_at as u64 + 1)..10)
        .map(user)
        .chain([plain.position()])
        .collect();
    assert_eq!(deliveries[1], rest, "resumed after {checkpoint_at}");
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_inside_an_aggregate_resumes_with_the_next_user_record() {
    resume_after(4).await;
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_at_an_aggregates_first_user_record_does_not_skip_the_rest() {
    resume_after(0).await;
}
