//! The binary as a user runs it: settings precedence through real environment variables,
//! one-line errors, and a graceful SIGTERM on the in-memory backend.
#![allow(clippy::panic, clippy::print_stderr)]

mod common;
use common::MEMORY_CONSUMER;
use kcl_integration_tests::http::{http_get, http_post, serving_addr};

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");

/// The binary with no `KCL_*` variable inherited from the environment running the tests.
fn consumer() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("KCL_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
}

/// The child's stderr, line by line, read on a thread of its own.
fn stderr_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("stderr"));
    let (lines_tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kcl-example-consumer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let file = temp_file(
        "precedence.toml",
        "stream = \"file-stream\"\napplication-name = \"file-app\"\nfailover-time = \"5s\"\n\
         window = \"7s\"\nmax-records = 100\n",
    );
    let out = output(
        consumer()
            .args(["--print-config", "--config"])
            .arg(&file)
            .args(["--max-records", "300"])
            .env("KCL_FAILOVER_TIME", "4s")
            .env("KCL_MAX_RECORDS", "200")
            .env("KCL_WORKER_ID", "from-env"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file_name = file.display().to_string();
    for expected in [
        "max-records = \"300\"  # --max-records".to_owned(),
        "failover-time = \"4s\"  # KCL_FAILOVER_TIME".to_owned(),
        "worker-id = \"from-env\"  # KCL_WORKER_ID".to_owned(),
        format!("window = \"7s\"  # {file_name}"),
        format!("stream = \"file-stream\"  # {file_name}"),
        "shutdown-timeout = \"30s\"  # default".to_owned(),
    ] {
        assert!(
            stdout.contains(&expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn invalid_values_fail_in_one_line_naming_the_key() {
    let out = output(
        consumer()
            .args([
                "--stream",
                "s",
                "--application-name",
                "app",
                "--print-config",
            ])
            .env("KCL_MAX_LEASES", "lots"),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("`max-leases`") && stderr.contains("KCL_MAX_LEASES"),
        "{stderr}"
    );

    let file = temp_file(
        "bad.yaml",
        "stream: s\napplication-name: app\nshutdown-timeout: soon\n",
    );
    let out = output(consumer().arg("--config").arg(&file));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`shutdown-timeout`") && stderr.contains("bad.yaml"),
        "{stderr}"
    );
}

#[test]
fn durations_too_long_for_a_clock_are_refused_at_start_naming_the_key() {
    for (flag, key) in [
        ("--shutdown-timeout", "`shutdown-timeout`"),
        ("--window", "`window`"),
        ("--failover-time", "`failover-time`"),
    ] {
        let out = output(consumer().args([
            "--stream",
            "s",
            "--application-name",
            "app",
            "--backend",
            "memory",
            flag,
            "500000000000years",
        ]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains("at most 7 days"),
            "{flag}: {stderr}"
        );
    }
}

#[test]
fn help_documents_every_option_with_its_default() {
    let out = output(consumer().arg("--help"));
    let help = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "--failover-time <DURATION>",
        "[default: 10s]",
        "[env: KCL_FAILOVER_TIME]",
        "[default: 0.0.0.0:8080]",
        "[default: TRIM_HORIZON]",
        "Precedence: command-line flag > KCL_* environment variable > config file > default",
    ] {
        assert!(help.contains(expected), "missing {expected:?} in:\n{help}");
    }
}

#[cfg(unix)]
#[test]
fn sigterm_shuts_down_gracefully() {
    let mut child = consumer()
        .args(MEMORY_CONSUMER)
        .args([
            "--worker-id",
            "test-worker",
            "--window",
            "1s",
            "--idle-time-between-reads",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let lines = stderr_lines(&mut child);
    let mut logs = Vec::new();
    let mut next_log = |within: Duration| -> Option<String> {
        let line = lines.recv_timeout(within).ok()?;
        logs.push(line.clone());
        Some(line)
    };

    // The server logs the address it bound.
    let addr = serving_addr(|| next_log(Duration::from_secs(20)));
    assert_eq!(http_get(addr, "/healthz").map(|r| r.0), Some(200));
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(addr, "/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let a few windows close.
    std::thread::sleep(Duration::from_millis(2500));
    let (code, metrics) = http_get(addr, "/metrics").unwrap_or_else(|| panic!("/metrics"));
    assert_eq!(code, 200);
    for name in [
        "kcl_records_processed_total",
        "kcl_leases_held",
        "kcl_batch_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "missing {name} in:\n{metrics}");
    }

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(killed.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    while next_log(Duration::from_millis(500)).is_some() {}
    let all_logs = logs.join("\n");
    assert!(status.success(), "exit {status:?}\n{all_logs}");
    assert!(all_logs.contains("shutting down"), "{all_logs}");

    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let windows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(windows.len() >= 2, "{stdout}");
    // The graceful stop emitted the open windows early.
    assert!(windows.iter().any(|w| w["complete"] == false), "{stdout}");
    // One summary line at the end: the records processed (every one counted in a window)
    // and the four leases handed back.
    let counted: u64 = windows.iter().filter_map(|w| w["records"].as_u64()).sum();
    let summaries: Vec<&String> = logs.iter().filter(|l| l.contains("stopped: ")).collect();
    assert_eq!(summaries.len(), 1, "{all_logs}");
    let want = format!("stopped: {counted} records processed, 4 leases handed back or over");
    assert!(
        summaries[0].contains(&want),
        "want {want:?} in {}",
        summaries[0]
    );
}

/// An endpoint nobody answers on: one WARN that says what to check, then quiet retries, and
/// `/readyz` says why it is not ready. (No emulator needed: nothing listens on the port.)
#[cfg(unix)]
#[test]
fn an_unreachable_endpoint_is_reported_once_with_a_hint_and_in_readyz() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"));
    let endpoint = format!("http://{closed}"); // the listener is dropped: refused
    let mut child = consumer()
        .args([
            "--stream",
            "s",
            "--application-name",
            "app",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--log-format", "json"])
        .env("AWS_ENDPOINT_URL_KINESIS", &endpoint)
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let lines = stderr_lines(&mut child);
    let addr = serving_addr(|| lines.recv_timeout(Duration::from_secs(20)).ok());
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (code, body) = http_get(addr, "/readyz").unwrap_or_else(|| panic!("/readyz"));
        if body.contains("problem=") {
            assert_eq!(code, 503, "{body}");
            break body;
        }
        assert!(Instant::now() < deadline, "no problem in /readyz: {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("Connection refused"), "{body}");
    assert!(body.contains("AWS_ENDPOINT_URL_DYNAMODB"), "{body}");
    // Several retries later, still one WARN.
    std::thread::sleep(Duration::from_secs(5));
    let _ = child.kill();
    let _ = child.wait();
    let logs: Vec<String> = lines.try_iter().collect();
    let warnings: Vec<&String> = logs.iter().filter(|l| l.contains("\"WARN\"")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning, not one per retry:\n{logs:#?}"
    );
    assert!(
        warnings[0].contains("check the endpoint"),
        "{}",
        warnings[0]
    );
}

/// The first scrape after start: every worker-level counter is there (at zero if nothing
/// happened yet, so `rate()` works from the start), every kcl series has its HELP line, and
/// the process metrics are there.
#[cfg(unix)]
#[test]
fn the_first_scrape_has_every_counter_and_every_help_line() {
    use kcl_core::metrics::{
        ALL, BISECTS, BYTES, DEAD_LETTERED, Kind, RECORDS, RETRIES, SINK_FAILURES, SKIPPED,
    };
    let mut child = consumer()
        .args(MEMORY_CONSUMER)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut stderr = BufReader::new(child.stderr.take().unwrap_or_else(|| panic!("stderr")));
    let addr = serving_addr(|| {
        let mut line = String::new();
        stderr.read_line(&mut line).ok().filter(|n| *n > 0)?;
        Some(line)
    });
    // Per-shard counters exist per held shard; histograms from the first batch on.
    let per_shard = [
        RECORDS,
        BYTES,
        RETRIES,
        DEAD_LETTERED,
        SKIPPED,
        BISECTS,
        SINK_FAILURES,
    ];
    let counters: Vec<&str> = ALL
        .iter()
        .filter(|(name, kind, _, _)| *kind == Kind::Counter && !per_shard.contains(name))
        .map(|(name, _, _, _)| *name)
        .collect();
    let has = |metrics: &str, name: &str| {
        metrics
            .lines()
            .any(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
    };
    // The worker registers its counters in one pass at its first cycle: a scrape may fall
    // inside that pass, so the first scrape after it is the one judged (within 10 s: a
    // counter never registered fails below).
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        if let Some((200, body)) = http_get(addr, "/metrics")
            && (counters.iter().all(|name| has(&body, name)) || Instant::now() >= deadline)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "no worker metrics");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    for name in &counters {
        assert!(
            has(&metrics, name),
            "{name} missing from the first scrape:\n{metrics}"
        );
    }
    let series: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .filter(|n| n.starts_with("kcl_"))
        .map(|n| {
            n.trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count")
        })
        .collect();
    for name in series {
        assert!(
            metrics.contains(&format!("# HELP {name} ")),
            "no HELP for {name}:\n{metrics}"
        );
    }
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(
            metrics.contains(&format!("\n{name} ")),
            "{name} missing:\n{metrics}"
        );
    }
}

/// `--summary-every`: the fleet's summary job prints a line a period; with a secret, its
/// messages endpoint takes a message with the secret (shown in the next line) and refuses
/// one without it; without a secret there is no endpoint at all.
#[cfg(unix)]
#[test]
fn the_summary_job_prints_and_takes_authenticated_messages() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let secret = "a-long-enough-shared-secret";
    let secret_file = temp_file("summary-secret", &format!("{secret}\n"));
    let listen = format!("127.0.0.1:{port}");
    let mut child = consumer()
        .args([
            "--backend",
            "memory",
            "--stream",
            "demo",
            "--application-name",
            "demo",
        ])
        .args(["--listen", &listen, "--worker-id", "summary-worker"])
        .args([
            "--summary-every",
            "1s",
            "--advertise",
            &format!("http://{listen}"),
        ])
        .arg("--messages-secret-file")
        .arg(&secret_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let _logs = stderr_lines(&mut child);
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let (tx, summaries) = mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if json.get("fleet_summary").is_some()
                && tx.send(json["fleet_summary"].clone()).is_err()
            {
                break;
            }
        }
    });
    // Once the worker holds the stream's 4 leases, the summary says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let summary = summaries
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("no summary line: {e}"));
        if summary["by_owner"]["summary-worker"] == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "never 4 leases: {summary}");
    }
    let addr: std::net::SocketAddr = listen.parse().unwrap_or_else(|e| panic!("{e}"));
    let path = "/singletons/summary/messages";
    assert_eq!(http_post(addr, path, "wrong", "intruder"), Some(401));
    assert_eq!(http_post(addr, path, secret, "hello"), Some(204));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let summary = summaries
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("no summary line: {e}"));
        let messages = summary["messages"].as_array().cloned().unwrap_or_default();
        assert!(!messages.iter().any(|m| m == "intruder"), "{summary}");
        if messages.iter().any(|m| m == "hello") {
            break;
        }
        assert!(Instant::now() < deadline, "the message never showed");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// `--otlp-endpoint`: the same metrics are pushed over OTLP/HTTP (protobuf) to a collector,
/// every `--otlp-interval`, while `/metrics` still serves them.
#[test]
fn the_metrics_are_pushed_over_otlp_too() {
    use std::io::Write;
    let collector = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let endpoint = format!(
        "http://{}/v1/metrics",
        collector.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    let mut child = consumer()
        .args(MEMORY_CONSUMER)
        .args(["--otlp-endpoint", &endpoint, "--otlp-interval", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // One request: its head, then its body (`Content-Length`), answered 200.
    collector
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut conn = loop {
        match collector.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                let _ = child.kill();
                panic!("no push within 30s: {e}");
            }
        }
    };
    conn.set_nonblocking(false)
        .unwrap_or_else(|e| panic!("{e}"));
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reader = BufReader::new(conn.try_clone().unwrap_or_else(|e| panic!("{e}")));
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{e}"));
        if line.trim().is_empty() {
            break;
        }
        head.push(line.trim().to_owned());
    }
    let length: usize = head
        .iter()
        .find_map(|h| {
            h.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().ok())
        })
        .flatten()
        .unwrap_or_else(|| panic!("no content-length: {head:?}"));
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    let _ = child.kill();
    let _ = child.wait();
    assert!(head[0].starts_with("POST /v1/metrics "), "{head:?}");
    assert!(
        head.iter()
            .any(|h| h.eq_ignore_ascii_case("content-type: application/x-protobuf")),
        "{head:?}"
    );
    let body = String::from_utf8_lossy(&body);
    for name in [
        "kcl_leases_held",
        "kcl_leases_taken_total",
        "kcl-example-consumer",
    ] {
        assert!(body.contains(name), "{name} missing from the push");
    }
}

/// A `KCL_…` variable meant for `run` is `run`'s: a wrong one fails `run` (naming it), never
/// the other subcommands, which read no `run` option.
#[test]
fn a_run_variable_fails_run_only() {
    let bad = |cmd: &mut Command| {
        cmd.env("KCL_MAX_LEASES", "lots");
    };
    let mut run = consumer();
    run.args([
        "--print-config",
        "--stream",
        "s",
        "--application-name",
        "app",
    ]);
    bad(&mut run);
    let out = output(&mut run);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("KCL_MAX_LEASES"),
        "{out:?}"
    );

    let mut cost = consumer();
    cost.args(["cost", "--shards", "4", "--workers", "2"]);
    bad(&mut cost);
    let out = output(&mut cost);
    assert!(out.status.success(), "{out:?}");

    // Nothing listens on port 1: the probe fails as a probe (exit 1), not as a usage error.
    let mut probe = consumer();
    probe.args(["healthcheck", "--listen", "127.0.0.1:1", "--timeout", "1s"]);
    bad(&mut probe);
    let out = output(&mut probe);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{out:?}"
    );
}

/// `healthcheck` probes where the consumer beside it serves: the config file's `listen`
/// (`KCL_CONFIG`) when no flag or `KCL_LISTEN` says otherwise.
#[test]
fn healthcheck_probes_the_config_files_listen() {
    let file = temp_file("hc.toml", "listen = \"127.0.0.1:1\"\n");
    let probe = |extra: &[&str], listen_env: Option<&str>| {
        let mut cmd = consumer();
        cmd.args(["healthcheck", "--timeout", "1s"]).args(extra);
        cmd.env("KCL_CONFIG", &file);
        if let Some(listen) = listen_env {
            cmd.env("KCL_LISTEN", listen);
        }
        let out = output(&mut cmd);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(
        probe(&[], None).contains("127.0.0.1:1:"),
        "the file's listen"
    );
    let flag = probe(&["--listen", "127.0.0.1:2"], None);
    assert!(
        flag.contains("127.0.0.1:2:"),
        "the flag beats the file: {flag}"
    );
    let env = probe(&[], Some("127.0.0.1:3"));
    assert!(
        env.contains("127.0.0.1:3:"),
        "KCL_LISTEN beats the file: {env}"
    );
}
