//! KPL-aggregated records, made by the reference aggregation library, put into a stream on
//! the emulator and read back by a worker process through kcl-aws: every user record comes
//! out, with its own partition key, in order. One shard: the library aggregates without a
//! shard map, so on a stream of several shards an aggregate whose keys span shards would be
//! dropped by the hash-key-range check, as KCL Java drops it (see `kcl_core::aggregation`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kcl_core::SequenceNumber;
use kcl_integration_tests::journal::Event;
use kcl_integration_tests::{Context, WorkerProcess, repo_root, wait_until, with_timeout};

const WORKER: &str = env!("CARGO_BIN_EXE_kcl-test-worker");

/// A fixture case: the aggregated record's partition key and bytes, and its user records'
/// partition keys and payloads.
fn case(name: &str) -> (String, Vec<u8>, Vec<(String, String)>) {
    let path = repo_root().join("kcl-core/tests/fixtures/kpl-aggregated.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = json
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == name)
        .unwrap();
    let decode = |v: &serde_json::Value| STANDARD.decode(v.as_str().unwrap()).unwrap();
    let users = case["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let data = String::from_utf8(decode(&r["data_b64"])).unwrap();
            (r["partition_key"].as_str().unwrap().to_owned(), data)
        })
        .collect();
    (
        case["partition_key"].as_str().unwrap().to_owned(),
        decode(&case["data_b64"]),
        users,
    )
}

/// A one-shard stream with three of the fixture's aggregates (512 user records) in it; the
/// user records, in order.
async fn aggregates_in_a_stream(ctx: &Context) -> anyhow::Result<Vec<(String, String)>> {
    ctx.create_stream(1).await?;
    let mut expected = Vec::new();
    for name in ["ten-same-key#0", "many-keys#0", "single#0"] {
        let (pk, data, users) = case(name);
        ctx.put_bytes(&pk, &data).await?;
        expected.extend(users);
    }
    Ok(expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_records_come_out_as_their_user_records() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kpl").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let mut expected = aggregates_in_a_stream(&ctx).await?;
    ctx.put_one("p", "a plain record").await?;
    expected.push(("p".to_owned(), "a plain record".to_owned()));

    let worker = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &[])?;
    wait_until(
        "every user record to be delivered",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            Ok(worker
                .events()?
                .iter()
                .filter(|e| e.event == "record")
                .count()
                >= expected.len())
        },
    )
    .await
    .map_err(|e| e.context(worker.log_tail()))?;
    let delivered: Vec<(String, String)> = worker
        .events()?
        .iter()
        .filter(|e| e.event == "record")
        .map(|e| {
            (
                e.pk.clone().unwrap_or_default(),
                e.data.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(delivered.len(), expected.len(), "each user record once");
    // In order per partition key (shards are read concurrently, so only per key).
    for key in ["orders", "user-7", "pk-1", "p"] {
        let of = |v: &[(String, String)]| -> Vec<String> {
            v.iter()
                .filter(|(k, _)| k == key)
                .map(|(_, d)| d.clone())
                .collect()
        };
        assert_eq!(of(&delivered), of(&expected), "records of {key}");
    }
    let mut got = delivered;
    let mut want = expected.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    worker.terminate()?;
    Ok(())
}

/// A position as the journal writes it: `seq` or `seq.sub`.
fn position(text: &str) -> (SequenceNumber, u64) {
    let (seq, sub) = text.split_once('.').unwrap_or((text, "0"));
    (SequenceNumber::parse(seq).unwrap(), sub.parse().unwrap())
}

/// The first worker checkpoints every 7th user record, inside aggregates, and is killed in
/// the middle of a 500-record aggregate. The second starts from that checkpoint: it delivers
/// every user record after it, none at or before it, and together nothing is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_an_aggregate_loses_nothing_and_repeats_nothing_checkpointed()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("kpl-kill").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), kill_inside(ctx)).await
}

async fn kill_inside(ctx: Context) -> anyhow::Result<()> {
    let expected = aggregates_in_a_stream(&ctx).await?;
    let args = [
        "--checkpoint-every",
        "7",
        "--record-delay-ms",
        "10",
        "--no-batch-checkpoint",
        "--failover-ms",
        "3000",
    ];
    let mut first = WorkerProcess::spawn(WORKER, &ctx, "worker-a", &args)?;
    let records = |w: &WorkerProcess| -> anyhow::Result<Vec<Event>> {
        Ok(w.events()?
            .into_iter()
            .filter(|e| e.event == "record")
            .collect())
    };
    // Inside many-keys (user records 10..510 of the shard), well past its first checkpoints.
    wait_until(
        "the first worker to be 150 records in",
        Duration::from_secs(60),
        Duration::from_millis(20),
        async || Ok(records(&first)?.len() >= 150),
    )
    .await
    .map_err(|e| e.context(first.log_tail()))?;
    first.kill()?;
    let before = records(&first)?;
    assert!(before.len() < 400, "killed too late: {}", before.len());
    let last_checkpoint = first
        .events()?
        .iter()
        .rev()
        .find(|e| e.event == "checkpoint")
        .and_then(|e| e.seq.clone())
        .expect("the first worker checkpointed");
    let journaled = position(&last_checkpoint);
    assert!(
        journaled.1 > 0,
        "checkpoint {last_checkpoint} is not inside an aggregate"
    );

    let second = WorkerProcess::spawn(WORKER, &ctx, "worker-b", &args)?;
    wait_until(
        "the second worker to deliver the last user record",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            Ok(records(&second)?
                .iter()
                .any(|e| e.data.as_deref() == expected.last().map(|(_, d)| d.as_str())))
        },
    )
    .await
    .map_err(|e| e.context(second.log_tail()))?;
    let init = second
        .events()?
        .into_iter()
        .find(|e| e.event == "init")
        .and_then(|e| e.checkpoint)
        .expect("the second worker initialised");
    let from = position(&init);
    // The kill may land between a checkpoint's write and its journal line, never before.
    assert!(
        from >= journaled,
        "resumed at {init}, before {last_checkpoint}"
    );
    let at = |e: &Event| (e.sequence().unwrap(), e.sub.unwrap());
    let after = records(&second)?;
    assert!(
        after.iter().all(|e| at(e) > from),
        "a record at or before the checkpoint {init} was delivered again"
    );
    // The first worker delivered every record up to the checkpoint, in shard order, so the
    // second must deliver exactly the rest: none lost.
    let done = before.iter().take_while(|e| at(e) <= from).count();
    let redelivered: Vec<(String, String)> = after
        .iter()
        .map(|e| (e.pk.clone().unwrap(), e.data.clone().unwrap()))
        .collect();
    assert_eq!(redelivered, expected[done..].to_vec(), "the rest, in order");
    eprintln!(
        "killed after {} records; checkpoint {init}; the second delivered {}",
        before.len(),
        after.len()
    );
    second.terminate()?;
    Ok(())
}
