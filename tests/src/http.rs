//! Talking to a binary's HTTP server (`/healthz`, `/readyz`, `/metrics`, `/status`) from a
//! test: plain HTTP/1.1 over a socket, so the tests need no HTTP client crate.
#![allow(clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The address the server logged (`serving …` with an `addr` field), from JSON log lines.
pub fn serving_addr(mut next_line: impl FnMut() -> Option<String>) -> SocketAddr {
    loop {
        let line = next_line().unwrap_or_else(|| panic!("no `serving` log line"));
        let json: Option<serde_json::Value> = serde_json::from_str(&line).ok();
        if let Some(addr) = json
            .as_ref()
            .and_then(|j| j.get("addr"))
            .and_then(|a| a.as_str())
        {
            return addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
        }
    }
}

/// `GET path` over plain HTTP/1.1: the status code and the body, or `None` if nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// `POST path` with `body` and an `Authorization: Bearer` header: the status code, or `None`
/// if nothing answers.
pub fn http_post(addr: SocketAddr, path: &str, bearer: &str, body: &str) -> Option<u16> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {bearer}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}
