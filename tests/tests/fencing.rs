//! Fencing: a worker whose lease was taken over gets `LeaseLost` on checkpoint, its
//! processor is told `lease_lost`, and it delivers nothing more from that shard. With the
//! leases in DynamoDB, then in Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::sync::Arc;
use std::time::Duration;

use kcl_aws::KinesisShardSource;
use kcl_core::{
    BoxError, Checkpoint, CheckpointError, Checkpointer, LeaseStore, ProcessRecordsInput,
    RecordProcessor, ShardId, Worker, WorkerConfig, WorkerId,
};
use kcl_integration_tests::{Context, wait_until, with_timeout};
use tokio::sync::{Semaphore, mpsc};

#[derive(Debug, PartialEq, Eq)]
enum Note {
    Batch(usize),
    Checkpoint { lease_lost: bool },
    LeaseLost,
}

struct Probe {
    notes: mpsc::UnboundedSender<Note>,
    gate: Arc<Semaphore>,
}

impl RecordProcessor for Probe {
    async fn process_records(
        &mut self,
        input: ProcessRecordsInput<'_>,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), BoxError> {
        let _ = self.notes.send(Note::Batch(input.records().len()));
        // Hold the batch until the test has stolen the lease.
        self.gate.acquire().await?.forget();
        let result = checkpointer.checkpoint().await;
        let lease_lost = matches!(result, Err(CheckpointError::LeaseLost { .. }));
        let _ = self.notes.send(Note::Checkpoint { lease_lost });
        if lease_lost {
            Ok(())
        } else {
            result.map_err(Into::into)
        }
    }

    async fn lease_lost(&mut self) {
        let _ = self.notes.send(Note::LeaseLost);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_after_takeover_is_refused() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("fencing").await? else {
        return Ok(());
    };
    let store = ctx.store();
    with_timeout(Duration::from_secs(90), Box::pin(run(ctx, store))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_after_takeover_is_refused_with_leases_in_postgres() -> anyhow::Result<()> {
    let Some(ctx) = Context::new_postgres("fencing-pg").await? else {
        return Ok(());
    };
    let store = ctx.postgres().cloned().expect("a Postgres context");
    with_timeout(Duration::from_secs(90), Box::pin(run(ctx, store))).await
}

/// The test on `store`, the store of `ctx`'s leases.
async fn run<L: LeaseStore + Clone>(ctx: Context, store: L) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let records: Vec<(String, String)> =
        (0..5).map(|i| (format!("k{i}"), format!("f{i}"))).collect();
    ctx.put(&records).await?;

    let (tx, mut notes) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let factory = {
        let gate = gate.clone();
        move |_: &ShardId| Probe {
            notes: tx.clone(),
            gate: gate.clone(),
        }
    };
    // A long failover: the worker's own renewals (every 10 s) do not notice the theft before
    // its checkpoint does, and it cannot take the lease back during the test.
    let config = WorkerConfig::default()
        .failover_time(Duration::from_secs(30))
        .taker_interval(Duration::from_millis(500))
        .idle_time_between_reads(Duration::from_millis(200));
    let source = KinesisShardSource::from_client(ctx.kinesis.clone(), ctx.stream.clone());
    let worker = Worker::new("fenced", config, source, store.clone(), factory)?;
    let shutdown = worker.shutdown_handle();
    let running = tokio::spawn(worker.run());

    let first = tokio::time::timeout(Duration::from_secs(30), notes.recv()).await?;
    assert_eq!(first, Some(Note::Batch(5)));

    // Another worker takes the lease over (as after an expiry) and keeps renewing it.
    let shard = ShardId::new("shardId-000000000000");
    let observed = store.get(&shard).await?.expect("the lease exists");
    assert_eq!(observed.owner, Some(WorkerId::new("fenced")));
    let mut stolen = store.take(&observed, &WorkerId::new("thief")).await?;
    let thief = {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match store.renew(&stolen).await {
                    Ok(l) => stolen = l,
                    Err(e) => return Err::<(), _>(e),
                }
            }
        })
    };

    gate.add_permits(1000);
    let next = tokio::time::timeout(Duration::from_secs(20), notes.recv()).await?;
    assert_eq!(next, Some(Note::Checkpoint { lease_lost: true }));
    let next = tokio::time::timeout(Duration::from_secs(20), notes.recv()).await?;
    assert_eq!(next, Some(Note::LeaseLost));

    // The shard is stopped: new records are not delivered to the fenced worker.
    ctx.put(&[("k9".into(), "after".into())]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        notes.try_recv().is_err(),
        "the fenced worker kept processing"
    );

    // Its checkpoint changed nothing: the thief owns the lease, the checkpoint is untouched.
    let row = store.get(&shard).await?.expect("the lease exists");
    assert_eq!(row.owner, Some(WorkerId::new("thief")));
    assert_eq!(row.checkpoint, Checkpoint::TrimHorizon);
    assert!(!thief.is_finished(), "the thief's renewals failed");

    thief.abort();
    shutdown.shutdown();
    wait_until(
        "the worker to stop",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || Ok(running.is_finished()),
    )
    .await?;
    running.await??;
    Ok(())
}
