//! `kcl-example-consumer drain`, as a pod's `preStop` hook runs it beside the consumer: on the
//! in-memory backend, under a restart grace (which a SIGTERM would honour by keeping the
//! leases), the consumer hands every lease over, says so, and exits on its own. Before that,
//! `--scaler-port` serves KEDA's external scaler: `GetMetrics` answers the leader's figure
//! (this one worker leads), as its `/metrics` shows it.
#![allow(clippy::panic, clippy::print_stderr)]

mod common;
use common::MEMORY_CONSUMER;
use kcl_integration_tests::http::{http_get, serving_addr};

use kcl_scaler::proto::{GetMetricsRequest, ScaledObjectRef};

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
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

#[test]
fn drain_hands_every_lease_over_even_under_a_restart_grace_and_the_consumer_exits() {
    let mut child = consumer()
        .args(MEMORY_CONSUMER)
        .args([
            "--worker-id",
            "w",
            "--restart-grace",
            "60s",
            "--scaler-port",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("stderr"));
    let (tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut logs = Vec::new();
    let mut next_log = |within: Duration| -> Option<String> {
        let line = lines.recv_timeout(within).ok()?;
        logs.push(line.clone());
        Some(line)
    };
    // The HTTP server's and the scaler's addresses, each from its `serving` line.
    let (mut http, mut scaler) = (None, None);
    while http.is_none() || scaler.is_none() {
        let line = next_log(Duration::from_secs(20)).unwrap_or_else(|| panic!("no serving lines"));
        if line.contains("/healthz") {
            http = Some(serving_addr(|| Some(line.clone())));
        }
        if line.contains("external scaler") {
            scaler = Some(serving_addr(|| Some(line.clone())));
        }
    }
    let (addr, scaler) = (
        http.unwrap_or_else(|| unreachable!()),
        scaler.unwrap_or_else(|| unreachable!()),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !http_get(addr, "/status").is_some_and(|(_, body)| body.contains("shardId-000000000003"))
    {
        assert!(Instant::now() < deadline, "never held the 4 shards");
        std::thread::sleep(Duration::from_millis(100));
    }
    scaler_answers_as_metrics_say(addr, scaler);
    // As the manifests call it: no --addr, the consumer's own KCL_LISTEN (on every address).
    let drain = consumer()
        .args(["drain", "--timeout", "20s"])
        .env("KCL_LISTEN", format!("0.0.0.0:{}", addr.port()))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&drain.stdout);
    assert!(drain.status.success(), "{drain:?}");
    assert!(
        said.starts_with("drained: 4 leases handed over in "),
        "{said}"
    );

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no exit after the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    while next_log(Duration::from_millis(500)).is_some() {}
    let all = logs.join("\n");
    assert!(status.success(), "exit {status:?}\n{all}");
    assert!(all.contains("drain asked for"), "{all}");
    assert!(all.contains("4 leases handed back or over"), "{all}");
    assert!(
        !all.contains("keeping the lease"),
        "released, not kept: {all}"
    );
}

#[test]
fn drain_with_nothing_listening_says_so_and_fails() {
    let out = consumer()
        .args(["drain", "--addr", "127.0.0.1:1", "--timeout", "2s"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("drain: cannot reach 127.0.0.1:1"), "{said}");
}

/// `GetMetrics` (`desiredWorkers`) equals `kcl_fleet_desired_workers` on `/metrics`, read
/// before and after it (a cycle may fall between).
fn scaler_answers_as_metrics_say(http: SocketAddr, scaler: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let gauge = || {
        let (_, body) = http_get(http, "/metrics").unwrap_or_else(|| panic!("/metrics"));
        let line = body
            .lines()
            .find(|l| l.starts_with("kcl_fleet_desired_workers "))
            .map(str::to_owned);
        line.and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
    };
    runtime.block_on(async {
        let mut client = kcl_scaler::connect(format!("http://{scaler}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let request = || GetMetricsRequest {
            scaled_object_ref: Some(ScaledObjectRef::default()),
            metric_name: "desiredWorkers".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let before = gauge();
            let answer = client.get_metrics(request()).await;
            let after = gauge();
            if let Ok(answer) = answer {
                let values = answer.into_inner().metric_values;
                let value = values.first().map(|v| v.metric_value_float);
                assert!(
                    value.is_some() && (value == before || value == after),
                    "answered {values:?}, the gauge showed {before:?} then {after:?}"
                );
                return;
            }
            // No figure yet (the first cycle has not run): UNAVAILABLE, never a zero.
            let code = answer.err().map(|e| e.code());
            assert_eq!(code, Some(tonic::Code::Unavailable));
            assert!(Instant::now() < deadline, "the scaler never had a figure");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}
