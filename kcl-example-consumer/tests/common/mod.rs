//! Helpers shared by the binary's tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` over plain HTTP/1.1: the status code and the body, or `None` if nothing answers.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
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
