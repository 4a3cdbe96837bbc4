//! The binary's problem reports judged from outside, on its in-memory backend (a stream of 4
//! shards written to 20 times a second): a healthy consumer run past a short
//! `--stalled-after` reports nothing, while its windowed processor checkpoints as windows
//! close; a processor failing every call (`--inject-failure`) has each shard reported
//! `failing` within the documented time, and `/readyz` is not ready.
#![cfg(unix)]
#![allow(clippy::panic, clippy::print_stderr)]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::MEMORY_CONSUMER;
use kcl_integration_tests::http::{http_get, serving_addr};

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");

/// A consumer on the memory backend with `args`, and the address it serves on.
struct Consumer {
    child: Child,
    addr: std::net::SocketAddr,
}

impl Consumer {
    fn spawn(args: &[&str]) -> Self {
        let mut cmd = Command::new(BIN);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("KCL_") {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd
            .args(MEMORY_CONSUMER)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"));
        let stderr = child.stderr.take().unwrap_or_else(|| panic!("stderr"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr = serving_addr(|| lines.recv_timeout(Duration::from_secs(20)).ok());
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Self { child, addr }
    }

    fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).unwrap_or_else(|| panic!("{path} does not answer"))
    }

    /// The problems in `/status`, as `kind key`.
    fn problems(&self) -> Vec<String> {
        let status: serde_json::Value =
            serde_json::from_str(&self.get("/status").1).unwrap_or_default();
        let problems = status["problems"].as_array().cloned().unwrap_or_default();
        let named = problems.iter().map(|p| {
            let field = |f: &str| p[f].as_str().unwrap_or_default().to_owned();
            format!("{} {}", field("kind"), field("key"))
        });
        named.collect()
    }

    /// Every sample of `metric` (any labels) in `/metrics`.
    fn samples(&self, metric: &str) -> Vec<f64> {
        let text = self.get("/metrics").1;
        let values = text.lines().filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let rest = rest.strip_prefix(' ').or_else(|| {
                let (_, after) = rest.strip_prefix('{')?.split_once("} ")?;
                Some(after)
            })?;
            rest.trim().parse().ok()
        });
        values.collect()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 250 ms until it returns `Some`, for up to `limit`.
fn within<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(found) = check() {
            return Some((found, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

#[test]
fn a_busy_consumer_run_past_a_short_stalled_after_reports_nothing() {
    let stalled_after = Duration::from_secs(5);
    let c = Consumer::spawn(&["--window", "1s", "--stalled-after", "5s"]);
    let ready = within(Duration::from_secs(20), || {
        (c.get("/readyz").0 == 200 && c.samples("kcl_checkpoint_age_seconds").len() == 4)
            .then_some(())
    });
    assert!(
        ready.is_some(),
        "never ready with 4 shards: {:?}",
        c.get("/readyz")
    );
    let checkpoints = c.samples("kcl_checkpoints_total");
    let (mut oldest, start) = (0.0_f64, Instant::now());
    while start.elapsed() < stalled_after * 4 {
        assert_eq!(c.problems(), Vec::<String>::new(), "no problem");
        assert_eq!(c.samples("kcl_shards_stalled"), [0.0], "no stalled gauge");
        let ages = c.samples("kcl_checkpoint_age_seconds");
        oldest = ages.into_iter().fold(oldest, f64::max);
        assert_eq!(c.get("/readyz").0, 200);
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("the oldest checkpoint age seen: {oldest} s");
    assert!(oldest < 4.0, "ages stay near the window: {oldest}");
    let later = c.samples("kcl_checkpoints_total");
    assert!(
        later.iter().sum::<f64>() >= checkpoints.iter().sum::<f64>() + 4.0 * 10.0,
        "windows closed and were checkpointed: {checkpoints:?} then {later:?}"
    );
}

#[test]
fn a_processor_failing_every_batch_is_reported_failing_and_not_ready() {
    reported_failing("process-records");
}

#[test]
fn a_processor_failing_to_initialize_is_reported_failing_and_not_ready() {
    reported_failing("initialize");
}

/// Every shard `failing` within 30 s (docs/operations.md: five attempts in a row, 8 to 15 s
/// after the first failure with the default backoff), its gauge at 4, `/readyz` 503.
fn reported_failing(hook: &str) {
    let c = Consumer::spawn(&["--inject-failure", hook]);
    let leased = within(Duration::from_secs(20), || {
        (c.samples("kcl_leases_held") == [4.0]).then_some(())
    });
    assert!(leased.is_some(), "4 leases never held");
    let found = within(Duration::from_secs(30), || {
        let failing = c
            .problems()
            .iter()
            .filter(|p| p.starts_with("failing "))
            .count();
        (failing == 4 && c.samples("kcl_shards_failing") == [4.0]).then_some(())
    });
    let (_, after) = found.unwrap_or_else(|| panic!("not failing: {:?}", c.get("/status")));
    eprintln!("{hook}: every shard failing {after:?} after the leases were held");
    let (code, body) = c.get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("failing"), "{body}");
    let (_, status) = c.get("/status");
    assert!(status.contains("on purpose (--inject-failure)"), "{status}");
    assert!(status.contains("\"ready\":false"), "{status}");
}

/// `/status` answers the on-call questions (issue 35): which worker leads (this one, alone),
/// whether it is draining, and per shard the owner, checkpoint, lag behind the stream's tip
/// and the time since it last progressed.
#[test]
fn status_names_the_leader_and_each_shards_checkpoint_lag_and_progress() {
    let c = Consumer::spawn(&["--window", "1s", "--worker-id", "w-status"]);
    let status = within(Duration::from_secs(30), || {
        let status: serde_json::Value =
            serde_json::from_str(&c.get("/status").1).unwrap_or_default();
        let shards = status["shards"].as_array().cloned().unwrap_or_default();
        let complete = shards.len() == 4
            && shards.iter().all(|s| {
                s["checkpoint"]
                    .as_str()
                    .is_some_and(|c| c != "TRIM_HORIZON")
                    && s["millis_behind_latest"].is_u64()
                    && s["last_progress_seconds_ago"].is_u64()
            });
        (complete && status["leader"].is_string()).then_some(status)
    });
    let Some((status, _)) = status else {
        panic!("/status never complete: {}", c.get("/status").1);
    };
    assert_eq!(status["leader"], "w-status", "{status}");
    assert_eq!(status["leading"], true, "{status}");
    assert_eq!(status["draining"], false, "{status}");
    for shard in status["shards"].as_array().into_iter().flatten() {
        assert_eq!(shard["owner"], "w-status", "{shard}");
        assert!(
            shard["shard"]
                .as_str()
                .is_some_and(|s| s.starts_with("shardId-"))
        );
        let ago = shard["last_progress_seconds_ago"]
            .as_u64()
            .unwrap_or(u64::MAX);
        assert!(ago < 5, "a busy shard progressed lately: {shard}");
    }
}
