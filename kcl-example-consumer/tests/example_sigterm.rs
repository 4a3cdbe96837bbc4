//! The README's library example (`examples/aws_consumer.rs`, as built by `cargo test`) against
//! the emulators: it reads every record, and on SIGTERM hands every lease back before it
//! exits, as a Kubernetes or ECS stop would ask it to.

#![allow(clippy::print_stderr)]

mod common;

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kcl_integration_tests::{Context, wait_until, with_timeout};

use common::example::{self, Example};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_hands_every_lease_back_on_sigterm() -> anyhow::Result<()> {
    let Some(ctx) = Context::new("readme-example").await? else {
        return Ok(());
    };
    with_timeout(Duration::from_secs(120), run(ctx)).await
}

async fn run(ctx: Context) -> anyhow::Result<()> {
    ctx.create_stream(4).await?;
    let written: Vec<(String, String)> = (0..12)
        .map(|i| (format!("key-{i}"), format!("payload {i}")))
        .collect();
    ctx.put(&written).await?;
    let binary = example::binary("aws_consumer")?;
    let mut example = Example::spawn(&ctx, &binary, "example", &[&ctx.stream, &ctx.table])?;
    wait_until(
        "the example to print every record",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            let out = example.stdout();
            Ok(written
                .iter()
                .all(|(key, data)| out.contains(&format!("{key}: {data}"))))
        },
    )
    .await
    .with_context(|| example.output())?;
    let owners = ctx.owners().await?;
    ensure!(
        owners.len() == 4 && owners.values().all(Option::is_some),
        "the example holds all 4 leases before SIGTERM: {owners:?}"
    );

    example.signal("TERM")?;
    let status = example.wait_exit(Duration::from_secs(30)).await?;
    ensure!(
        status.success(),
        "the example exits cleanly on SIGTERM ({status}):\n{}",
        example.output()
    );
    let owners = ctx.owners().await?;
    eprintln!("after SIGTERM: {owners:?}");
    if owners.values().any(Option::is_some) {
        bail!("every lease is handed back on SIGTERM, found {owners:?}");
    }
    Ok(())
}
