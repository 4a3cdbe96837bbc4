//! `kcl-admin dead-letters` on a FIFO queue holding 250 letters in one message group (as an
//! `SqsSink` wrote them before each letter had a group of its own: group = shard), beside
//! letters the sink writes now: `list` and `show` see every one, `redrive --all` puts every
//! one back, in order per key, and deletes every message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use common::admin;
use kcl_aws::dead_letter::{LetterId, SqsSink, to_json};
use kcl_core::failure::DeadLetterSink as _;
use kcl_integration_tests::letters::{letter, queue};
use kcl_integration_tests::{Context, with_timeout};

/// The shard the old letters were read from: their message group.
const SHARD: &str = "shardId-000000000004";
/// Letters in that one group: 25 receives of 10, each hiding the rest of the group until
/// its messages are deleted or moved (1,000 took five minutes on the emulator, to show
/// nothing more).
const LETTERS: u128 = 250;
/// With the 5 letters the sink writes now.
const ALL: usize = 255;
/// Their partition keys, in turn.
const KEYS: u128 = 4;

/// Every record of the test's (one-shard) stream: `(partition key, data)`.
async fn records(ctx: &Context) -> anyhow::Result<Vec<(String, String)>> {
    let mut iterator = ctx
        .kinesis
        .get_shard_iterator()
        .stream_name(&ctx.stream)
        .shard_id("shardId-000000000000")
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await?
        .shard_iterator
        .unwrap();
    let mut all = Vec::new();
    loop {
        let out = ctx
            .kinesis
            .get_records()
            .shard_iterator(iterator)
            .send()
            .await?;
        if out.records.is_empty() {
            return Ok(all);
        }
        for r in out.records {
            let key = r.partition_key.clone().unwrap_or_default();
            all.push((key, String::from_utf8(r.data.into_inner())?));
        }
        iterator = out.next_shard_iterator.unwrap();
    }
}

fn stdout(out: &std::process::Output) -> anyhow::Result<String> {
    anyhow::ensure!(out.status.success(), "kcl-admin failed");
    Ok(String::from_utf8(out.stdout.clone())?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_with_250_letters_in_one_group_is_listed_and_redriven_whole()
-> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-dl-fifo").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(900), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let url = queue(&ctx, true).await?;
    let sqs = ctx.sqs_client().await;
    // The letters of one group, sent as the sink sent them before (group = shard).
    let mut ids = Vec::new();
    for n in 1..=LETTERS {
        let key = format!("key-{}", n % KEYS);
        let l = letter(&ctx.stream, SHARD, n, &key, n.to_string().into_bytes());
        let id = LetterId::of(&l).to_string();
        sqs.send_message()
            .queue_url(&url)
            .message_body(to_json(&l))
            .message_group_id(SHARD)
            .message_deduplication_id(&id)
            .send()
            .await?;
        ids.push(id);
    }
    // And 5 written by the sink now, of another shard.
    let sink = SqsSink::from_client(sqs.clone(), &url);
    for n in 1..=5 {
        let key = format!("key-{}", n % KEYS);
        let l = letter(
            &ctx.stream,
            "shardId-000000000009",
            n,
            &key,
            format!("new-{n}").into_bytes(),
        );
        sink.put(&l).await?;
    }
    let from = format!("sqs:{url}");
    let dl = |args: &[&str]| {
        let mut all = vec!["dead-letters", args[0], "--from", from.as_str()];
        all.extend_from_slice(&args[1..]);
        admin(&ctx, &all)
    };

    let listed = stdout(&dl(&["list"])?)?;
    anyhow::ensure!(
        listed.contains(&format!("{ALL} letter(s)")),
        "not every letter listed"
    );
    // A second listing (after the first moved every letter into a group of its own).
    let last = ids.last().unwrap();
    anyhow::ensure!(stdout(&dl(&["show", last])?)?.contains(&format!("{LETTERS}")));

    let record = ctx.path("redriven.jsonl");
    let out = stdout(&dl(&[
        "redrive",
        "--all",
        "--record",
        record.to_str().unwrap(),
    ])?)?;
    anyhow::ensure!(
        out.contains(&format!("redrove {ALL} letter(s)")),
        "not every letter redriven"
    );
    let back = records(&ctx).await?;
    assert_eq!(back.len(), ALL);
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, data) in back {
        by_key.entry(key).or_default().push(data);
    }
    for (key, data) in &by_key {
        let old: Vec<u128> = data.iter().filter_map(|d| d.parse().ok()).collect();
        let mut sorted = old.clone();
        sorted.sort_unstable();
        assert_eq!(old, sorted, "key {key}: out of order");
        let new: Vec<&String> = data.iter().filter(|d| d.starts_with("new-")).collect();
        let mut sorted = new.clone();
        sorted.sort();
        assert_eq!(new, sorted, "key {key}: out of order");
    }
    assert_eq!(by_key.values().map(Vec::len).sum::<usize>(), ALL);
    anyhow::ensure!(
        stdout(&dl(&["list"])?)?.contains("0 letter(s)"),
        "messages left"
    );
    Ok(())
}
