//! [`HttpMessenger`]: singleton messages between processes over HTTP, with a shared secret.
//!
//! The receiving side is a route, `POST /singletons/{name}/messages`, to mount on a server the
//! other processes reach (the binary mounts it on its health and metrics server, and only
//! when a secret is configured: the endpoint is never open without one). A request must carry
//! `Authorization: Bearer <secret>` (compared in constant time), a body of at most
//! [`Limits::max_bytes`], and come while the process is under [`Limits::per_second`]
//! messages a second. Answers: 204 taken; 404 the singleton does not run here; 503 its inbox
//! is full; 401, 413, 429. The sending side maps them back to
//! [`Refusal`]s: a connection that could not be opened is
//! "not here" (nothing was sent); one that broke after the request was sent is "unreachable"
//! (it may have been taken), which `SingletonHandle::send` never retries.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use kcl_core::singleton::{Inboxes, Messenger, Refusal};

/// What the receiving side takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest message, in bytes. Default 64 KiB.
    pub max_bytes: usize,
    /// Messages a second this process takes, all singletons together. Default 100.
    pub per_second: u32,
    /// How long a send waits for an answer. Default 5 s.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 10,
            per_second: 100,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A shared secret; never printed.
#[derive(Clone)]
struct Secret(Arc<str>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Sends and (when it advertises an address) takes singleton messages over HTTP.
#[derive(Debug, Clone)]
pub struct HttpMessenger {
    inboxes: Inboxes,
    advertise: Option<String>,
    secret: Secret,
    limits: Limits,
    bucket: Arc<Mutex<Bucket>>,
}

impl HttpMessenger {
    /// A messenger authenticating with `secret`. With `advertise` (`http://host:port`, as
    /// the other processes reach this one), its singletons take messages: mount
    /// [`router`](Self::router) on the server listening there. Without, it only sends.
    pub fn new(secret: &str, advertise: Option<String>, limits: Limits) -> Self {
        Self {
            inboxes: Inboxes::default(),
            advertise,
            secret: Secret(Arc::from(secret)),
            bucket: Arc::new(Mutex::new(Bucket::full(limits.per_second))),
            limits,
        }
    }

    /// The receiving route, `POST /singletons/{name}/messages`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/singletons/{name}/messages", post(take))
            .layer(DefaultBodyLimit::max(self.limits.max_bytes))
            .with_state(self.clone())
    }
}

/// The receiving side of one message.
async fn take(
    State(me): State<HttpMessenger>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !same(presented.as_bytes(), me.secret.0.as_bytes()) {
        return StatusCode::UNAUTHORIZED;
    }
    if !me
        .bucket
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take(me.limits.per_second)
    {
        return StatusCode::TOO_MANY_REQUESTS;
    }
    match me.inboxes.deliver(&name, body) {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(Refusal::Busy) => StatusCode::SERVICE_UNAVAILABLE,
        Err(_) => StatusCode::NOT_FOUND,
    }
}

/// Compares in constant time (for equal lengths), so that timing tells nothing of the secret.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token bucket: `per_second` tokens, refilled continuously.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(per_second: u32) -> Self {
        Self {
            tokens: f64::from(per_second),
            at: Instant::now(),
        }
    }

    fn take(&mut self, per_second: u32) -> bool {
        let rate = f64::from(per_second);
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Messenger for HttpMessenger {
    fn address(&self) -> Option<String> {
        self.advertise.clone()
    }

    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }

    fn send<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
        message: Bytes,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            match tokio::time::timeout(self.limits.timeout, self.post(address, name, message)).await
            {
                Ok(result) => result,
                Err(_) => Err(Refusal::Unreachable(format!(
                    "no answer from {address} within {:?}",
                    self.limits.timeout
                ))),
            }
        })
    }
}

impl HttpMessenger {
    async fn post(&self, address: &str, name: &str, message: Bytes) -> Result<(), Refusal> {
        let host = address
            .strip_prefix("http://")
            .ok_or_else(|| Refusal::Unreachable(format!("{address} is not an http:// address")))?
            .trim_end_matches('/');
        // Nothing was sent if the connection could not be opened: a clear "not here".
        let stream = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|_| Refusal::NotHere)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|_| Refusal::NotHere)?;
        tokio::spawn(connection);
        let request = hyper::Request::post(format!("/singletons/{name}/messages"))
            .header(header::HOST, host)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.secret.0))
            .body(Full::new(message))
            .map_err(|e| Refusal::Unreachable(e.to_string()))?;
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| Refusal::Unreachable(e.to_string()))?;
        match answer.status() {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            StatusCode::NOT_FOUND => Err(Refusal::NotHere),
            StatusCode::SERVICE_UNAVAILABLE => Err(Refusal::Busy),
            StatusCode::UNAUTHORIZED => Err(Refusal::Unauthorized),
            StatusCode::PAYLOAD_TOO_LARGE => Err(Refusal::TooLarge),
            StatusCode::TOO_MANY_REQUESTS => Err(Refusal::RateLimited),
            other => Err(Refusal::Unreachable(format!("{address} answered {other}"))),
        }
    }
}
