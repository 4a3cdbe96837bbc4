//! What the scaler's server allows, and its connections' places.
//!
//! The scaler runs inside a worker that must keep renewing its leases, so no client may take
//! more of the process than a few connections and streams, whatever it opens. As kcl-serve's
//! HTTP server is bounded, so is this one (see [`Limits`]):
//! - at most [`Limits::max_connections`] connections are open. When a new one finds them all
//!   taken, the oldest with no call in flight (an idle or refused client) is closed to make
//!   room; only if every connection has a call in flight is the new one refused. A call is in
//!   flight from the moment the service sees it until its answer (for `StreamIsActive`, the
//!   stream's end), and a connection is chosen for eviction and marked so under one lock, so a
//!   call that has begun is never cut off to make room;
//! - a connection carries at most [`Limits::max_calls_per_connection`] calls at once (HTTP/2
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`, and tonic's concurrency limit with load shedding: a
//!   call beyond it is RESOURCE_EXHAUSTED at once);
//! - at most [`Limits::max_streams`] `StreamIsActive` streams are open on the whole server
//!   (RESOURCE_EXHAUSTED beyond), and each ends after [`Limits::stream_lifetime`];
//! - a connection's peer that stops answering HTTP/2 pings ([`Limits::keepalive`]) loses the
//!   connection, and no connection lives longer than [`Limits::connection_age`] (then it is
//!   asked to go away, and closed [`Limits::connection_grace`] later); a unary call is answered
//!   within [`Limits::request_timeout`].

use std::collections::BTreeMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// What the scaler's server allows ([`serve_with`](crate::serve_with)). When every
/// connection is taken, the oldest with no call in flight is closed for a new one (only if all
/// have a call in flight is the new one refused); calls and streams beyond their limits are
/// RESOURCE_EXHAUSTED. The defaults suit KEDA, which keeps one connection to a scaler address,
/// polls on it every `pollingInterval` (30 s), and, with an `external-push` trigger, holds one
/// `StreamIsActive` stream per ScaledObject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once. 64: KEDA's operator needs one (a few while it restarts).
    pub max_connections: usize,
    /// Calls in flight on one connection (streams included). 16.
    pub max_calls_per_connection: u32,
    /// `StreamIsActive` streams open at once on the whole server. 32.
    pub max_streams: usize,
    /// How long a `StreamIsActive` stream lives before it ends (with OK). 5 min: KEDA opens
    /// another 2 s later, which begins with the current answer.
    pub stream_lifetime: Duration,
    /// How long a connection lives before it is asked to go away (HTTP/2 GOAWAY: its calls
    /// finish, a client opens another). 10 min.
    pub connection_age: Duration,
    /// How long a connection asked to go away may take before it is closed. 1 min.
    pub connection_grace: Duration,
    /// How often an HTTP/2 ping checks a connection's peer (30 s), and TCP keepalive too.
    pub keepalive: Duration,
    /// How long a ping may wait for its answer before the connection is closed. 10 s.
    pub keepalive_timeout: Duration,
    /// How long one unary call may take (every answer is read from memory). 10 s.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_calls_per_connection: 16,
            max_streams: 32,
            stream_lifetime: Duration::from_secs(300),
            connection_age: Duration::from_secs(600),
            connection_grace: Duration::from_secs(60),
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The open connections, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    open: Arc<Mutex<BTreeMap<u64, Entry>>>,
    next: Arc<AtomicU64>,
    max: usize,
}

#[derive(Debug)]
struct Entry {
    busy: Arc<AtomicUsize>,
    evicted: CancellationToken,
    /// The peer's address, without its port: connections are counted by host.
    host: Option<std::net::IpAddr>,
}

/// A connection's place; gives it back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    conn: Conn,
}

/// What a connection's calls see of it (a request extension): its peer, and a way to mark a
/// call in flight.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    /// The peer's address.
    pub(crate) peer: Option<std::net::SocketAddr>,
    busy: Arc<AtomicUsize>,
    evicted: CancellationToken,
    connections: Connections,
}

/// A call in flight; its connection cannot be evicted until every one is dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Conn {
    /// Marks a call in flight, unless the connection was already chosen for eviction. Under
    /// the lock [`Connections::admit`] chooses under, so the two cannot interleave.
    pub(crate) fn begin(&self) -> Option<InFlight> {
        let _open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.evicted.is_cancelled() {
            return None;
        }
        self.busy.fetch_add(1, Ordering::SeqCst);
        Some(InFlight(self.busy.clone()))
    }
}

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            open: Arc::default(),
            next: Arc::default(),
            max: max.max(1),
        }
    }

    /// A place for a new connection from `peer`: free, or taken from an idle one (which is
    /// told to close): the oldest of the host that holds the most connections, so that a
    /// host opening many cannot push out another's one (KEDA's). `None` if every connection
    /// has a call in flight.
    pub(crate) fn admit(&self, peer: Option<std::net::SocketAddr>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= self.max {
            let mut by_host: std::collections::HashMap<Option<std::net::IpAddr>, usize> =
                std::collections::HashMap::new();
            for entry in open.values() {
                *by_host.entry(entry.host).or_default() += 1;
            }
            let idle = open
                .iter()
                .filter(|(_, e)| e.busy.load(Ordering::SeqCst) == 0)
                .max_by_key(|(id, e)| (by_host.get(&e.host).copied(), std::cmp::Reverse(**id)))
                .map(|(id, _)| *id)?;
            if let Some(entry) = open.remove(&idle) {
                entry.evicted.cancel();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let conn = Conn {
            peer,
            busy: Arc::default(),
            evicted: CancellationToken::new(),
            connections: self.clone(),
        };
        open.insert(
            id,
            Entry {
                busy: conn.busy.clone(),
                evicted: conn.evicted.clone(),
                host: peer.map(|p| p.ip()),
            },
        );
        Some(Slot { id, conn })
    }

    /// How many connections are open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Slot {
    #[cfg(test)]
    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conn
            .connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// An admitted connection: its socket and its place, closed when it is evicted (reads and
/// writes fail from then on, so the HTTP/2 connection ends and gives its place back).
pub(crate) struct Admitted {
    stream: TcpStream,
    slot: Slot,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("peer", &self.slot.conn.peer)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    pub(crate) fn new(stream: TcpStream, slot: Slot) -> Self {
        let evicted = Box::pin(slot.conn.evicted.clone().cancelled_owned());
        Self {
            stream,
            slot,
            evicted,
        }
    }

    /// Ready with an error once the connection was chosen for eviction (and registers to be
    /// woken then).
    fn gone(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let evicted =
            self.slot.conn.evicted.is_cancelled() || self.evicted.as_mut().poll(cx).is_ready();
        evicted.then(|| {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection",
            )
        })
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(gone) = self.gone(cx) {
            return Poll::Ready(Err(gone));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(gone) = self.gone(cx) {
            return Poll::Ready(Err(gone));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = Conn;

    fn connect_info(&self) -> Conn {
        self.slot.conn.clone()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_full_server_makes_room_by_closing_the_oldest_idle_connection_only() {
        let c = Connections::new(2);
        let first = c.admit(None).unwrap();
        let second = c.admit(None).unwrap();
        let answering = first.conn().begin(); // the oldest has a call in flight
        assert!(answering.is_some());
        let third = c.admit(None).unwrap();
        assert!(second.conn.evicted.is_cancelled() && !first.conn.evicted.is_cancelled());
        assert!(
            second.conn().begin().is_none(),
            "a call arriving on an evicted connection does not begin"
        );
        let _third_answering = third.conn().begin();
        assert!(c.admit(None).is_none(), "every connection busy: refused");
        drop(answering);
        assert!(
            c.admit(None).is_some(),
            "an idle connection makes room again"
        );
        assert!(first.conn.evicted.is_cancelled());
        drop((first, second));
    }

    #[test]
    fn a_closed_connection_gives_its_place_back() {
        let c = Connections::new(1);
        let only = c.admit(None).unwrap();
        let _answering = only.conn().begin();
        assert!(c.admit(None).is_none());
        drop(only);
        let _new = c.admit(None).unwrap();
        assert_eq!(c.len(), 1);
    }

    /// One host (KEDA) holds one idle connection, the oldest; another opens many: room is
    /// made by closing the flooding host's own, never KEDA's.
    #[test]
    fn a_host_opening_many_connections_pushes_out_its_own_not_anothers() {
        let c = Connections::new(4);
        let keda: std::net::SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let flood = |port: u16| Some(std::net::SocketAddr::from(([10, 0, 0, 2], port)));
        let kept = c.admit(Some(keda)).unwrap();
        let mut flooding: Vec<Slot> = (0..3).map(|p| c.admit(flood(p)).unwrap()).collect();
        for port in 3..50 {
            flooding.push(c.admit(flood(port)).unwrap());
        }
        assert!(
            !kept.conn.evicted.is_cancelled(),
            "KEDA's connection was closed"
        );
        assert_eq!(c.len(), 4);
    }
}
