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
//! `POST /drain` stops the process, so it is answered only for a caller that can read this
//! process's drain token ([`token`]): a random secret written at start to a file (by default
//! `/tmp/kcl-drain-<port>.token`, mode 0600), sent as `Authorization: Bearer <token>`, from a
//! loopback peer. A sidecar forwarding traffic over localhost, `kubectl port-forward` or a
//! `hostNetwork` neighbour arrives from 127.0.0.1 too, but cannot read the pod's files: anyone
//! without the token gets 403. Each call waits up to `?wait_ms=` (at most 5 s, below the
//! server's request deadline) for the drain to finish, and answers where it stands as JSON:
//! `{"state": "draining" | "drained" | "kept" | "stopped_holding", "held": N,
//! "held_at_start": N, "kept": N, "elapsed_ms": N}`, with 200 once drained, 202 while
//! draining, 409 when a shutdown under `restart_grace` had begun before the drain and kept
//! `kept` leases for this worker's restart (the rest are handed over; those wait the failover
//! time and the grace, or `kcl-admin release`), and 500 if the worker stopped with leases it
//! could not hand back (they move after the failover time). Calling it again is harmless: the
//! client polls with it.

mod client;
pub mod token;

pub use client::{DrainError, Drained, request, request_with};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
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
    /// As [`Drained`](Self::Drained), but a shutdown under `restart_grace` had begun before
    /// the drain, and kept some leases for this worker's restart before it came.
    Kept,
    /// The worker stopped holding leases it could not hand back: they move after the
    /// failover time.
    StoppedHolding,
}

impl DrainState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::Kept => "kept",
            Self::StoppedHolding => "stopped_holding",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Draining,
            Self::Drained,
            Self::Kept,
            Self::StoppedHolding,
        ]
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
    /// What a caller must carry; `None` (it could not be written): every call is refused.
    token: Option<token::Token>,
    /// Whether the worker keeps its leases for its restart on a shutdown (`restart_grace`).
    restart_grace: bool,
    /// Leases the worker held when it was last running (before a shutdown began).
    running_held: Arc<AtomicUsize>,
    /// When the drain was first asked for, how many leases the worker held then, and how
    /// many a shutdown under `restart_grace` had already kept by then.
    started: Arc<OnceLock<(Instant, usize, usize)>>,
}

/// How the drain of a worker is set up: the worker (`handle`, `status`), the process's own
/// jobs (`also`, cancelled with it), its token (`None`: every call refused) and whether the
/// worker runs with a `restart_grace`.
pub(crate) struct Setup {
    pub(crate) handle: ShutdownHandle,
    pub(crate) status: watch::Receiver<Status>,
    pub(crate) also: CancellationToken,
    pub(crate) token: Option<token::Token>,
    pub(crate) restart_grace: bool,
}

/// `POST /drain` as `setup` says. Follows the worker's status (a task, until the worker is
/// gone) for the leases it holds while running.
pub(crate) fn routes(setup: Setup) -> Router {
    let running_held = Arc::new(AtomicUsize::new(setup.status.borrow().held.len()));
    tokio::spawn(follow_running(setup.status.clone(), running_held.clone()));
    Router::new()
        .route("/drain", post(drain))
        .with_state(Drain {
            handle: setup.handle,
            status: setup.status,
            also: setup.also,
            token: setup.token,
            restart_grace: setup.restart_grace,
            running_held,
            started: Arc::default(),
        })
}

/// Keeps in `held` how many leases the worker holds while it starts or runs.
async fn follow_running(mut status: watch::Receiver<Status>, held: Arc<AtomicUsize>) {
    loop {
        {
            let now = status.borrow_and_update();
            if matches!(now.phase, Phase::Starting | Phase::Running) {
                held.store(now.held.len(), Ordering::SeqCst);
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
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

/// Why a caller may not drain, if it may not.
fn refused(drain: &Drain, request: &Request) -> Option<&'static str> {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match &drain.token {
        _ if !is_local(peer) => {
            Some("POST /drain is answered for this host's own processes only (a preStop hook)\n")
        }
        None => Some(
            "POST /drain is refused: this process could not write its drain token at start \
             (see its log)\n",
        ),
        Some(token) if !token.admits(given) => Some(
            "POST /drain needs this process's drain token (Authorization: Bearer, from its \
             token file: `kcl-example-consumer drain` sends it)\n",
        ),
        Some(_) => None,
    }
}

/// When the drain began, how many leases the worker held then, and how many a shutdown under
/// `restart_grace` had already kept for its restart (said once, when it begins).
fn begun(drain: &Drain) -> (Instant, usize, usize) {
    *drain.started.get_or_init(|| {
        let held = drain.status.borrow().held.len();
        let late = drain.restart_grace && drain.handle.is_shutdown() && !drain.handle.is_draining();
        let kept = if late {
            drain
                .running_held
                .load(Ordering::SeqCst)
                .saturating_sub(held)
        } else {
            0
        };
        if kept > 0 {
            tracing::warn!(
                kept,
                leases = held,
                "drain asked for after a shutdown under restart_grace began: the leases it \
                 kept for this worker's restart wait the failover time and the grace (or \
                 kcl-admin release); the ones still held are handed over"
            );
        } else {
            tracing::info!(
                leases = held,
                "drain asked for: every lease is handed over and the process stops"
            );
        }
        (Instant::now(), held, kept)
    })
}

async fn drain(State(drain): State<Drain>, request: Request) -> Response {
    if let Some(why) = refused(&drain, &request) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let wait = wait_of(&request);
    let (started, held_at_start, kept) = begun(&drain);
    drain.also.cancel();
    drain.handle.drain();
    let state = match settled(drain.status.clone(), wait).await {
        DrainState::Drained if kept > 0 => DrainState::Kept,
        state => state,
    };
    let held = drain.status.borrow().held.len();
    let code = match state {
        DrainState::Drained => StatusCode::OK,
        DrainState::Draining => StatusCode::ACCEPTED,
        DrainState::Kept => StatusCode::CONFLICT,
        DrainState::StoppedHolding => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::json!({
        "state": state.as_str(),
        "held": held,
        "held_at_start": held_at_start,
        "kept": kept,
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;
