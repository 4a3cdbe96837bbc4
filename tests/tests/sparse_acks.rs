//! Sparse acknowledgements with real worker processes: a worker under `Parallel` with one
//! partition key stuck is SIGKILLed; the worker that takes the shard over delivers again only
//! the records unfinished at the kill (the lease row's `kclAcked` says which finished past
//! the checkpoint), not every record past the checkpoint.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_core::ack::SparseAcks;
use kcl_core::{ExtendedSequenceNumber, LeaseStore, SequenceNumber, ShardId};
use kcl_integration_tests::journal::Event;
use kcl_integration_tests::process::WorkerProcess;
use kcl_integration_tests::{Context, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");
const SHARD: &str = "shardId-000000000000";
/// Records, over ten keys: `pk-3`'s 20 stick behind its first.
const N: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_with_a_stuck_key_leaves_only_its_unfinished_records_to_redo()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("sparse-acks").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), run(ctx)).await
}

/// The payloads of the records `events` finished (`record` lines).
fn finished(events: &[Event]) -> BTreeSet<String> {
    let records = events.iter().filter(|e| e.event == "record");
    records.filter_map(|e| e.data.clone()).collect()
}

/// The records `events` started (`record_start` lines), by payload, each as often as it ran.
fn started(events: &[Event]) -> Vec<String> {
    let records = events.iter().filter(|e| e.event == "record_start");
    records.filter_map(|e| e.data.clone()).collect()
}

/// Each finished record's position and payload.
fn positions(events: &[Event]) -> Vec<(ExtendedSequenceNumber, String)> {
    let records = events.iter().filter(|e| e.event == "record");
    records
        .map(|e| {
            let sequence = SequenceNumber::parse(e.seq.clone().unwrap()).unwrap();
            let position = ExtendedSequenceNumber {
                sequence,
                sub_sequence: e.sub.unwrap_or(0),
            };
            (position, e.data.clone().unwrap())
        })
        .collect()
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    // Four puts a second and more apart: sequence numbers of several seconds.
    for part in 0..4 {
        let records: Vec<(String, String)> = (part * N / 4..(part + 1) * N / 4)
            .map(|i| (format!("pk-{}", i % 10), format!("r{i}")))
            .collect();
        ctx.put(&records).await?;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let args = [
        "--parallel",
        "8",
        "--failover-ms",
        "3000",
        "--ack-checkpoint-every",
        "10",
        "--ack-checkpoint-ms",
        "200",
    ];
    let stuck = [&args[..], &["--stuck-pk", "pk-3"]].concat();
    let mut a = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &stuck)?;
    wait_until(
        "worker-a to finish every record but pk-3's",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || Ok(finished(&a.events()?).len() == N - N / 10),
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    // The lease row carries every record finished past its checkpoint.
    let store = ctx.store();
    let shard = ShardId::new(SHARD);
    let done = positions(&a.events()?);
    wait_until(
        "the lease row to carry what worker-a finished",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let Some(row) = store.get(&shard).await? else {
                return Ok(false);
            };
            let Some(value) = &row.acked else {
                return Ok(false);
            };
            let acks = SparseAcks::decode(value, &row.checkpoint)?;
            let past = done.iter().filter(|(p, _)| {
                row.checkpoint
                    .progress_cmp(&kcl_core::Checkpoint::Sequence(p.clone()))
                    .is_some_and(std::cmp::Ordering::is_lt)
            });
            Ok(past.clone().count() > 0 && past.into_iter().all(|(p, _)| acks.contains(p)))
        },
    )
    .await?;
    let row = store.get(&shard).await?.expect("the row");
    let value = row.acked.clone().expect("a value");
    let runs = SparseAcks::decode(&value, &row.checkpoint)?.runs().len();
    a.kill()?;
    let finished_a = finished(&a.events()?);
    let unfinished: BTreeSet<String> = (0..N)
        .map(|i| format!("r{i}"))
        .filter(|r| !finished_a.contains(r))
        .collect();
    let past_checkpoint = done
        .iter()
        .filter(|(p, _)| {
            row.checkpoint
                .progress_cmp(&kcl_core::Checkpoint::Sequence(p.clone()))
                .is_some_and(std::cmp::Ordering::is_lt)
        })
        .count()
        + unfinished.len();

    let b = WorkerProcess::spawn(WORKER, &ctx, "worker-b", &args)?;
    wait_until(
        "every record finished",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let all: BTreeSet<String> = finished_a
                .iter()
                .cloned()
                .chain(finished(&b.events()?))
                .collect();
            Ok(all.len() == N)
        },
    )
    .await
    .map_err(|e| e.context(b.log_tail()))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = started(&b.events()?);
    eprintln!(
        "sparse acks after a SIGKILL: {} records delivered again, {} unfinished at the kill, \
         {past_checkpoint} past the checkpoint (what a failover delivered again before); the \
         row held {runs} runs of kinesis-mock sequence numbers in {} characters ({:.1} a run)",
        again.len(),
        unfinished.len(),
        value.len(),
        value.len() as f64 / runs as f64,
    );
    assert!(again.len() <= unfinished.len());
    assert_eq!(
        again.iter().cloned().collect::<BTreeSet<_>>(),
        unfinished,
        "exactly the unfinished records"
    );
    assert_eq!(again.len(), unfinished.len(), "each once");
    Ok(())
}
