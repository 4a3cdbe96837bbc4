//! The probes survive a slowloris attack: 1,100 connections that never finish their request
//! headers, held open, against the binary limited to 1,024 open files (soft and hard, so it
//! cannot raise its own limit). Before the server had a connection limit, every `/healthz`
//! under this attack timed out (the process ran out of descriptors and accepted nothing), and
//! the kubelet would have killed a healthy worker.
#![allow(clippy::panic, clippy::print_stderr)]

mod common;
use common::MEMORY_CONSUMER;
use kcl_integration_tests::http::{http_get, serving_addr};

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kcl-example-consumer");
const ATTACKERS: usize = 1_100;

#[cfg(unix)]
#[test]
fn healthz_answers_while_1100_half_open_connections_are_held() {
    // The attacker (this process) needs more than 1,024 descriptors itself.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let mut child = Command::new("prlimit")
        .arg("--nofile=1024")
        .arg(BIN)
        .args(MEMORY_CONSUMER)
        .env_remove("KCL_LISTEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run prlimit (util-linux) and {BIN}: {e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("stderr"));
    let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
    let addr = serving_addr(|| lines.next());
    // Keep draining the logs so that the binary never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    assert_eq!(http_get(addr, "/healthz").map(|r| r.0), Some(200));

    let held: Vec<TcpStream> = (0..ATTACKERS)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").ok()?; // never finished
            Some(s)
        })
        .collect();
    assert_eq!(
        held.len(),
        ATTACKERS,
        "the attack could not open its connections"
    );

    for probe in 0..5 {
        let started = Instant::now();
        let answer = http_get(addr, "/healthz");
        let took = started.elapsed();
        assert_eq!(
            answer.as_ref().map(|r| r.0),
            Some(200),
            "probe {probe} under attack: {answer:?} after {took:?}"
        );
        assert!(took < Duration::from_secs(2), "probe {probe} took {took:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
}
