//! Worker OS processes (the `kcl-test-worker` binary): spawn, signal, wait, read back.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::Context;
use crate::journal::{Event, read_events};

/// A running `kcl-test-worker`. Killed (SIGKILL) when dropped, so a failing test leaks none.
#[derive(Debug)]
pub struct WorkerProcess {
    /// The worker id.
    pub id: String,
    /// Its JSONL journal.
    pub journal: PathBuf,
    /// Its stderr (tracing logs).
    pub log: PathBuf,
    child: Child,
}

/// The coordination mode worker processes run in: `KCL_TEST_COORDINATION` (`leader`, the
/// default, or `every-worker`), so that `scripts/test` runs the fleet tests in both modes.
pub fn coordination() -> String {
    std::env::var("KCL_TEST_COORDINATION").unwrap_or_else(|_| "leader".to_owned())
}

/// What proves worker processes alive: `KCL_TEST_LIVENESS` (`per-lease`, the default, or
/// `heartbeat`), so that `scripts/test` runs the fleet tests with heartbeats too.
pub fn liveness() -> String {
    std::env::var("KCL_TEST_LIVENESS").unwrap_or_else(|_| "per-lease".to_owned())
}

/// How worker processes read: `KCL_TEST_RETRIEVAL` (`polling`, the default, or `fan-out`),
/// so that `scripts/test` runs the fleet tests with enhanced fan-out too.
pub fn retrieval() -> String {
    std::env::var("KCL_TEST_RETRIEVAL").unwrap_or_else(|_| "polling".to_owned())
}

impl WorkerProcess {
    /// Starts `bin` (pass `env!("CARGO_BIN_EXE_kcl-test-worker")`) as worker `id` on the
    /// context's stream and table (its leases in the context's store: DynamoDB, or Postgres
    /// for a context of [`Context::new_postgres`]), with `extra` command-line arguments.
    pub fn spawn(bin: &str, ctx: &Context, id: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::spawn_in(&coordination(), bin, ctx, id, extra)
    }

    /// As [`spawn`](Self::spawn), in the coordination mode `mode` (`leader` or
    /// `every-worker`) whatever `KCL_TEST_COORDINATION` says.
    pub fn spawn_in(
        mode: &str,
        bin: &str,
        ctx: &Context,
        id: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let journal = ctx.path(&format!("{id}.jsonl"));
        let log = ctx.path(&format!("{id}.log"));
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(bin)
            .args([
                "--stream",
                &ctx.stream,
                "--table",
                &ctx.table,
                "--worker-id",
                id,
            ])
            .args(ctx.lease_store_args())
            .arg("--out")
            .arg(&journal)
            .arg("--coordination")
            .arg(mode)
            .args(
                (!extra.contains(&"--liveness"))
                    .then(|| ["--liveness".to_owned(), liveness()])
                    .into_iter()
                    .flatten(),
            )
            .args(
                (!extra.contains(&"--retrieval"))
                    .then(|| ["--retrieval".to_owned(), retrieval()])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .envs(ctx.worker_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {bin}"))?;
        Ok(Self {
            id: id.to_owned(),
            journal,
            log,
            child,
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid());
        }
        Ok(())
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Waits for the process to exit, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if start.elapsed() > limit {
                bail!("worker {} did not exit within {limit:?}", self.id);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The journal so far.
    pub fn events(&self) -> anyhow::Result<Vec<Event>> {
        read_events(&self.journal)
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The test worker's binary, for tests of other packages (whose `CARGO_BIN_EXE_*` name only
/// their own binaries): next to the running test's directory (`target/<profile>/`), built
/// there first if `cargo test` did not build it (`cargo test -p <that package>`).
pub fn test_worker_bin() -> anyhow::Result<std::path::PathBuf> {
    workspace_bin("kcl-integration-tests", "kcl-test-worker")
}

/// Binary `bin` of workspace package `package`, next to the running test's directory
/// (`target/<profile>/`), built there first if it is missing (a test of another package
/// only has its own package's binaries built).
pub fn workspace_bin(package: &str, bin: &str) -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> → target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .context("the test binary is not in target/<profile>/deps")?;
    let path = profile_dir.join(bin);
    if !path.exists() {
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", bin])
            .args(release.then_some("--release"))
            .current_dir(crate::repo_root())
            .status()
            .with_context(|| format!("running cargo build for {bin}"))?;
        anyhow::ensure!(status.success(), "building {bin} failed");
    }
    anyhow::ensure!(path.exists(), "no {} after building it", path.display());
    Ok(path)
}
