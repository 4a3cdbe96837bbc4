//! A TCP proxy in front of the test server, for failures Postgres does not make on its own:
//! an answer lost after the server applied a `COMMIT` (the connection cut the instant the
//! server's `CommandComplete "COMMIT"` passes), and a partition (nothing passes either way
//! while frozen; what was sent meanwhile passes once thawed, as a network that comes back).
//!
//! Plain TCP: a URL through it says `sslmode=disable`, so that the proxy sees the protocol's
//! messages. Shared by the crate's own tests (`src/outputs/tests`) and the integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The server's `CommandComplete` of a `COMMIT`: tag `COMMIT`, length 11.
const COMMIT_COMPLETE: &[u8] = b"C\x00\x00\x00\x0bCOMMIT\x00";

#[derive(Debug)]
struct State {
    upstream: String,
    frozen: watch::Sender<bool>,
    cut_next_commit: AtomicBool,
    commits_cut: AtomicUsize,
    connections: AtomicUsize,
    /// Reads from a client that arrived while frozen.
    held: AtomicUsize,
}

/// The proxy; stops when dropped (its listener task ends with the runtime).
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// A proxy in front of the server of `url` (`postgres://user@host:port/db…`).
    pub(crate) async fn start(url: &str) -> Self {
        let (_, upstream, _) = split(url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream: upstream.to_owned(),
            frozen: watch::Sender::new(false),
            cut_next_commit: AtomicBool::new(false),
            commits_cut: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        });
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&shared.upstream).await else {
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(pipe(client, server, shared.clone()));
            }
        });
        Self { addr, state }
    }

    /// `url` through the proxy, without TLS.
    pub(crate) fn url(&self, url: &str) -> String {
        let (before, _, after) = split(url);
        let join = if after.contains('?') { '&' } else { '?' };
        format!("{before}{}{after}{join}sslmode=disable", self.addr)
    }

    /// The next `COMMIT` the server answers is applied, and its answer lost: the connection
    /// is cut before it reaches the client.
    pub(crate) fn lose_next_commit_answer(&self) {
        self.state.cut_next_commit.store(true, Ordering::SeqCst);
    }

    /// How many `COMMIT` answers were lost so far.
    pub(crate) fn commits_cut(&self) -> usize {
        self.state.commits_cut.load(Ordering::SeqCst)
    }

    /// Connections made through the proxy so far.
    pub(crate) fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// How many times a client sent something while frozen (held until thawed).
    pub(crate) fn held(&self) -> usize {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Nothing passes either way until [`thaw`](Self::thaw).
    pub(crate) fn freeze(&self) {
        self.state.frozen.send_replace(true);
    }

    /// What waited passes, and all after it.
    pub(crate) fn thaw(&self) {
        self.state.frozen.send_replace(false);
    }
}

/// `url` as (what is before the host, `host:port`, what is after it).
pub(crate) fn split(url: &str) -> (&str, &str, &str) {
    let start = url
        .rfind('@')
        .map(|at| at + 1)
        .or_else(|| url.find("://").map(|s| s + 3))
        .unwrap();
    let end = url[start..].find('/').map_or(url.len(), |e| start + e);
    (&url[..start], &url[start..end], &url[end..])
}

/// Waits while frozen; false if the proxy is gone.
async fn thawed(frozen: &mut watch::Receiver<bool>) -> bool {
    frozen.wait_for(|f| !f).await.is_ok()
}

/// Copies both ways until either side closes, or a `COMMIT`'s answer is to be lost. While
/// frozen, what is read waits to be written until thawed.
async fn pipe(mut client: TcpStream, mut server: TcpStream, state: Arc<State>) {
    let (mut from_client, mut to_client) = client.split();
    let (mut from_server, mut to_server) = server.split();
    let mut frozen = state.frozen.subscribe();
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = from_client.read(&mut up) => {
                let n = match read { Ok(0) | Err(_) => return, Ok(n) => n };
                if *frozen.borrow() {
                    state.held.fetch_add(1, Ordering::SeqCst);
                }
                if !thawed(&mut frozen).await || to_server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = from_server.read(&mut down) => {
                let n = match read { Ok(0) | Err(_) => return, Ok(n) => n };
                let answer = &down[..n];
                if answer.windows(COMMIT_COMPLETE.len()).any(|w| w == COMMIT_COMPLETE)
                    && state.cut_next_commit.swap(false, Ordering::SeqCst)
                {
                    state.commits_cut.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if !thawed(&mut frozen).await || to_client.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    }
}
