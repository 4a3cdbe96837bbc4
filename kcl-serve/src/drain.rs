//! Draining a process before it is removed (a scale-in): `POST /drain`, and its client.
//!
//! An orchestrator removing a pod sends SIGTERM, and a graceful shutdown hands the leases back
//! at once: except under `restart_grace`, which keeps them for a return that a scale-in never
//! brings, so the fleet would wait the failover time and the grace. The pod's `preStop` hook
//! runs before that SIGTERM: it calls `POST /drain` on its own process, which starts the
//! worker's graceful shutdown with every lease released
//! ([`ShutdownHandle::drain`](kcl_core::ShutdownHandle::drain)), and waits until the worker
//! holds none. Then the process exits on its own, and the SIGTERM that follows finds nothing
//! left to do.
//!
//! `POST /drain` is answered for loopback peers only (the pod's own `preStop`): anyone else
//! reaching the HTTP port gets 403, for a drain stops the process. Each call waits up to
//! `?wait_ms=` (at most 5 s, below the server's request deadline) for the drain to finish, and
//! answers where it stands as JSON: `{"state": "draining" | "drained" | "stopped_holding",
//! "held": N, "held_at_start": N, "elapsed_ms": N}`, with 200 once drained, 202 while
//! draining, and 500 if the worker stopped with leases it could not hand back (they move after
//! the failover time). Calling it again is harmless: the client polls with it.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kcl_core::{Phase, ShutdownHandle, Status};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest one `POST /drain` waits before answering (below the request deadline).
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Where a drain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainState {
    /// Leases are being handed back.
    Draining,
    /// The worker is shutting down (or stopped) and holds no lease.
    Drained,
    /// The worker stopped holding leases it could not hand back: they move after the
    /// failover time.
    StoppedHolding,
}

impl DrainState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::StoppedHolding => "stopped_holding",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Draining, Self::Drained, Self::StoppedHolding]
            .into_iter()
            .find(|state| state.as_str() == s)
    }

    /// Where a worker whose status is `status` stands.
    fn of(status: &Status) -> Self {
        match (status.phase, status.held.is_empty()) {
            (Phase::ShuttingDown | Phase::Stopped, true) => Self::Drained,
            (Phase::Stopped, false) => Self::StoppedHolding,
            _ => Self::Draining,
        }
    }
}

/// What `POST /drain` needs of the process.
#[derive(Clone)]
struct Drain {
    handle: ShutdownHandle,
    status: watch::Receiver<Status>,
    /// The process's own jobs, stopped as on a signal.
    also: CancellationToken,
    /// When the drain was first asked for, and how many leases the worker held then.
    started: Arc<OnceLock<(Instant, usize)>>,
}

/// `POST /drain` for the worker behind `handle` and `status`; `also` is cancelled with it.
pub(crate) fn routes(
    handle: ShutdownHandle,
    status: watch::Receiver<Status>,
    also: CancellationToken,
) -> Router {
    Router::new()
        .route("/drain", post(drain))
        .with_state(Drain {
            handle,
            status,
            also,
            started: Arc::default(),
        })
}

/// True for a peer on this host (IPv4-mapped loopback included).
fn is_local(peer: Option<SocketAddr>) -> bool {
    peer.is_some_and(|p| p.ip().to_canonical().is_loopback())
}

/// `?wait_ms=N`, at most [`MAX_WAIT`] (and that when absent).
fn wait_of(request: &Request) -> Duration {
    let asked = request.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("wait_ms="))
            .and_then(|ms| ms.parse::<u64>().ok())
    });
    asked.map_or(MAX_WAIT, |ms| Duration::from_millis(ms).min(MAX_WAIT))
}

async fn drain(State(drain): State<Drain>, request: Request) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    if !is_local(peer) {
        return (
            StatusCode::FORBIDDEN,
            "POST /drain is answered for this host's own processes only (a preStop hook)\n",
        )
            .into_response();
    }
    let wait = wait_of(&request);
    let &(started, held_at_start) = drain.started.get_or_init(|| {
        let held = drain.status.borrow().held.len();
        tracing::info!(
            leases = held,
            "drain asked for: every lease is handed over and the process stops"
        );
        (Instant::now(), held)
    });
    drain.also.cancel();
    drain.handle.drain();
    let state = settled(drain.status.clone(), wait).await;
    let held = drain.status.borrow().held.len();
    let code = match state {
        DrainState::Drained => StatusCode::OK,
        DrainState::Draining => StatusCode::ACCEPTED,
        DrainState::StoppedHolding => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::json!({
        "state": state.as_str(),
        "held": held,
        "held_at_start": held_at_start,
        "elapsed_ms": elapsed,
    });
    (code, axum::Json(body)).into_response()
}

/// Where the drain stands once it finished, or after `wait`, or when the worker is gone.
async fn settled(mut status: watch::Receiver<Status>, wait: Duration) -> DrainState {
    let deadline = Instant::now() + wait;
    loop {
        let state = DrainState::of(&status.borrow_and_update());
        if state != DrainState::Draining {
            return state;
        }
        match tokio::time::timeout_at(deadline, status.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return DrainState::of(&status.borrow()),
        }
    }
}

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
struct Answer {
    state: DrainState,
    held: usize,
    held_at_start: usize,
    elapsed: Duration,
}

/// Asks the process serving on `listen` (an unspecified address means this host) to drain,
/// and waits until it holds no lease, at most `timeout`.
pub fn request(listen: SocketAddr, timeout: Duration) -> Result<Drained, DrainError> {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let start = std::time::Instant::now();
    let mut last: Option<Answer> = None;
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        let answer = match (post_drain(addr, left.min(MAX_WAIT)), last) {
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

/// `POST /drain?wait_ms=…` over a blocking socket.
fn post_drain(addr: SocketAddr, wait: Duration) -> Result<Answer, DrainError> {
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
        "POST /drain?wait_ms={} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        wait.as_millis()
    )
    .map_err(unreachable)?;
    let mut response = String::new();
    conn.read_to_string(&mut response).map_err(unreachable)?;
    parse(addr, &response)
}

/// A `POST /drain` answer from its HTTP response.
fn parse(addr: SocketAddr, response: &str) -> Result<Answer, DrainError> {
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
            elapsed: Duration::from_millis(ms),
        }),
        _ => Err(refused()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;
