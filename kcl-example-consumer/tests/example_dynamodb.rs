//! `examples/dynamodb_streams.rs`, the code `docs/dynamodb-streams.md` shows, as a user runs
//! it: two processes with every default on one table's stream (moto), items inserted,
//! updated and deleted while the one reading is SIGTERMed. The other takes the lease over
//! from the handed-back checkpoint: every change is printed, none twice. The first item is
//! not an order (its `v` a string, with a binary and a list): it is printed as JSON like the
//! others and the changes after it flow (the example once failed its shard on it forever).
//! Logs go to stderr, without colour codes: stdout carries only the changes.

#![allow(clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::ensure;
use common::example::{self, Example, pid_of, printed_payloads};
use kcl_integration_tests::items::{self, Writer, Written};
use kcl_integration_tests::{Context, wait_until, with_timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_the_example_hand_a_table_stream_over_at_sigterm() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("example-ddb-fleet").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(180), Box::pin(run(ctx))).await
}

/// What the example prints for a change (after `<shard> <partition key>: `).
fn printed(w: &Written) -> String {
    format!("{} {}", w.event, serde_json::json!({"id": w.id, "v": w.v}))
}

/// An item of another shape than the example's `Order`, and what the example prints for it.
async fn put_odd_item(ctx: &Context, table: &str) -> anyhow::Result<String> {
    use aws_sdk_dynamodb::primitives::Blob;
    use aws_sdk_dynamodb::types::AttributeValue as A;
    ctx.dynamodb
        .put_item()
        .table_name(table)
        .item("id", A::S("odd-1".into()))
        .item("v", A::S("not a number".into()))
        .item("b", A::B(Blob::new(vec![1, 2])))
        .item("l", A::L(vec![A::N("1".into()), A::S("x".into())]))
        .send()
        .await?;
    Ok(r#"INSERT {"b":"AQI=","id":"odd-1","l":[1,"x"],"v":"not a number"}"#.to_owned())
}

/// The index in `fleet` of the process holding the stream's one lease, if any.
async fn holder(ctx: &Context, fleet: &[Example]) -> anyhow::Result<Option<usize>> {
    let owners = ctx.owners().await.unwrap_or_default();
    let pids: Vec<u32> = owners
        .values()
        .flatten()
        .filter_map(|o| pid_of(o))
        .collect();
    Ok(fleet.iter().position(|p| pids.contains(&p.pid())))
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    let table = format!("{}-items", ctx.table);
    items::create(&ctx, &table, true).await?;
    let odd = put_odd_item(&ctx, &table).await?;
    let mut writer = Writer::new(&ctx, &table, 5);
    writer.write_n(20).await?;
    let binary = example::binary("dynamodb_streams")?;
    let args = [table.as_str(), ctx.table.as_str()];
    let mut fleet = vec![
        Example::spawn(&ctx, &binary, "ddb-a", &args)?,
        Example::spawn(&ctx, &binary, "ddb-b", &args)?,
    ];
    let mut first = 0;
    wait_until(
        "one process to hold the lease and print the first 21 changes",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            let Some(i) = holder(&ctx, &fleet).await? else {
                return Ok(false);
            };
            first = i;
            Ok(printed_payloads(&fleet[i].stdout()).len() >= 21)
        },
    )
    .await
    .map_err(|e| e.context(fleet[0].output()))?;

    let live = writer.start(Duration::from_millis(40));
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet[first].signal("TERM")?;
    let status = fleet[first].wait_exit(Duration::from_secs(30)).await?;
    ensure!(status.success(), "{status}:\n{}", fleet[first].output());
    let other = 1 - first;
    let took = wait_until(
        "the other process to take the lease",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || Ok(holder(&ctx, &fleet).await? == Some(other)),
    )
    .await
    .map_err(|e| e.context(fleet[other].output()))?;
    eprintln!("the other process held the lease {took:?} after the SIGTERMed one exited");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writer = live.stop().await?;

    let mut want: BTreeSet<String> = writer.written.iter().map(printed).collect();
    want.insert(odd);
    wait_until(
        "every change printed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let got: BTreeSet<String> = fleet
                .iter()
                .flat_map(|p| printed_payloads(&p.stdout()))
                .collect();
            Ok(want.is_subset(&got))
        },
    )
    .await
    .map_err(|e| e.context(fleet[other].output()))?;
    fleet[other].signal("TERM")?;
    fleet[other].wait_exit(Duration::from_secs(30)).await?;
    for process in &fleet {
        process.logs_apart()?;
    }
    let (a, b) = (
        printed_payloads(&fleet[first].stdout()),
        printed_payloads(&fleet[other].stdout()),
    );
    let twice: Vec<&String> = a.intersection(&b).collect();
    ensure!(
        twice.is_empty(),
        "printed by both, across the SIGTERM handoff: {twice:?}"
    );
    eprintln!(
        "{} changes: {} before the SIGTERM, {} after, none twice",
        want.len(),
        a.len(),
        b.len()
    );
    Ok(())
}
