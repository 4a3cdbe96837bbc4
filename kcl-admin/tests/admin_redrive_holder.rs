//! `kcl-admin dead-letters redrive` of parked keys through their holders, against moto (SQS,
//! DynamoDB) and kinesis-mock, with the test standing in for the worker that holds the shard
//! (what kcl-core's worker does when its `DeadLetters` has a reader): it reads the request in
//! its row, reads the key's letters back with kcl-aws's `SinkReader`, removes each, then
//! unparks the key.
//!
//! - A key parked by a shard that split into children that all park it is refused (no holder
//!   knows which child's records follow its letters), naming the shard and why, unless
//!   `--through-stream`.
//! - `--dry-run` prints the plan: the holder of the open row asked for the letters of the row
//!   and of its ended parent, the parent unparked after.
//! - With no holder answering, the redrive writes the request, leaves every letter visible
//!   (the holder must read them), and exits non-zero after `--wait`, the request standing.
//! - With the holder answering, it waits until the key is unparked, then unparks the ended
//!   parent, and writes one line for the key to the record file.
//! - `--through-stream` puts the refused key's letters back into the stream, and unparks it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::time::{Duration, Instant};

use common::admin;
use kcl_aws::DynamoDbLeaseStore;
use kcl_aws::dead_letter::{LetterId, LetterStore, Location, SqsSink};
use kcl_core::failure::{DeadLetter, DeadLetterSink as _, LetterReader as _};
use kcl_core::{
    Checkpoint, Lease, LeaseStore as _, LeaseStoreExtras as _, ShardId, TableFeatures, WorkerId,
};
use kcl_integration_tests::letters::{letter, queue};
use kcl_integration_tests::{Context, with_timeout};

/// The key parked by the open shard 1 and its ended parent 0.
const KEY: &str = "00000000000000aa";
/// The key parked by shard 2, which split into 3 and 4, both parking it.
const SPLIT: &str = "00000000000000bb";
/// The key parked by shard 5, whose holder does not answer.
const SILENT: &str = "00000000000000cc";

fn shard(n: u32) -> ShardId {
    ShardId::new(format!("shardId-00000000000{n}"))
}

fn parked(stream: &str, from: u32, sequence: u128, key: &str, partition: &str) -> DeadLetter {
    let mut l = letter(
        stream,
        shard(from).as_str(),
        sequence,
        partition,
        partition.as_bytes().to_vec(),
    );
    l.parked_key = Some(key.to_owned());
    l
}

/// A row of `store` parking `entries`, ended or held by worker-a.
async fn row(
    store: &DynamoDbLeaseStore,
    n: u32,
    parents: &[u32],
    ended: bool,
    entries: &[String],
) -> anyhow::Result<()> {
    let checkpoint = if ended {
        Checkpoint::ShardEnd
    } else {
        Checkpoint::TrimHorizon
    };
    let mut lease = Lease::new(shard(n), checkpoint);
    lease.parent_shard_ids = parents.iter().map(|p| shard(*p)).collect();
    lease.parked_keys = entries.to_vec();
    assert!(store.create(&lease).await?);
    if !ended {
        let row = store.get(&lease.key).await?.unwrap();
        store.take(&row, &WorkerId::new("worker-a")).await?;
    }
    Ok(())
}

