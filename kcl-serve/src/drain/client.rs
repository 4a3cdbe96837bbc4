//! The client of `POST /drain`: what `kcl-example-consumer drain` (a `preStop` hook) runs.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::{DrainState, MAX_WAIT, token};

/// A finished drain, as [`request`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Leases the worker held when the drain began.
    pub leases: usize,
    /// How long it took, from the drain's start.
    pub took: Duration,
}

/// Why a drain did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DrainError {
    /// Nothing answered at the address.
    #[error("cannot reach {addr}: {reason}")]
    Unreachable {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The process answered something else than a drain's answer.
    #[error("{addr} answered {code}: {body}")]
    Refused {
        /// The address.
        addr: SocketAddr,
        /// The HTTP status code.
        code: u16,
        /// What it said.
        body: String,
    },
    /// Still holding leases at the deadline.
    #[error("still holding {held} of {leases} leases after {waited:?}")]
    TimedOut {
        /// Leases held when the drain began.
        leases: usize,
        /// Leases still held.
        held: usize,
        /// How long the client waited.
        waited: Duration,
    },
    /// The worker stopped holding leases it could not hand back.
    #[error(
        "the worker stopped holding {held} of {leases} leases it could not hand back: they move \
         after the failover time"
    )]
    StoppedHolding {
        /// Leases held when the drain began.
        leases: usize,
        /// Leases not handed back.
        held: usize,
    },
    /// The drain token could not be read (the process is not beside this one, or writes its
    /// token elsewhere: `--drain-token-file`).
    #[error("cannot read the drain token from {path}: {reason}")]
    Token {
        /// The token file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A shutdown under `restart_grace` had begun before the drain, and kept leases for this
    /// worker's restart; the ones still held when the drain came were handed over.
    #[error(
        "not drained: a shutdown under restart-grace had begun before the drain and kept \
         {kept} leases for this worker's restart (others take them after failover-time + \
         restart-grace, or as soon as this worker starts again under its id); the {handed_over} still held \
         were handed over"
    )]
    Kept {
        /// Leases kept for the restart before the drain came.
        kept: usize,
        /// Leases held when the drain came, handed over.
        handed_over: usize,
    },
    /// The process went away while leases were still held at its last answer.
    #[error(
        "the process exited while draining; it held {held} of {leases} leases at its last answer"
    )]
    Exited {
        /// Leases held when the drain began.
        leases: usize,
        /// Leases held at the last answer.
        held: usize,
    },
}

/// One answer of `POST /drain`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub(super) state: DrainState,
    pub(super) held: usize,
    pub(super) held_at_start: usize,
    pub(super) kept: usize,
    pub(super) elapsed: Duration,
}

/// Asks the process serving on `listen` (an unspecified address means this host) to drain,
/// with the token in its default file ([`token::default_path`] of `listen`'s port), and waits
/// until it holds no lease, at most `timeout`.
pub fn request(listen: SocketAddr, timeout: Duration) -> Result<Drained, DrainError> {
    request_with(listen, &token::default_path(listen.port()), timeout)
}

/// As [`request`], with the token read from `token_file`.
pub fn request_with(
    listen: SocketAddr,
    token_file: &Path,
    timeout: Duration,
) -> Result<Drained, DrainError> {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let secret = match token::read(token_file) {
        Ok(secret) => secret,
        Err(e) => {
            // Nothing listening says more than a missing token (the process is not running).
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(|e| {
                DrainError::Unreachable {
                    addr,
                    reason: e.to_string(),
                }
            })?;
            return Err(DrainError::Token {
                path: token_file.display().to_string(),
                reason: e.to_string(),
            });
        }
    };
    let start = std::time::Instant::now();
    let mut last: Option<Answer> = None;
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        let answer = match (post_drain(addr, &secret, left.min(MAX_WAIT)), last) {
            (Ok(answer), _) => answer,
            (Err(error), None) => return Err(error),
            // It answered before and is gone now: its shutdown ended.
            (Err(_), Some(a)) if a.held == 0 => return Ok(drained(a)),
            (Err(_), Some(a)) => {
                return Err(DrainError::Exited {
                    leases: a.held_at_start,
                    held: a.held,
                });
            }
        };
        match answer.state {
            DrainState::Drained => return Ok(drained(answer)),
            DrainState::Kept => {
                return Err(DrainError::Kept {
                    kept: answer.kept,
                    handed_over: answer.held_at_start,
                });
            }
            DrainState::StoppedHolding => {
                return Err(DrainError::StoppedHolding {
                    leases: answer.held_at_start,
                    held: answer.held,
                });
            }
            DrainState::Draining if left.is_zero() => {
                return Err(DrainError::TimedOut {
                    leases: answer.held_at_start,
                    held: answer.held,
                    waited: start.elapsed(),
                });
            }
            DrainState::Draining => {
                last = Some(answer);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn drained(answer: Answer) -> Drained {
    Drained {
        leases: answer.held_at_start,
        took: answer.elapsed,
    }
}

/// `POST /drain?wait_ms=…` over a blocking socket, with the token.
fn post_drain(addr: SocketAddr, secret: &str, wait: Duration) -> Result<Answer, DrainError> {
    use std::io::{Read, Write};
    let unreachable = |e: std::io::Error| DrainError::Unreachable {
        addr,
        reason: e.to_string(),
    };
    let mut conn =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(unreachable)?;
    conn.set_read_timeout(Some(wait + Duration::from_secs(5)))
        .map_err(unreachable)?;
    write!(
        conn,
        "POST /drain?wait_ms={} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {secret}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        wait.as_millis()
    )
    .map_err(unreachable)?;
    let mut response = String::new();
    conn.read_to_string(&mut response).map_err(unreachable)?;
    parse(addr, &response)
}

/// A `POST /drain` answer from its HTTP response.
pub(super) fn parse(addr: SocketAddr, response: &str) -> Result<Answer, DrainError> {
    let code: u16 = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .trim();
    let refused = || DrainError::Refused {
        addr,
        code,
        body: body.to_owned(),
    };
    let json: serde_json::Value = serde_json::from_str(body).map_err(|_| refused())?;
    let number = |key: &str| json.get(key).and_then(serde_json::Value::as_u64);
    let count = |key: &str| number(key).and_then(|n| usize::try_from(n).ok());
    let state = json
        .get("state")
        .and_then(|s| s.as_str())
        .and_then(DrainState::parse);
    match (
        state,
        count("held"),
        count("held_at_start"),
        number("elapsed_ms"),
    ) {
        (Some(state), Some(held), Some(held_at_start), Some(ms)) => Ok(Answer {
            state,
            held,
            held_at_start,
            // Absent from an earlier version's answer.
            kept: count("kept").unwrap_or(0),
            elapsed: Duration::from_millis(ms),
        }),
        _ => Err(refused()),
    }
}
