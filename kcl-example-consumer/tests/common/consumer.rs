//! One `kcl-example-consumer` process against the emulators, as the emulator tests start it.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kcl_integration_tests::Context;

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");

/// One `kcl-example-consumer` process; killed if still running when dropped.
pub(crate) struct Consumer {
    child: Child,
    addr: SocketAddr,
    stdout: PathBuf,
    log: PathBuf,
}

impl Consumer {
    /// A consumer of the test's stream.
    pub(crate) fn spawn(ctx: &Context, id: &str) -> anyhow::Result<Self> {
        Self::spawn_with(ctx, id, &["--stream", &ctx.stream])
    }

    /// A consumer with `args` (the streams, and more) on top of the test's settings: the
    /// test's table, 3 s failover, 1 s windows listing every key, JSON logs.
    pub(crate) fn spawn_with(ctx: &Context, id: &str, args: &[&str]) -> anyhow::Result<Self> {
        Self::start(ctx, id, &ctx.table, args)
    }

    /// A consumer of the test's stream for `application` rather than the test's, with
    /// `args` on top of the test's settings.
    pub(crate) fn spawn_for(
        ctx: &Context,
        id: &str,
        application: &str,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start(
            ctx,
            id,
            application,
            &[&["--stream", &ctx.stream], args].concat(),
        )
    }

    fn start(ctx: &Context, id: &str, application: &str, args: &[&str]) -> anyhow::Result<Self> {
        let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let stdout = ctx.path(&format!("{id}.windows.jsonl"));
        let log = ctx.path(&format!("{id}.log"));
        let child = Command::new(BIN)
            .args(args)
            .args(["--application-name", application])
            .args(["--worker-id", id, "--listen", &addr.to_string()])
            .args([
                "--failover-time",
                "3s",
                "--window",
                "1s",
                "--top-keys",
                "100000",
            ])
            .args(["--idle-time-between-reads", "200ms", "--log-format", "json"])
            .envs(ctx.worker_env())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Self {
            child,
            addr,
            stdout,
            log,
        })
    }

    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        kcl_integration_tests::http::http_get(self.addr, path)
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()));
    }

    /// SIGTERM, then a successful exit within 30 s.
    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        self.terminate();
        let status = self.wait_exit(Duration::from_secs(30)).await?;
        anyhow::ensure!(
            status.success(),
            "exited with {status}:\n{}",
            self.log_tail()
        );
        Ok(())
    }

    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(
                start.elapsed() < limit,
                "no exit within {limit:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This process's window lines.
    fn windows(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let text = std::fs::read_to_string(&self.stdout)?;
        Ok(text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?)
    }

    /// Partition keys listed in this process's window lines.
    pub(crate) fn keys(&self) -> anyhow::Result<BTreeSet<String>> {
        let mut keys = BTreeSet::new();
        for window in self.windows()? {
            for k in window["top_keys"].as_array().into_iter().flatten() {
                keys.insert(k["key"].as_str().unwrap_or_default().to_owned());
            }
        }
        Ok(keys)
    }

    /// The shards named in this process's window lines.
    pub(crate) fn shards(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .windows()?
            .iter()
            .map(|w| w["shard"].as_str().unwrap_or_default().to_owned())
            .collect())
    }

    /// Its log lines.
    pub(crate) fn log(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// Its log lines at ERROR that contain every one of `words`.
    pub(crate) fn errors_with(&self, words: &[&str]) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.contains("\"ERROR\"") && words.iter().all(|w| l.contains(w)))
            .collect()
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn records(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), format!("{prefix} record {i}")))
        .collect()
}
