//! The binary over two streams (`--streams`) against the emulators: every record of both is
//! counted, the leases are keyed as KCL Java's multi-stream leases; restarted with one stream
//! left out, the other resumes at its checkpoints and the left-out stream's leases are
//! deleted once `--stream-removal-grace` has passed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::consumer::{Consumer, records};
use kcl_integration_tests::{Context, wait_until, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_reads_two_streams_with_kcl_java_multi_stream_keys() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("example-streams").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(150), Box::pin(run(ctx))).await
}

/// True for `account:stream:creationEpoch:shardId-…` with `stream`.
fn multi_stream_key(key: &str, stream: &str) -> bool {
    let parts: Vec<&str> = key.split(':').collect();
    matches!(parts.as_slice(), [account, name, epoch, shard]
        if account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit())
            && *name == stream
            && epoch.parse::<u64>().is_ok()
            && shard.starts_with("shardId-"))
}

fn keys_of(written: &[(String, String)]) -> BTreeSet<String> {
    written.iter().map(|(k, _)| k.clone()).collect()
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let (x, y) = (ctx.on("x"), ctx.on("y"));
    x.create_stream(2).await?;
    y.create_stream(1).await?;
    let (x_before, y_before) = (records("x", 30), records("y", 20));
    x.put(&x_before).await?;
    y.put(&y_before).await?;

    let both = format!("{},{}", x.stream, y.stream);
    let sync = ["--shard-sync-interval", "1s"];
    let mut a = Consumer::spawn_with(
        &ctx,
        "streams-a",
        &[&["--streams", &both][..], &sync].concat(),
    )?;
    wait_until(
        "streams-a to hold the 3 leases of both streams",
        Duration::from_secs(40),
        Duration::from_millis(200),
        async || {
            // The table may not exist yet.
            let owners = ctx.owners().await.unwrap_or_default();
            Ok(owners.len() == 3 && owners.values().all(|o| o.as_deref() == Some("streams-a")))
        },
    )
    .await
    .map_err(|e| e.context(a.log_tail()))?;
    let owners = ctx.owners().await?;
    let of = |stream: &str| -> BTreeSet<String> {
        owners
            .keys()
            .filter(|k| multi_stream_key(k, stream))
            .cloned()
            .collect()
    };
    let (x_leases, y_leases) = (of(&x.stream), of(&y.stream));
    assert_eq!(
        (x_leases.len(), y_leases.len()),
        (2, 1),
        "KCL Java's multi-stream keys: {owners:?}"
    );

    // Windows close on a later record or at shutdown: give it time to read, then stop it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.stop().await?;
    let want: BTreeSet<String> = keys_of(&x_before)
        .union(&keys_of(&y_before))
        .cloned()
        .collect();
    let got = a.keys()?;
    let lost: Vec<&String> = want.difference(&got).collect();
    assert!(lost.is_empty(), "lost {lost:?}\n{}", a.log_tail());
    assert_eq!(
        a.shards()?,
        x_leases.union(&y_leases).cloned().collect(),
        "window lines name the shard by its lease key"
    );

    // The next deploy reads x only: x resumes at its checkpoints, y's lease goes after 2 s.
    let only_x = ["--streams", &x.stream, "--stream-removal-grace", "2s"];
    let mut b = Consumer::spawn_with(&ctx, "streams-b", &[&only_x[..], &sync].concat())?;
    let x_after = records("x-after", 20);
    x.put(&x_after).await?;
    let took = wait_until(
        "y's lease deleted, x's two kept",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || Ok(ctx.owners().await?.keys().cloned().collect::<BTreeSet<_>>() == x_leases),
    )
    .await
    .map_err(|e| e.context(b.log_tail()))?;
    eprintln!(
        "the left-out stream's lease was deleted {took:?} after streams-b started (grace 2 s)"
    );
    assert!(
        took >= Duration::from_secs(2),
        "deleted within the grace: {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.stop().await?;
    let got = b.keys()?;
    let (wanted, counted) = (keys_of(&x_after), keys_of(&x_before));
    let missing: Vec<&String> = wanted.difference(&got).collect();
    assert!(missing.is_empty(), "lost {missing:?}\n{}", b.log_tail());
    let again: Vec<&String> = got.intersection(&counted).collect();
    assert!(
        again.is_empty(),
        "checkpointed records counted again: {again:?}"
    );
    Ok(())
}
