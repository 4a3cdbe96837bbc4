//! A process of one of the crate's examples (`examples/*.rs`), built and started as a user
//! would: `cargo build --example NAME`, then the binary with the emulators' environment.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kcl_integration_tests::Context;

/// `target/<profile>/examples/<name>`, next to the `deps` folder the test runs from, built (or
/// brought up to date) first by the cargo that runs the test.
pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "kcl-example-consumer",
            "--example",
        ])
        .arg(name)
        .status()?;
    ensure!(built.success(), "building the example {name} failed");
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary has no profile folder")?;
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    ensure!(
        path.exists(),
        "{} is missing after the build",
        path.display()
    );
    Ok(path)
}

/// One example process, its stdout and stderr in files; killed if still running when dropped.
pub(crate) struct Example {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Example {
    /// Starts `binary` with `args` and the test's environment; its output goes to
    /// `<label>.stdout` and `<label>.stderr` in the test's folder.
    pub(crate) fn spawn(
        ctx: &Context,
        binary: &PathBuf,
        label: &str,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let stdout = ctx.path(&format!("{label}.stdout"));
        let stderr = ctx.path(&format!("{label}.stderr"));
        let child = Command::new(binary)
            .args(args)
            .envs(ctx.worker_env())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        Ok(Self {
            child,
            stdout,
            stderr,
        })
    }

    /// The OS process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it printed on stdout so far.
    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Its stdout and stderr, for failure messages.
    pub(crate) fn output(&self) -> String {
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!("stdout:\n{}\nstderr:\n{stderr}", self.stdout())
    }

    /// Fails unless its logs went to stderr without colour codes (a file is no terminal) and
    /// its stdout holds only what the program prints (`shardId-…` lines).
    pub(crate) fn logs_apart(&self) -> anyhow::Result<()> {
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let stdout = self.stdout();
        let other = stdout.lines().find(|l| !l.starts_with("shardId-"));
        anyhow::ensure!(other.is_none(), "not a record on stdout: {other:?}");
        anyhow::ensure!(
            stderr.contains(" INFO "),
            "no log line on stderr:\n{stderr}"
        );
        anyhow::ensure!(
            !stderr.contains('\u{1b}'),
            "colour codes in the logs:\n{stderr}"
        );
        Ok(())
    }

    /// Fails, with its output, if the process has exited.
    pub(crate) fn ensure_running(&mut self, what: &str) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{what} exited ({status}):\n{}", self.output());
        }
        Ok(())
    }

    /// Sends `signal` (`TERM`, `KILL`, …).
    pub(crate) fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()?;
        ensure!(status.success(), "kill -{signal} {} failed", self.pid());
        Ok(())
    }

    /// Waits for the process to exit, at most `limit`.
    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("pid {} did not exit within {limit:?}", self.pid());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The payloads `aws_consumer` printed (`<shard> <partition key>: <data>` lines; log lines
/// and anything else are skipped).
pub(crate) fn printed_payloads(stdout: &str) -> BTreeSet<String> {
    stdout
        .lines()
        .filter(|line| line.starts_with("shardId-"))
        .filter_map(|line| line.split_once(": ").map(|(_, data)| data.to_owned()))
        .collect()
}

/// The process id in a default worker id (`<hostname>-<pid>-<4 hex digits>`).
pub(crate) fn pid_of(worker_id: &str) -> Option<u32> {
    let mut parts = worker_id.rsplitn(3, '-');
    let _random = parts.next()?;
    parts.next()?.parse().ok()
}
