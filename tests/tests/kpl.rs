//! KPL-aggregated records, made by the reference aggregation library, put into a stream on
//! the emulator and read back by a worker process through kcl-aws: every user record comes
//! out, with its own partition key, in order. One shard: the library aggregates without a
//! shard map, so on a stream of several shards an aggregate whose keys span shards would be
//! dropped by the hash-key-range check, as KCL Java drops it (see `kcl_core::aggregation`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_records_come_out_as_their_user_records() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("kpl").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let mut expected = Vec::new();
    for name in ["ten-same-key#0", "many-keys#0", "single#0"] {
        let (pk, data, users) = case(name);
        ctx.put_bytes(&pk, &data).await?;
        expected.extend(users);
    }
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