/// The parked-key entries of row `n`.
async fn entries(store: &DynamoDbLeaseStore, n: u32) -> anyhow::Result<Vec<String>> {
    let mut entries = store.get(&shard(n)).await?.unwrap().parked_keys;
    entries.sort();
    Ok(entries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_is_redriven_through_the_holder_of_its_shard() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("admin-redrive-holder").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(240), Box::pin(run(ctx))).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(1).await?;
    let store = ctx.store();
    store.ensure_table(TableFeatures::NONE).await?;
    let park = |key: &str, at: u32| format!("{key}/{at}/0");
    row(&store, 0, &[], true, &[park(KEY, 10)]).await?;
    row(&store, 1, &[0], false, &[park(KEY, 10)]).await?;
    row(&store, 2, &[], true, &[park(SPLIT, 50)]).await?;
    row(&store, 3, &[2], false, &[park(SPLIT, 50)]).await?;
    row(&store, 4, &[2], false, &[park(SPLIT, 50)]).await?;
    row(&store, 5, &[], false, &[park(SILENT, 60)]).await?;

    let url = queue(&ctx, false).await?;
    let sink = SqsSink::from_client(ctx.sqs_client().await, &url);
    let s = &ctx.stream;
    let of_key = [
        parked(s, 0, 10, KEY, "user-1"),
        parked(s, 0, 12, KEY, "user-1"),
        parked(s, 1, 20, KEY, "user-1"),
    ];
    let silent = parked(s, 5, 60, SILENT, "user-4");
    let of_split = [
        parked(s, 2, 50, SPLIT, "user-2"),
        parked(s, 2, 51, SPLIT, "user-2"),
    ];
    let mut plain = letter(s, shard(1).as_str(), 30, "user-3", b"plain".to_vec());
    plain.parked_key = None;
    for l in of_key.iter().chain(&of_split).chain([&plain, &silent]) {
        sink.put(l).await?;
    }
    let from = format!("sqs:{url}");
    let record = ctx.path("redriven.jsonl");
    let dl = |args: &[&str]| {
        let mut all = vec!["dead-letters", "redrive", "--from", from.as_str()];
        all.extend_from_slice(&["--application-name", ctx.table.as_str()]);
        all.extend_from_slice(&["--record", record.to_str().unwrap()]);
        all.extend_from_slice(args);
        admin(&ctx, &all)
    };

    // The split key is refused, naming its shard and why.
    let out = dl(&["--all", "--dry-run"])?;
    let err = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    for needle in [SPLIT, "shardId-000000000002", "split", "--through-stream"] {
        assert!(err.contains(needle), "`{needle}` missing from {err}");
    }
    assert!(!err.contains(&format!("key {KEY}")), "{err}");

    // The plan.
    let out = dl(&["--key", "user-1", "--dry-run"])?;
    let plan = String::from_utf8(out.stdout)?;
    assert!(out.status.success());
    let ask = format!(
        "would ask the holder of shardId-000000000001 (worker worker-a) to replay 3 letter(s) of key {KEY}"
    );
    assert!(plan.contains(&ask), "{plan}");
    assert!(
        plan.contains(&format!(
            "would then unpark key {KEY} in the ended shard shardId-000000000000"
        )),
        "{plan}"
    );
    assert_eq!(
        entries(&store, 1).await?,
        [park(KEY, 10)],
        "a dry run asks nothing"
    );

    // The holder answers.
    let request = format!("{KEY}/redrive/3/shardId-000000000000+shardId-000000000001");
    let sdk = ctx.sdk_at(&ctx.endpoints.sqs).await;
    let location = Location::Sqs {
        queue_url: url.clone(),
    };
    let holder = tokio::spawn(hold(
        store.clone(),
        sdk.clone(),
        location.clone(),
        request.clone(),
    ));
    let ctx2 = ctx.clone();
    let (from2, record2) = (from.clone(), record.clone());
    let out = tokio::task::spawn_blocking(move || {
        let args = [
            "dead-letters",
            "redrive",
            "--from",
            &from2,
            "--application-name",
            &ctx2.table,
            "--record",
            record2.to_str().unwrap(),
            "--key",
            "user-1",
            "--wait",
            "60s",
        ];
        admin(&ctx2, &args)
    })
    .await??;
    let replayed = holder.await??;
    assert!(out.status.success());
    let said = String::from_utf8(out.stdout)?;
    assert!(said.contains(&format!("done: key {KEY}")), "{said}");
    let ids: Vec<LetterId> = of_key.iter().map(LetterId::of).collect();
    assert_eq!(replayed, ids, "every letter of the key, in order");
    assert!(entries(&store, 1).await?.is_empty());
    assert!(
        entries(&store, 0).await?.is_empty(),
        "the ended parent unparked"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&record)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let last = lines.last().unwrap();
    assert_eq!(last["key"], KEY);
    assert_eq!(last["rows"], serde_json::json!(["shardId-000000000001"]));
    assert_eq!(last["letters"].as_array().map(Vec::len), Some(3), "{last}");

    // No holder answers: the request stands, the letters are left visible.
    let request = format!("{SILENT}/redrive/1/shardId-000000000005");
    let out = dl(&["--key", "user-4", "--wait", "3s"])?;
    let err = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(
        err.contains("the requests stand") && err.contains("check the worker's log"),
        "{err}"
    );
    assert_eq!(
        entries(&store, 5).await?,
        [park(SILENT, 60), request.clone()]
    );
    let visible = visible_ids(&sdk, &location).await?;
    assert!(visible.contains(&LetterId::of(&silent)), "{visible:?}");

    // A holder that refuses (removes the request, the key still parked): said at once.
    let refuser = tokio::spawn(refuse(store.clone(), request.clone()));
    let started = Instant::now();
    let out = dl(&["--key", "user-4", "--wait", "60s"])?;
    refuser.await??;
    let err = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(
        err.contains("removed the request but did not unpark"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not after --wait"
    );
    assert_eq!(entries(&store, 5).await?, [park(SILENT, 60)]);

    // The split key through the stream, with the plain letter; the key unparked.
    let mut ids: Vec<String> = of_split
        .iter()
        .chain([&plain])
        .map(|l| LetterId::of(l).to_string())
        .collect();
    ids = ids
        .into_iter()
        .flat_map(|id| ["--id".to_owned(), id])
        .collect();
    let mut args: Vec<&str> = ids.iter().map(String::as_str).collect();
    args.extend(["--through-stream", "--unpark-wait", "1s"]);
    let out = dl(&args)?;
    assert!(out.status.success());
    let back = ctx.read_shard("shardId-000000000000").await?;
    assert_eq!(back.len(), 3, "{back:?}");
    for n in [2, 3, 4] {
        assert!(entries(&store, n).await?.is_empty(), "row {n} unparked");
    }
    assert_eq!(
        visible_ids(&sdk, &location).await?,
        [LetterId::of(&silent)],
        "every letter gone but the silent holder's"
    );
    Ok(())
}

/// The ids of the letters another reader sees now.
async fn visible_ids(
    sdk: &aws_config::SdkConfig,
    location: &Location,
) -> anyhow::Result<Vec<LetterId>> {
    let store =
        LetterStore::open(sdk, location.clone()).with_visibility_timeout(Duration::from_secs(5));
    let listing = store.list().await?;
    store.release(&listing, &Default::default()).await?;
    Ok(listing.letters.into_iter().map(|s| s.id).collect())
}

/// The holder of shard 1: once its row carries `request`, reads the key's letters back (until
/// all 3 are there), "replays" them in order, removes each, then unparks the key. The ids
/// replayed.
async fn hold(
    store: DynamoDbLeaseStore,
    sdk: aws_config::SdkConfig,
    location: Location,
    request: String,
) -> anyhow::Result<Vec<LetterId>> {
    let reader = location.reader(&sdk).unwrap();
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        anyhow::ensure!(Instant::now() < deadline, "no request");
        if entries(&store, 1).await?.contains(&request) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut kept = loop {
        let kept = reader.parked(KEY).await?;
        if kept.len() >= 3 {
            break kept;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the holder found {} letter(s)",
            kept.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    kept.sort_by_key(|k| LetterId::of(&k.letter));
    let mut replayed = Vec::new();
    for k in &kept {
        replayed.push(LetterId::of(&k.letter));
        reader.remove(k).await?;
    }
    store.unpark(&shard(1), &entries(&store, 1).await?).await?;
    Ok(replayed)
}

/// The holder of shard 5, without a reader: removes the request standing in its row, and
/// then the one the redrive writes again.
async fn refuse(store: DynamoDbLeaseStore, request: String) -> anyhow::Result<()> {
    store
        .unpark(&shard(5), std::slice::from_ref(&request))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(50);
    while !entries(&store, 5).await?.contains(&request) {
        anyhow::ensure!(Instant::now() < deadline, "no request");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    store
        .unpark(&shard(5), std::slice::from_ref(&request))
        .await?;
    Ok(())
}
