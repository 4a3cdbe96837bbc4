//! `kcl-admin dead-letters` against the emulators, on letters an `SqsSink` put into a queue of
//! moto's: `list` filters them (table and JSON), `show` prints one whole, a `redrive
//! --dry-run` changes nothing, and `redrive` puts a letter back into its Kinesis stream with
//! its partition key and explicit hash key, writes the record file, and deletes the message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use common::admin;
use kcl_aws::dead_letter::{LetterId, SqsSink};
use kcl_core::failure::DeadLetterSink as _;
use kcl_integration_tests::letters::{letter, queue};
use kcl_integration_tests::{Context, with_timeout};

/// The shard the letters were read from (of some earlier stream).
const SHARD: &str = "shardId-000000000007";

/// Every record of `shard` of the test's stream: `(partition key, data)`.
async fn records(ctx: &Context, shard: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let iterator = ctx
        .kinesis
        .get_shard_iterator()
        .stream_name(&ctx.stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await?
        .shard_iterator
        .unwrap();
    let out = ctx
        .kinesis
        .get_records()
        .shard_iterator(iterator)
        .send()
        .await?;
    Ok(out
        .records
        .into_iter()
        .map(|r| {
            let key = r.partition_key.clone().unwrap_or_default();
            (key, r.data.into_inner())
        })
        .collect())
}

fn stdout(out: &std::process::Output) -> anyhow::Result<String> {
    anyhow::ensure!(out.status.success(), "kcl-admin failed");
    Ok(String::from_utf8(out.stdout.clone())?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_puts_a_letter_back_with_its_keys_and_deletes_its_message() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-dl").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(2).await?;
    let url = queue(&ctx, false).await?;
    let sink = SqsSink::from_client(ctx.sqs_client().await, &url);
    // `user-2` hashes into shard 0; its explicit hash key (2^127) sends it to shard 1.
    let hashed = letter(&ctx.stream, SHARD, 10, "user-2", b"{\"order\": 1}".to_vec());
    let mut plain = letter(&ctx.stream, SHARD, 11, "user-3", vec![0xff, 0, 1]);
    plain.record.explicit_hash_key = None;
    sink.put(&hashed).await?;
    sink.put(&plain).await?;
    let (id1, id2) = (
        LetterId::of(&hashed).to_string(),
        LetterId::of(&plain).to_string(),
    );
    let from = format!("sqs:{url}");
    let dl = |args: &[&str]| {
        let mut all = vec!["dead-letters", args[0], "--from", from.as_str()];
        all.extend_from_slice(&args[1..]);
        admin(&ctx, &all)
    };

    // `list`: a table of both; filters; JSON in the letters' format.
    let table = stdout(&dl(&["list"])?)?;
    for needle in ["ID", "LAST ERROR", &id1, &id2, "user-3", "2 letter(s)"] {
        anyhow::ensure!(table.contains(needle), "`{needle}` missing from:\n{table}");
    }
    let json = stdout(&dl(&["list", "--key", "user-3", "--json"])?)?;
    let doc: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(doc["letters"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["letters"][0]["id"], id2.as_str());
    assert_eq!(doc["letters"][0]["letter"]["record"]["data"], "/wAB");
    assert!(stdout(&dl(&["list", "--error", "refusé"])?)?.contains("2 letter(s)"));
    assert!(stdout(&dl(&["list", "--error", "nothing like it"])?)?.contains("0 letter(s)"));
    assert!(stdout(&dl(&["list", "--newer-than", "1h"])?)?.contains("0 letter(s)"));
    assert!(stdout(&dl(&["list", "--older-than", "1day"])?)?.contains("2 letter(s)"));

    // A message another reader holds is not listed, and `list` says so rather than only
    // counting fewer letters.
    let sqs = ctx.sqs_client().await;
    let held = sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(1)
        .visibility_timeout(60)
        .send()
        .await?;
    let receipt = held.messages()[0].receipt_handle().unwrap().to_owned();
    let out = dl(&["list", "--json"])?;
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)?)?;
    assert_eq!(doc["letters"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["in_flight"], 1, "{doc}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("about 1 more message(s) are in flight"),
        "{said}"
    );
    sqs.change_message_visibility()
        .queue_url(&url)
        .receipt_handle(receipt)
        .visibility_timeout(0)
        .send()
        .await?;
    assert!(stdout(&dl(&["list"])?)?.contains("2 letter(s)"));

    // `show`: the whole letter, its payload as text or base64.
    let shown = stdout(&dl(&["show", &id1])?)?;
    for needle in [
        "payload (12 bytes, UTF-8):\n{\"order\": 1}",
        "170141183460469231731687303715884105728",
        "parked behind",
        "orders-app",
    ] {
        anyhow::ensure!(shown.contains(needle), "`{needle}` missing from:\n{shown}");
    }
    assert!(stdout(&dl(&["show", &id2])?)?.contains("not UTF-8, in base64):\n/wAB"));
    assert!(!dl(&["show", &format!("{SHARD}/999/0")])?.status.success());

    // A redrive needs to be told which letters; a dry run changes nothing.
    assert!(!dl(&["redrive"])?.status.success());
    let record = ctx.path("redriven.jsonl");
    let record_arg = record.to_str().unwrap();
    let dry = stdout(&dl(&[
        "redrive",
        "--id",
        &id1,
        "--dry-run",
        "--record",
        record_arg,
    ])?)?;
    assert!(dry.contains(&format!("would redrive {id1}")), "{dry}");
    assert!(!record.exists(), "a dry run writes no record");
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        assert!(
            records(&ctx, shard).await?.is_empty(),
            "a dry run puts nothing"
        );
    }
    assert!(stdout(&dl(&["list"])?)?.contains("2 letter(s)"));

    // The redrive: each record back with its keys, in the record file, its message gone.
    stdout(&dl(&["redrive", "--all", "--record", record_arg])?)?;
    let upper = records(&ctx, "shardId-000000000001").await?;
    assert_eq!(upper, [("user-2".to_owned(), b"{\"order\": 1}".to_vec())]);
    let lower = records(&ctx, "shardId-000000000000").await?;
    assert_eq!(lower, [("user-3".to_owned(), vec![0xff, 0, 1])]);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&record)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], id1.as_str());
    assert_eq!(lines[0]["shard"], "shardId-000000000001");
    assert_eq!(lines[0]["stream"], ctx.stream.as_str());
    assert!(
        lines[0]["sequence_number"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert!(lines[1]["redriven_at"].is_string());
    assert!(
        stdout(&dl(&["list"])?)?.contains("0 letter(s)"),
        "messages deleted"
    );
    Ok(())
}
