//! The README's library example (`examples/aws_consumer.rs`, as built by `cargo test`) against
//! the emulators: it reads every record, and on SIGTERM hands every lease back before it
//! exits, as a Kubernetes or ECS stop would ask it to.

#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kcl_integration_tests::{Context, wait_until, with_timeout};

/// `target/<profile>/examples/aws_consumer`, next to the `deps` folder this test runs from,
/// built (or brought up to date) first by the cargo that runs this test.
fn example_binary() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "kcl-example-consumer",
            "--example",
            "aws_consumer",
        ])
        .status()?;
    ensure!(built.success(), "building the example failed");
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary has no profile folder")?;
    let path = profile_dir
        .join("examples")
        .join(format!("aws_consumer{}", std::env::consts::EXE_SUFFIX));
    ensure!(
        path.exists(),
        "{} is missing: `cargo test -p kcl-example-consumer` builds it, or \
         `cargo build -p kcl-example-consumer --example aws_consumer`",
        path.display()
    );
    Ok(path)
}

struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let stdout = ctx.path("example.stdout");
    let stderr = ctx.path("example.stderr");
    let mut example = Example(
        Command::new(example_binary()?)
            .args([&ctx.stream, &ctx.table])
            .envs(ctx.worker_env())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()?,
    );
    let read = |path: &PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    wait_until(
        "the example to print every record",
        Duration::from_secs(60),
        Duration::from_millis(200),
        async || {
            let out = read(&stdout);
            Ok(written
                .iter()
                .all(|(key, data)| out.contains(&format!("{key}: {data}"))))
        },
    )
    .await
    .with_context(|| format!("stdout:\n{}\nstderr:\n{}", read(&stdout), read(&stderr)))?;
    let owners = ctx.owners().await?;
    ensure!(
        owners.len() == 4 && owners.values().all(Option::is_some),
        "the example holds all 4 leases before SIGTERM: {owners:?}"
    );

    let pid = example.0.id().to_string();
    ensure!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()?
            .success()
    );
    let status = loop {
        if let Some(status) = example.0.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        status.success(),
        "the example exits cleanly on SIGTERM ({status}):\n{}",
        read(&stderr)
    );
    let owners = ctx.owners().await?;
    eprintln!("after SIGTERM: {owners:?}");
    if owners.values().any(Option::is_some) {
        bail!("every lease is handed back on SIGTERM, found {owners:?}");
    }
    Ok(())
}
